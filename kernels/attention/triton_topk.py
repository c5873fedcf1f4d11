"""Triton top-k of block scores: which blocks a query chunk (or a decode step) attends to.

Same arguments and results as the references in naive.py (`naive_x` <-> `fused_x`):

- `fused_topk_blocks`: top_k candidate blocks per kv head, sorted, -1 padded to a fixed shape
  (a decode step can be captured in a CUDA graph; `first`/`end` may be device tensors).
- `fused_decode_topk`: the top_k entries per row through pick-and-retire tile kernels and a
  merge, unordered, instead of torch's radix select.
- `fused_topk_blocks_unsorted`: `fused_topk_blocks`' id sets through `fused_decode_topk`, for
  prefill routing (the attention kernel takes the selection in any order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pdl import dependent_launch, pdl_args

TOPK_TILE_MIN = 256  # smallest tile of the decode top-k's first pass, measured on the H200 (was 1024)


def fused_topk_blocks(scores: torch.Tensor, top_k: int, first, end) -> torch.Tensor:
    """The top_k highest-scoring candidate blocks first..end-1 per kv head.

    scores [..., Hkv, NB]. Unlike `naive_topk_blocks` the result always has top_k columns,
    padded with -1 where fewer candidates exist, and `first`/`end` may be device tensors
    (broadcast against [..., Hkv, 1]): no host synchronisation, so it can sit inside a
    captured decode step. Ids are sorted ascending with the -1 slots last.
    """
    nb = scores.shape[-1]
    lead = scores.shape[:-1]
    k = min(top_k, nb)
    if k <= 0:
        return torch.full((*lead, max(top_k, 0)), -1, dtype=torch.long, device=scores.device)
    ids = torch.arange(nb, device=scores.device)
    cand = (ids >= first) & (ids < end)
    s = torch.where(cand, scores.float(), float("-inf"))
    top = torch.topk(s, k, dim=-1, sorted=False)
    idx = torch.where(torch.isfinite(top.values), top.indices, nb)
    idx = idx.sort(dim=-1).values
    idx = torch.where(idx == nb, -1, idx)
    if k < top_k:
        idx = torch.cat([idx, idx.new_full((*lead, top_k - k), -1)], dim=-1)
    return idx


def fused_topk_blocks_unsorted(scores: torch.Tensor, top_k: int, first, end) -> torch.Tensor:
    """`fused_topk_blocks` without the ascending sort: the same set of ids per row (-1 where
    fewer than top_k candidates exist), in no particular order, through the decode top-k
    kernels instead of torch's radix select (18 us per call in the prefill profile) and sort.
    For the attention kernel, which takes the selection in any order."""
    nb = scores.shape[-1]
    lead = scores.shape[:-1]
    k = min(top_k, nb)
    if k <= 0 or k > 64:
        return fused_topk_blocks(scores, top_k, first, end)
    ids = torch.arange(nb, device=scores.device)
    s = torch.where((ids >= first) & (ids < end), scores.float(), float("-inf")).contiguous()
    idx = fused_decode_topk(s.view(-1, nb), k).view(*lead, k)
    # picks beyond the candidates (rows with fewer than k) are non-candidates: drop them
    idx = torch.where(torch.gather(s, -1, idx) > float("-inf"), idx, -1)
    if k < top_k:
        idx = torch.cat([idx, idx.new_full((*lead, top_k - k), -1)], dim=-1)
    return idx


@triton.jit(do_not_specialize=["n"])
def _tile_topk_kernel(s_ptr, val_ptr, idx_ptr, n, ss_h, sv_h, K: tl.constexpr, TILE: tl.constexpr,
                      DROP: tl.constexpr = False, PDL: tl.constexpr = False):
    """The K best of one tile of one row. Finite scores beat -inf ones (non-candidates, still
    valid picks when a row has fewer than K candidates); a picked entry and the padding past
    `n` are retired to -inf, below every real entry, so no index is picked twice."""
    dependent_launch(PDL)
    h = tl.program_id(0)
    tile = tl.program_id(1)
    offs = tile * TILE + tl.arange(0, TILE)
    x = tl.load(s_ptr + h * ss_h + offs, mask=offs < n, other=float("-inf"))
    x = tl.where(offs < n, tl.where(x == float("-inf"), -3.0e38, x), float("-inf"))
    for r in range(K):
        best, at = tl.max(x, axis=0, return_indices=True)
        tl.store(val_ptr + h * sv_h + tile * K + r, best)
        pick = (tile * TILE + at).to(tl.int64)
        if DROP:  # a non-candidate pick (score -inf, carried as -3e38) becomes -1
            pick = tl.where(best > -3.0e38, pick, -1)
        tl.store(idx_ptr + h * sv_h + tile * K + r, pick)
        x = tl.where(tl.arange(0, TILE) == at, float("-inf"), x)


@triton.jit(do_not_specialize=["n"])
def _merge_topk_kernel(val_ptr, cidx_ptr, idx_ptr, n, sv_h, so_h, K: tl.constexpr, N_P2: tl.constexpr,
                       DROP: tl.constexpr = False, PDL: tl.constexpr = False):
    dependent_launch(PDL)
    h = tl.program_id(0)
    offs = tl.arange(0, N_P2)
    x = tl.load(val_ptr + h * sv_h + offs, mask=offs < n, other=float("-inf"))
    ids = tl.load(cidx_ptr + h * sv_h + offs, mask=offs < n, other=0)
    for r in range(K):
        best, at = tl.max(x, axis=0, return_indices=True)
        pick = tl.sum(tl.where(offs == at, ids, 0), axis=0)
        if DROP:
            pick = tl.where(best > -3.0e38, pick, -1)
        tl.store(idx_ptr + h * so_h + r, pick)
        x = tl.where(offs == at, float("-inf"), x)


def fused_decode_topk(scores: torch.Tensor, top_k: int, out: torch.Tensor | None = None, *,
                      drop_noncandidates: bool = False) -> torch.Tensor:
    """Indices of the top_k scores per row of scores [H, NB] fp32 (unordered), like
    `torch.topk(scores, top_k).indices` where scores are distinct; -inf entries (non-candidates)
    are taken last. For a decode step: two small launches instead of torch's radix select,
    which the H200 profile showed at ~20 us per layer. With `drop_noncandidates`, picks whose
    score is -inf come back as -1 (needs top_k <= 64 and top_k <= NB)."""
    h, nb = scores.shape
    if top_k > nb or top_k > 64 or scores.stride(-1) != 1:
        if drop_noncandidates:
            raise ValueError("drop_noncandidates needs top_k <= min(64, NB) and contiguous rows")
        return torch.topk(scores, min(top_k, nb), dim=-1, sorted=False).indices
    # Each pick-and-retire round is one reduction over the tile, so smaller tiles make the
    # rounds cheaper and give more programs; the merge then sees n_tiles * K candidates, kept
    # at <= 256 (one warp's merge slows past that: the 1M profile).
    tile = min(1024, max(TOPK_TILE_MIN, triton.next_power_of_2(triton.cdiv(nb * top_k, 256))))
    n_tiles = triton.cdiv(nb, tile)
    if out is None:
        out = torch.empty(h, top_k, dtype=torch.long, device=scores.device)
    if not out.is_contiguous() or out.shape != (h, top_k):
        raise ValueError(f"out must be a contiguous [{h}, {top_k}] tensor")
    if n_tiles == 1:
        vals = torch.empty(h, top_k, dtype=torch.float32, device=scores.device)
        _tile_topk_kernel[(h, 1)](scores, vals, out, nb, scores.stride(0), top_k, K=top_k, TILE=tile,
                                  DROP=drop_noncandidates, num_warps=1, **pdl_args())
        return out
    vals = torch.empty(h, n_tiles * top_k, dtype=torch.float32, device=scores.device)
    cidx = torch.empty(h, n_tiles * top_k, dtype=torch.long, device=scores.device)
    # One warp per program: the K pick-and-retire rounds are latency-bound, and inside one warp
    # each round's reduction is register shuffles only (the H200 profile: 5-6 us per launch
    # with 4 warps, most of it cross-warp barriers).
    _tile_topk_kernel[(h, n_tiles)](scores, vals, cidx, nb, scores.stride(0), n_tiles * top_k, K=top_k, TILE=tile,
                                    num_warps=1, **pdl_args())
    _merge_topk_kernel[(h,)](vals, cidx, out, n_tiles * top_k, n_tiles * top_k, out.stride(0), K=top_k,
                             N_P2=triton.next_power_of_2(n_tiles * top_k), DROP=drop_noncandidates, num_warps=1,
                             **pdl_args())
    return out

