"""Absorbed MLA decode attention reference (fp32 PyTorch): one query token over the cached
latent, the length read from a device tensor (what a CUDA graph replays with)."""

from __future__ import annotations

import torch


def naive_mla_decode(q: torch.Tensor, latents: torch.Tensor, length: torch.Tensor, r: int, scale: float,
                     indices: torch.Tensor | None = None) -> torch.Tensor:
    """q [1, H, R + P] (absorbed query, RoPE applied), latents [S, R + P] (normalised latent and
    roped shared key), length [1] int (keys 0..length-1 are visible), indices [K] (instead: the
    tokens to attend to, -1 = none) -> [1, H, R]: softmax of q.latent * scale over the visible
    tokens, weighting latent[:, :R]."""
    s = latents.shape[0]
    if indices is None:
        allowed = torch.arange(s, device=q.device) < length.reshape(())
    else:
        allowed = torch.zeros(s + 1, dtype=torch.bool, device=q.device)
        allowed[torch.where(indices < 0, s, indices)] = True
        allowed = allowed[:s]
    scores = torch.einsum("hd,sd->hs", q[0].float(), latents.float()) * scale
    p = torch.softmax(scores.masked_fill(~allowed[None], float("-inf")), dim=-1).nan_to_num(0.0)
    return (p @ latents[:, :r].float())[None].to(q.dtype)
