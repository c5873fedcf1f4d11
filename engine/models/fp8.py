"""FP8 (e4m3) block-scaled weights, as the official DeepSeek-V3 / GLM-5 FP8 checkpoints store
them: each matrix W [out, in] as float8_e4m3fn plus `weight_scale_inv` [ceil(out/bo),
ceil(in/bi)] fp32, one scale per bo x bi block (config.json: quantization_config
{"quant_method": "fp8", "weight_block_size": [bo, bi]}), so W = W8 * scale of its block.

On CPU the engine dequantises at load (`dequantize_blocks`) and runs fp32 matmuls; `fp8_linear`
is the matmul over the stored form, dequantising one block-row of W at a time. On CUDA the GLM
decoder keeps the 1-byte weights (kernels/linear/naive_fp8.py `Fp8Weight`) and runs the FP8
Triton kernels of kernels/linear/triton_fp8.py on them (engine/gpu/glm.py).
"""

from __future__ import annotations

import torch

from ..config import CheckpointError

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def block_scales(scale_inv: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> torch.Tensor:
    """Per-element scales [rows, cols] from per-block ones."""
    bo, bi = block
    return scale_inv.float().repeat_interleave(bo, 0)[:rows].repeat_interleave(bi, 1)[:, :cols]


def dequantize_blocks(w8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """W8 [out, in] (e4m3, or its exact fp32 values) and block scales -> fp32 W."""
    rows, cols = w8.shape[-2:]
    want = (-(-rows // block[0]), -(-cols // block[1]))
    if tuple(scale_inv.shape[-2:]) != want:
        raise CheckpointError(f"FP8 scales of shape {tuple(scale_inv.shape)} do not fit a "
                              f"{rows}x{cols} matrix in {block[0]}x{block[1]} blocks")
    return w8.float() * block_scales(scale_inv, rows, cols, block)


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] -> (W8 e4m3, scale_inv fp32 [ceil(out/bo), ceil(in/bi)]) as the FP8
    checkpoints store it: per block, scale = amax / 448 and W8 = W / scale rounded to e4m3.
    (Writes FP8 checkpoints of random weights for bench/gpu_glm.py; on W's device.)"""
    bo, bi = block
    rows, cols = w.shape
    nr, nc = -(-rows // bo), -(-cols // bi)
    padded = w.new_zeros(nr * bo, nc * bi, dtype=torch.float32)
    padded[:rows, :cols] = w
    blocks = padded.view(nr, bo, nc, bi)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / E4M3_MAX
    w8 = (blocks / scale[:, None, :, None]).view(nr * bo, nc * bi)[:rows, :cols].to(FP8)
    return w8.contiguous(), scale


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor,
               block: tuple[int, int]) -> torch.Tensor:
    """x [..., in] @ W^T for W stored as e4m3 blocks; one block-row of W is dequantised at a time
    (at most block[0] x in floats besides the output)."""
    rows, cols = w8.shape
    out = x.new_empty(*x.shape[:-1], rows)
    bo = block[0]
    for i, r0 in enumerate(range(0, rows, bo)):
        part = w8[r0:r0 + bo].to(x.dtype) * block_scales(scale_inv[i:i + 1], min(bo, rows - r0), cols,
                                                            block).to(x.dtype)
        out[..., r0:r0 + bo] = x @ part.T
    return out


def dequantize_checkpoint(weights: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Every `X.weight` that has an `X.weight_scale_inv` beside it, dequantised; the scales
    dropped; other tensors as they are."""
    out = {}
    for name, t in weights.items():
        if name.endswith(".weight_scale_inv"):
            continue
        scale = weights.get(name + "_scale_inv")
        out[name] = dequantize_blocks(t, scale, block) if scale is not None else t
    return out
