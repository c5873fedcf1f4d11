"""References for the decode GEMVs with their fused prologue/epilogue, computed in fp32."""

from __future__ import annotations

import torch

from ..attention.naive import NO_RING, naive_append_kv
from ..rope.naive import naive_rope


def naive_gemv(
    x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
    residual: torch.Tensor | None = None, swiglu: bool = False, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K], w [N, K] -> [M, N] (or [M, N/2] with swiglu), in x's dtype (or into `out`)."""
    h = x.float()
    if norm_weight is not None:
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    y = h @ w.float().t()
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = gate * torch.sigmoid(gate) * up
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype) if out is None else out.copy_(y)


def naive_qkv_gemv(
    x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    heads: int, kv_heads: int, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor, ksum: torch.Tensor, block_size: int,
    out: torch.Tensor | None = None, ring: tuple[int, int] = NO_RING,
) -> torch.Tensor:
    """Reference of `fused_qkv_gemv`: RMSNorm(x) @ W^T for one token x [1, K], W = [q rows;
    k rows; v rows] ([(H + 2 Hkv) * D, K]), RoPE (cos/sin [1, D/2]) on the q and k heads, then
    `naive_append_kv` of the k and v heads at position `pos`. Returns qkv [1, (H + 2 Hkv) * D]."""
    d = k_cache.shape[-1]
    y = naive_gemv(x, w, norm_weight=norm_weight, eps=eps).view(heads + 2 * kv_heads, d)
    qk = naive_rope(y[None, :heads + kv_heads], cos, sin)[0]
    qkv = torch.cat([qk, y[heads + kv_heads:]])
    naive_append_kv(qkv[heads:heads + kv_heads], qkv[heads + kv_heads:], k_cache, v_cache, kmin, kmax, pos,
                    block_size, kmean, ksum, ring)
    qkv = qkv.reshape(1, -1)
    return qkv if out is None else out.copy_(qkv)
