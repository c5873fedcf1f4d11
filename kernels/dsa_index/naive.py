"""DSA lightning-indexer references (fp32 PyTorch): index scores and per-query top-k."""

from __future__ import annotations

import torch


def naive_index_scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, start: int,
                       scale: float) -> torch.Tensor:
    """q [T, Hi, D] (queries at positions start..start+T-1), keys [S, D], weights [T, Hi] ->
    [T, S] fp32: sum_h w[t,h] relu(q[t,h].k[s] * scale) for s <= start + t, -inf after."""
    t, s = q.shape[0], keys.shape[0]
    scores = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float()) * scale)
    index = torch.einsum("th,ths->ts", weights.float(), scores)
    rows = torch.arange(start, start + t, device=q.device)[:, None]
    visible = torch.arange(s, device=q.device)[None, :] <= rows
    return index.masked_fill(~visible, float("-inf"))


def naive_index_topk(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Indices [T, min(top_k, S)] of each row's highest scores (any order); -1 where a row has
    fewer finite scores than that."""
    values, idx = scores.topk(min(top_k, scores.shape[-1]), dim=-1)
    return torch.where(torch.isinf(values), -1, idx)
