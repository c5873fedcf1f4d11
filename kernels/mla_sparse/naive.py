"""Token-sparse MLA attention reference (fp32 PyTorch), on the cached latent directly."""

from __future__ import annotations

import torch


def naive_mla_sparse_attention(q: torch.Tensor, latents: torch.Tensor, indices: torch.Tensor,
                               r: int, scale: float) -> torch.Tensor:
    """q [T, H, R + P] (absorbed queries, RoPE applied), latents [S, R + P] (normalised latent
    and roped shared key), indices [T, K] (the tokens each query attends to, -1 = none) ->
    [T, H, R]: softmax over the selected tokens of q.latent * scale, weighting latent[:, :R].
    A row with no selected token gives zeros."""
    t, s = q.shape[0], latents.shape[0]
    allowed = torch.zeros(t, s + 1, dtype=torch.bool, device=q.device)
    allowed.scatter_(1, torch.where(indices < 0, s, indices), True)
    allowed = allowed[:, :s]
    scores = torch.einsum("thd,sd->ths", q.float(), latents.float()) * scale
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("ths,sr->thr", p, latents[:, :r].float()).to(q.dtype)
