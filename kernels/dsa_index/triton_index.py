"""Triton DSA indexer: index scores for a chunk of queries, and top-k per query row.

`fused_index_scores`: one program per (query, key tile); the tile's keys are read once for
every indexer head (`tl.dot` of [heads, D] by [D, keys]), relu, weighted sum over heads,
causal -inf. fp32 dots use IEEE precision so the selected sets equal the reference's.

`fused_index_topk`: one program per row, any k (GLM-5 uses 2048, too many for pick-and-retire
rounds). Scores become order-preserving int32 keys; 32 rounds of bisection over the key
range find the k-th largest value (each round counts keys >= a candidate threshold over the
row), then one pass writes the indices above it and, in index order, as many ties at it as
fill k. Output in ascending token order, -1 padded where a row has fewer finite scores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _index_scores_kernel(q_ptr, k_ptr, w_ptr, out_ptr, start, n_keys, scale, sq_t, sq_h, sk_s,
                         sw_t, so_t, H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, IEEE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    offs_s = tile * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + t * sq_t + offs_h[:, None] * sq_h + offs_d[None, :],
                mask=(offs_h[:, None] < H) & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    k = tl.load(k_ptr + offs_s[:, None].to(tl.int64) * sk_s + offs_d[None, :],
                mask=(offs_s[:, None] < n_keys) & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.maximum(s * scale, 0.0)
    w = tl.load(w_ptr + t * sw_t + offs_h, mask=offs_h < H, other=0.0).to(tl.float32)
    index = tl.sum(s * w[:, None], axis=0)
    visible = offs_s <= start + t
    index = tl.where(visible, index, float("-inf"))
    tl.store(out_ptr + t * so_t + offs_s, index, mask=offs_s < n_keys)


def fused_index_scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, start: int,
                       scale: float, *, block_s: int = 64) -> torch.Tensor:
    """As `naive_index_scores`: q [T, Hi, D], keys [S, D], weights [T, Hi] -> [T, S] fp32."""
    t, h, d = q.shape
    s = keys.shape[0]
    if keys.shape[1] != d or weights.shape != (t, h):
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, keys {tuple(keys.shape)}, "
                         f"weights {tuple(weights.shape)}")
    q, keys, weights = q.contiguous(), keys.contiguous(), weights.contiguous()
    out = torch.empty(t, s, dtype=torch.float32, device=q.device)
    if t and s:
        _index_scores_kernel[(t, triton.cdiv(s, block_s))](
            q, keys, weights, out, start, s, scale, q.stride(0), q.stride(1), keys.stride(0),
            weights.stride(0), out.stride(0), H=h, D=d, BLOCK_H=max(16, triton.next_power_of_2(h)),
            BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_S=block_s,
            IEEE=q.dtype == torch.float32)
    return out


@triton.jit
def _sortable(x):
    """fp32 -> int64 whose order is the floats' order (-inf lowest of the finite-or-inf)."""
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _threshold_topk_kernel(s_ptr, out_ptr, n, k, ss, so, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = s_ptr + row * ss
    lo = tl.full((), -2147483648, tl.int64)  # count(keys >= lo) >= k, or lo stays the minimum
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        cnt = tl.zeros((), tl.int64)
        for s0 in range(0, n, BLOCK):
            offs = s0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < n, other=float("-inf"))
            ok = (offs < n) & (x > float("-inf")) & (_sortable(x) >= mid)
            cnt += tl.sum(ok.to(tl.int64), axis=0)
        enough = cnt >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    above = tl.zeros((), tl.int64)
    for s0 in range(0, n, BLOCK):
        offs = s0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < n, other=float("-inf"))
        ok = (offs < n) & (x > float("-inf")) & (_sortable(x) > lo)
        above += tl.sum(ok.to(tl.int64), axis=0)
    ties_wanted = k - above
    written = tl.zeros((), tl.int64)
    ties = tl.zeros((), tl.int64)
    for s0 in range(0, n, BLOCK):
        offs = s0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < n, other=float("-inf"))
        key = _sortable(x)
        finite = (offs < n) & (x > float("-inf"))
        gt = finite & (key > lo)
        eq = finite & (key == lo)
        eq_rank = tl.cumsum(eq.to(tl.int64), axis=0)
        take = gt | (eq & (ties + eq_rank <= ties_wanted))
        pos = written + tl.cumsum(take.to(tl.int64), axis=0) - 1
        tl.store(out_ptr + row * so + pos, offs.to(tl.int64), mask=take)
        written += tl.sum(take.to(tl.int64), axis=0)
        ties += tl.sum(eq.to(tl.int64), axis=0)
    for p0 in range(0, k, BLOCK):
        offs = p0 + tl.arange(0, BLOCK)
        tl.store(out_ptr + row * so + offs, tl.full((BLOCK,), -1, tl.int64),
                 mask=(offs >= written) & (offs < k))


def fused_index_topk(scores: torch.Tensor, top_k: int, *, block: int = 1024) -> torch.Tensor:
    """As `naive_index_topk` (same sets where scores are distinct): scores [T, S] fp32 ->
    [T, min(top_k, S)] int64, ascending token order, -1 padded."""
    t, s = scores.shape
    k = min(top_k, s)
    scores = scores.float().contiguous()
    out = torch.empty(t, k, dtype=torch.long, device=scores.device)
    if t and k:
        _threshold_topk_kernel[(t,)](scores, out, s, k, scores.stride(0), out.stride(0),
                                     BLOCK=min(block, max(16, triton.next_power_of_2(s))))
    return out
