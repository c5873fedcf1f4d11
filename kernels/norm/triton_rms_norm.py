"""Triton RMSNorm: one program per row, fp32 accumulation, same result as `naive_rms_norm`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, x_stride, y_stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    # mean over the true width, not BLOCK: the padded lanes are zeros
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def fused_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension.

    x: [..., D]; weight: [D]; returns (or fills `out`, same shape and dtype as x) [..., D].
    """
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if out is None:
        out = torch.empty_like(x)
    # a 2-D out may be a column slice of a wider buffer (the MLA latent written into its cache row)
    if out.shape != x.shape or out.stride(-1) != 1 or (out.dim() != 2 and not out.is_contiguous()):
        raise ValueError("out must be shaped like x, contiguous (or 2-D with unit-stride rows)")
    y2 = out.reshape(-1, d)
    if x2.shape[0]:
        block = triton.next_power_of_2(d)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight.contiguous(), y2, x2.stride(0), y2.stride(0), d, eps,
            BLOCK=block, num_warps=min(max(block // 256, 1), 8),
        )
    return out
