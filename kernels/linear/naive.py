"""Reference for the decode GEMV with its fused prologue/epilogue, computed in fp32."""

from __future__ import annotations

import torch


def naive_gemv(
    x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
    residual: torch.Tensor | None = None, swiglu: bool = False,
) -> torch.Tensor:
    """x [M, K], w [N, K] -> [M, N] (or [M, N/2] with swiglu), in x's dtype."""
    h = x.float()
    if norm_weight is not None:
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    y = h @ w.float().t()
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = gate * torch.sigmoid(gate) * up
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)
