"""A GGUF checkpoint's matrices kept in their quantisation on the CPU.

Q4_0/Q4_1/Q8_0 and Q4_K/Q5_K/Q6_K matrices stay as the file stores them, in memory mapped from
it: a model costs about its file's size in memory and loads in the time it takes to read the
header. Products run on the blocks (kernels/linear/gguf_cpu.py): up to a few activation rows
(decode) as int8 dot products against the blocks, more rows (prefill) by dequantising each matrix
to bf16 a slice at a time for PyTorch's GEMM. q/k/v and gate/up run as one call each.

Modes (`Engine.load(decode_weights=...)`, a name kept from when only decode used them):
- "auto": the quantised matrices on the CPU where the kernel is available (a C++ compiler and
  an AVX-512 VNNI CPU), everything else dequantised to fp32 — the "fp32" path.
- "fp32": every weight dequantised to fp32 at load (the reference the quantised path is
  tested against, and the only path for Hugging Face checkpoints and other devices).

bench/results/cpu_engine.md has the measurements behind these choices.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.linear.gguf_cpu import GGUFMatrix, GGUFProduct, dequantize, library, unavailable

MODES = ("auto", "fp32")


def resolve_mode(mode: str, device: torch.device | str = "cpu") -> str:
    """Check `mode` for `device`: "auto" stays "auto" on the CPU, where the checkpoint decides."""
    if mode not in MODES:
        raise ValueError(f"decode_weights must be one of {MODES}, not {mode!r}")
    return mode if torch.device(device).type == "cpu" else "fp32"


def keeps_quantized(mode: str, ckpt, dtype: torch.dtype) -> tuple[bool, str]:
    """(whether `ckpt` loads with quantised matrices, why not when it does not)."""
    if mode != "auto":
        return False, f"decode_weights={mode!r}"
    if ckpt.format != "gguf":
        return False, "not a GGUF checkpoint"
    if dtype != torch.float32:
        return False, f"dtype {dtype}"
    if library() is None:
        return False, f"no CPU kernel: {unavailable()}"
    return True, ""


class QuantLinear:
    """y = x @ [W_0; W_1; ...]^T + bias on GGUF matrices with the same columns: x [T, K] fp32,
    y [T, sum of rows] fp32. norm: an RMSNorm module whose weight the product applies to x
    first (the module is then marked `folded`, and passes x through); swiglu: [gate; up] in,
    silu(gate) * up out."""

    def __init__(self, mats: list[GGUFMatrix], bias: torch.Tensor | None = None, *, norm=None,
                 swiglu: bool = False):
        self.mats = tuple(mats)
        self.product = GGUFProduct(mats, bias=bias, swiglu=swiglu, norm=None if norm is None else norm.weight.detach(),
                                   eps=1e-6 if norm is None else norm.eps)
        if norm is not None:
            norm.folded = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.mats)


class QuantEmbedding(nn.Module):
    """Embedding rows dequantised from a GGUF matrix [vocab, hidden] as they are looked up."""

    def __init__(self, weight: GGUFMatrix):
        super().__init__()
        self.quant = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.quant.blocks.index_select(0, ids.reshape(-1))
        return dequantize(GGUFMatrix(rows, self.quant.qtype, self.quant.cols)).view(*ids.shape, -1)


def summary(model, reason: str) -> dict:
    """What the model's matrices are: {"mode": "gguf" | "fp32", "bytes": quantised bytes held
    (the mapped file's pages), "reason": why fp32 where it is}."""
    seen, total = set(), 0
    for mod in model.modules():
        for q in (getattr(mod, "quant", None), getattr(mod, "qkv", None), getattr(mod, "gate_up", None)):
            mats = q.mats if isinstance(q, QuantLinear) else (q,) if isinstance(q, GGUFMatrix) else ()
            for m in mats:
                if m.blocks.data_ptr() not in seen:
                    seen.add(m.blocks.data_ptr())
                    total += m.nbytes
    if total == 0:
        return {"mode": "fp32", "bytes": 0, "reason": reason or "no matrix in a block type the kernel reads"}
    return {"mode": "gguf", "bytes": total, "reason": ""}
