"""Absorbed MLA decode attention reference (fp32 PyTorch): one query token over the cached
latent, the length read from a device tensor (what a CUDA graph replays with)."""

from __future__ import annotations

import torch


def naive_mla_decode(q: torch.Tensor, latents: torch.Tensor, length: torch.Tensor | None, r: int, scale: float,
                     indices: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, R + P] (absorbed queries, RoPE applied), latents [S, R + P] (normalised latent
    and roped shared key), length [1] int (dense, T = 1: keys 0..length-1 are visible) or
    indices [T, K] (each row's tokens, -1 = none) -> [T, H, R]: softmax of q.latent * scale over
    the visible tokens, weighting latent[:, :R]. A row with no token gives zeros."""
    t, s = q.shape[0], latents.shape[0]
    if indices is None:
        allowed = (torch.arange(s, device=q.device) < length.reshape(()))[None].expand(t, s)
    else:
        allowed = torch.zeros(t, s + 1, dtype=torch.bool, device=q.device)
        allowed.scatter_(1, torch.where(indices < 0, s, indices), True)
        allowed = allowed[:, :s]
    scores = torch.einsum("thd,sd->ths", q.float(), latents.float()) * scale
    p = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("ths,sr->thr", p, latents[:, :r].float()).to(q.dtype)
