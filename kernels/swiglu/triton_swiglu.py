"""Triton SwiGLU: silu(gate) * up in one pass over memory (elementwise, flat grid)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, y_ptr, n_cols, sg, su, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * sg + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * su + cols, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + row * sy + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def fused_swiglu(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up for gate, up [..., F] (row-strided views, e.g. halves of one [.., 2F]
    projection, are fine); returns [..., F] in gate's dtype."""
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    f = gate.shape[-1]
    if gate.stride(-1) != 1 or up.stride(-1) != 1:
        raise ValueError("gate and up must be contiguous in their last dimension")
    g2, u2 = gate.reshape(-1, f), up.reshape(-1, f)
    if out is None:
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.shape != gate.shape or not out.is_contiguous():
        raise ValueError("out must be contiguous and shaped like gate")
    y2 = out.view(-1, f)
    if g2.shape[0] and f:
        block = min(triton.next_power_of_2(f), 2048)
        _swiglu_kernel[(g2.shape[0], triton.cdiv(f, block))](
            g2, u2, y2, f, g2.stride(0), u2.stride(0), y2.stride(0), BLOCK=block, num_warps=4,
        )
    return out
