"""RoPE reference, rotate_half convention (Llama/HF): the two halves of the head dim form pairs.

out[..., :D/2] = x1 * cos - x2 * sin;  out[..., D/2:] = x2 * cos + x1 * sin
with cos, sin [T, D/2] (one angle per pair, not duplicated).
"""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Unscaled angles for `positions` [T]: returns cos, sin [T, head_dim/2] in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().float(), ang.sin().float()


def naive_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H, D]; cos, sin [T, D/2]; returns x rotated, same dtype (or into `out`)."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    y = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    return y if out is None else out.copy_(y)
