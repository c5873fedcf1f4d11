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


# --- routed (block-sparse) attention on the latent: sinks + routed blocks + local window -------
# For MLA models without an indexer (GLM-4.7-Flash) under the engine's sparse settings: the
# Llama path's routing (engine/router.py, kernels/attention) with the latent as the one key
# head: block descriptors of the cached latents (RoPE part included), block scores of the
# absorbed queries [T, H, R + P] (max over a routing chunk's queries and all heads), top-k
# candidate blocks per routing chunk, and attention over sinks ∪ those blocks ∪ the window.


def naive_latent_descriptors(latents: torch.Tensor, block_size: int):
    """latents [N, W] -> (kmin, kmax, kmean) [ceil(N / block_size), W] fp32 over each block's
    stored rows (the last block may be partial)."""
    from ..attention import naive_block_descriptors

    return tuple(d[:, 0] for d in naive_block_descriptors(latents[:, None], block_size))


def naive_mla_block_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor,
                           method: str, chunk: int, q0: int, first: int, window: int,
                           block_size: int) -> torch.Tensor:
    """q [T, H, W] (queries at absolute positions q0..), descriptors [NB, W] -> scores [C, NB]
    fp32 for the C = ceil(T / chunk) routing chunks: the max over the chunk's queries and heads
    of q.kmean (mean) or sum_d max(q_d kmin_d, q_d kmax_d) (minmax); -inf outside the chunk's
    candidates first .. end-1 (end: first block the window of the chunk's last query covers)."""
    from ..attention import naive_block_scores

    t, nb = q.shape[0], kmean.shape[0]
    out = []
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        s = naive_block_scores(q[c0:c1], kmin[:, None], kmax[:, None], kmean[:, None], method)[0]
        end = max(0, (q0 + c1 - 1 - window + block_size) // block_size)
        ids = torch.arange(nb, device=q.device)
        out.append(s.masked_fill((ids < first) | (ids >= end), float("-inf")))
    return torch.stack(out)


def routed_token_mask(n_keys: int, q0: int, t: int, blocks: torch.Tensor, chunk: int, block_size: int,
                      sinks: int, window: int) -> torch.Tensor:
    """Boolean [T, n_keys]: the keys query q0 + i sees — sinks (j < sinks), the window (j > q0 + i
    - window), and the keys sinks <= j <= q0 + i - window of its routing chunk's blocks
    (blocks [C, K], -1 = none) — each at most once, never a future one."""
    pos = torch.arange(q0, q0 + t, device=blocks.device)[:, None]
    j = torch.arange(n_keys, device=blocks.device)[None, :]
    routed = torch.zeros(blocks.shape[0], n_keys // block_size + 2, dtype=torch.bool, device=blocks.device)
    routed.scatter_(1, torch.where(blocks < 0, routed.shape[1] - 1, blocks), True)
    in_block = routed[torch.arange(t, device=blocks.device) // chunk][:, (j[0] // block_size)]
    far = in_block & (j >= sinks) & (j <= pos - window)
    return (far | (j < sinks) | (j > pos - window)) & (j <= pos)


def naive_mla_routed_attention(q: torch.Tensor, latents: torch.Tensor, q0: int, blocks: torch.Tensor,
                               chunk: int, block_size: int, sinks: int, window: int, r: int,
                               scale: float) -> torch.Tensor:
    """q [T, H, R + P] at positions q0.., latents [S, R + P], blocks [C, K] (routing chunk c =
    queries c*chunk..; -1 = none) -> [T, H, R]: softmax of q.latent * scale over
    `routed_token_mask`'s keys, weighting latent[:, :R]."""
    t, s = q.shape[0], latents.shape[0]
    allowed = routed_token_mask(s, q0, t, blocks, chunk, block_size, sinks, window)
    scores = torch.einsum("thd,sd->ths", q.float(), latents.float()) * scale
    p = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("ths,sr->thr", p, latents[:, :r].float()).to(q.dtype)


def naive_mla_routed_attention_expanded(q_nope: torch.Tensor, q_rot: torch.Tensor, latents: torch.Tensor,
                                        w_kv: torch.Tensor, q0: int, blocks: torch.Tensor, chunk: int,
                                        block_size: int, sinks: int, window: int, scale: float) -> torch.Tensor:
    """The same attention in the model's own (HF's) form: per-head keys [c W_UK^T | k_rot] and
    values c W_UV^T expanded from the latents, w_kv [H, N + V, R] (kv_b_proj per head).
    q_nope [T, H, N], q_rot [T, H, P] -> [T, H, V] (what the absorbed form gives after W_UV)."""
    t, s = q_nope.shape[0], latents.shape[0]
    n, r = q_nope.shape[-1], w_kv.shape[-1]
    c, k_rot = latents[:, :r].float(), latents[:, r:].float()
    k_nope = torch.einsum("sr,hnr->shn", c, w_kv[:, :n].float())
    v = torch.einsum("sr,hvr->shv", c, w_kv[:, n:].float())
    scores = (torch.einsum("thn,shn->ths", q_nope.float(), k_nope)
              + torch.einsum("thp,sp->ths", q_rot.float(), k_rot)) * scale
    allowed = routed_token_mask(s, q0, t, blocks, chunk, block_size, sinks, window)
    p = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("ths,shv->thv", p, v).to(q_nope.dtype)
