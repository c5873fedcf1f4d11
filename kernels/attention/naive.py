"""PyTorch references for the three-layer attention (sinks + local window + routed blocks).

Every function upcasts to fp32, takes explicit tensors and returns tensors, so a Triton kernel
with the same signature can replace it. Layout is one sequence (batch 1), time-major:
q [T, Hq, D], k and v [N, Hkv, D], with Hq a multiple of Hkv (GQA: query head h reads kv head
h // (Hq // Hkv)). A query chunk covers absolute indices q_offset .. q_offset + T - 1 of the
key sequence and sees keys causally (key j <= query index).
"""

from __future__ import annotations

import math

import torch

NO_RING = (0, 1 << 62)  # (pin, ring) of a KV pool that keeps every position at its own row


def ring_row(p, ring: tuple[int, int] = NO_RING):
    """Cache row of position p (an int or a tensor of them) in a tiered GPU pool
    (engine/gpu/tiering.py): the first `pin` positions at their own rows, later ones in a ring
    of `ring` rows after them (the kernels' `triton_kvstore.ring_row`)."""
    pin, rows = ring
    if isinstance(p, torch.Tensor):
        return torch.where(p < pin, p, pin + (p - pin) % rows)
    return p if p < pin else pin + (p - pin) % rows


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"expected q [T,Hq,D], k=v [N,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    t, hq, d = q.shape
    hkv = k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"head_dim of q ({d}) and k ({k.shape[2]}) differ")
    if hq % hkv:
        raise ValueError(f"{hq} query heads cannot be grouped over {hkv} kv heads")
    return t, hq, hkv, d


def _grouped(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """q [T, Hq, D] -> [Hkv, G*T, D] with the G query heads of a group stacked along time."""
    t, hq, d = q.shape
    g = hq // hkv
    return q.float().permute(1, 0, 2).reshape(hkv, g * t, d)


def _ungrouped(x: torch.Tensor, t: int) -> torch.Tensor:
    """Inverse of _grouped for outputs: [Hkv, G*T, ...] -> [T, Hq, ...]."""
    hkv = x.shape[0]
    x = x.reshape(hkv * (x.shape[1] // t), t, *x.shape[2:])
    return x.transpose(0, 1)


def naive_masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention where each kv head has its own key set and mask.

    q [T, Hq, D]; k, v [Hkv, M, D]; mask bool [Hkv, T, M] (True = attend).
    Returns out [T, Hq, D] (fp32) and lse [T, Hq] (natural log of the softmax denominator of
    the scaled scores). A query with no visible key gets out 0 and lse -inf, so merging it with
    another part is a no-op.
    """
    t, hq, d = q.shape
    hkv = k.shape[0]
    if k.dim() != 3 or v.shape != k.shape or mask.shape != (hkv, t, k.shape[1]) or hq % hkv:
        raise ValueError(f"bad shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} mask {tuple(mask.shape)}")
    g = hq // hkv
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    s = torch.bmm(_grouped(q, hkv), k.float().transpose(1, 2)) * scale  # [Hkv, G*T, M]
    m = mask.repeat(1, g, 1)
    s = s.masked_fill(~m, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [Hkv, G*T]
    p = torch.exp(s - lse.unsqueeze(-1).clamp_min(torch.finfo(torch.float32).min))
    p = p.nan_to_num(0.0)
    out = torch.bmm(p, v.float())
    return _ungrouped(out, t), _ungrouped(lse, t)


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense causal attention for a query chunk.

    q [T, Hq, D] at absolute indices q_offset..q_offset+T-1; k, v [N, Hkv, D] (N >= q_offset+T,
    keys beyond a query's index are masked). Returns out [T, Hq, D] fp32 and lse [T, Hq].
    """
    t, _, hkv, _ = _check(q, k, v)
    n = k.shape[0]
    if q_offset < 0 or q_offset + t > n:
        raise ValueError(f"queries {q_offset}..{q_offset + t} fall outside {n} keys")
    rows = torch.arange(q_offset, q_offset + t, device=q.device)[:, None]
    mask = (torch.arange(n, device=q.device)[None, :] <= rows).expand(hkv, t, n)
    return naive_masked_attention(q, k.transpose(0, 1), v.transpose(0, 1), mask, scale)


def naive_block_descriptors(k: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per block of `block_size` consecutive keys and per kv head: min, max and mean key.

    k [N, Hkv, D] -> kmin, kmax, kmean each [ceil(N / block_size), Hkv, D] fp32; the last block
    may be partial and is summarised over its valid keys only.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    n, hkv, d = k.shape
    nb = -(-n // block_size)
    pad = nb * block_size - n
    kf = k.float()
    blocks = torch.nn.functional.pad(kf, (0, 0, 0, 0, 0, pad)).reshape(nb, block_size, hkv, d)
    valid = (torch.arange(nb * block_size, device=k.device) < n).reshape(nb, block_size, 1, 1)
    kmin = blocks.masked_fill(~valid, float("inf")).amin(1)
    kmax = blocks.masked_fill(~valid, float("-inf")).amax(1)
    counts = valid.sum(1).clamp_min(1)
    kmean = (blocks * valid).sum(1) / counts
    return kmin, kmax, kmean


def naive_block_scores(
    q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor, method: str = "minmax",
    *, chunk: int | None = None, candidates: tuple | None = None, tile: tuple[int, int] | None = None,
    chunk_candidates: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """Relevance of each block to a query chunk, shared by the chunk and by a GQA group.

    q [T, Hq, D]; descriptors [NB, Hkv, D]. Per query vector x and block:
      minmax: sum_d max(x_d * kmin_d, x_d * kmax_d)  (an upper bound of x . k over the block)
      mean:   x . kmean
    Returns scores [Hkv, NB] fp32: the max over the T queries and the G query heads of a group.
    With `chunk`, the queries are cut into ceil(T / chunk) routing chunks: [C, Hkv, NB].
    `candidates=(first, end)` (end an int or 1-element tensor): blocks outside first..end-1
    score -inf. `chunk_candidates=(first, q0, window, block_size)` (queries at absolute indices
    q0..): per routing chunk, blocks before `first` and from max(0, (last - window +
    block_size) // block_size) on, `last` the chunk's last query, score -inf. `tile` is the
    kernel's program tile (`fused_block_scores`) and changes nothing here.
    """
    hkv = kmin.shape[1]
    if q.shape[1] % hkv:
        raise ValueError(f"{q.shape[1]} query heads cannot be grouped over {hkv} kv heads")
    if method not in ("minmax", "mean"):
        raise ValueError(f"unknown block score method {method!r} (minmax, mean)")
    if candidates is not None and chunk_candidates is not None:
        raise ValueError("candidates and chunk_candidates exclude each other")
    t, nb = q.shape[0], kmin.shape[0]
    c_len = t if chunk is None else chunk
    n_c = max(1, -(-t // c_len)) if c_len else 1
    ids = torch.arange(nb, device=q.device)
    rows = []
    for c in range(n_c):
        qc = q[c * c_len:(c + 1) * c_len]
        if qc.shape[0] == 0:
            s = torch.full((hkv, nb), float("-inf"), device=q.device)
        else:
            x = _grouped(qc, hkv)  # [Hkv, G*T, D]
            if method == "minmax":
                # max(x*lo, x*hi) = x*(lo+hi)/2 + |x|*(hi-lo)/2: two matmuls instead of a [.., NB, D] tensor
                center = ((kmin.float() + kmax.float()) / 2).permute(1, 2, 0)  # [Hkv, D, NB]
                radius = ((kmax.float() - kmin.float()) / 2).permute(1, 2, 0)
                s = (torch.bmm(x, center) + torch.bmm(x.abs(), radius)).amax(1)
            else:
                s = torch.bmm(x, kmean.float().permute(1, 2, 0)).amax(1)
        if candidates is not None:
            first, end = candidates
            s = torch.where((ids >= first) & (ids < torch.as_tensor(end, device=q.device).reshape(())), s,
                            float("-inf"))
        if chunk_candidates is not None:
            first, q0, window, block_size = chunk_candidates
            last = min((c + 1) * c_len, t) - 1 + q0
            end = max((last - window + block_size) // block_size, 0)
            s = torch.where((ids >= first) & (ids < end), s, float("-inf"))
        rows.append(s)
    return torch.stack(rows) if chunk is not None else rows[0]


def naive_topk_blocks(scores: torch.Tensor, top_k: int, first: int, end: int) -> torch.Tensor:
    """The top_k highest-scoring blocks among candidates first..end-1, per kv head.

    scores [Hkv, NB]. Blocks before `first` (covered by the sinks) and from `end` on (covered
    by the local window) are never chosen. Returns LongTensor [Hkv, min(top_k, end-first)] of
    block ids sorted ascending.
    """
    hkv, nb = scores.shape
    first, end = max(0, first), min(nb, end)
    k = max(0, min(top_k, end - first))
    if k == 0:
        return torch.empty(hkv, 0, dtype=torch.long, device=scores.device)
    idx = torch.topk(scores[:, first:end].float(), k, dim=1, sorted=False).indices + first
    return idx.sort(dim=1).values


def naive_topk_blocks_unsorted(scores: torch.Tensor, top_k: int, first, end) -> torch.Tensor:
    """Reference of `fused_topk_blocks_unsorted`: per row of scores [..., Hkv, NB], the top_k
    highest-scoring candidate blocks first..end-1 (`first` / `end` ints or tensors broadcast
    against [..., Hkv, 1]), as [..., Hkv, top_k] with -1 in the slots no candidate fills.
    Ids in no particular order (here: descending score)."""
    nb = scores.shape[-1]
    ids = torch.arange(nb, device=scores.device)
    s = torch.where((ids >= first) & (ids < end), scores.float(), float("-inf"))
    k = max(0, min(top_k, nb))
    top = torch.topk(s, k, dim=-1)
    idx = torch.where(torch.isfinite(top.values), top.indices, -1)
    pad = idx.new_full((*scores.shape[:-1], max(top_k, 0) - k), -1)
    return torch.cat([idx, pad], dim=-1)


def naive_decode_topk(scores: torch.Tensor, top_k: int, out: torch.Tensor | None = None, *,
                      drop_noncandidates: bool = False) -> torch.Tensor:
    """Reference of `fused_decode_topk`: indices of the top min(top_k, NB) scores per row of
    scores [H, NB], unordered; -inf entries (non-candidates) only where a row has fewer finite
    ones, and with `drop_noncandidates` those picks are -1. Fills `out` when given."""
    idx = torch.topk(scores.float(), min(top_k, scores.shape[-1]), dim=-1).indices
    if drop_noncandidates:
        idx = torch.where(torch.gather(scores, -1, idx) > float("-inf"), idx, -1)
    return idx if out is None else out.copy_(idx)


def sparse_mask(
    n_keys: int, q_offset: int, t: int, block_idx: torch.Tensor, block_size: int, sink_tokens: int, window: int
) -> torch.Tensor:
    """bool [Hkv, T, N]: which keys each query sees under sinks + window + selected blocks."""
    dev = block_idx.device
    j = torch.arange(n_keys, device=dev)
    i = torch.arange(q_offset, q_offset + t, device=dev)[:, None]
    base = (j[None, :] <= i) & ((j[None, :] < sink_tokens) | (j[None, :] > i - window))
    hkv = block_idx.shape[0]
    nb = -(-n_keys // block_size)
    chosen = torch.zeros(hkv, nb + 1, dtype=torch.bool, device=dev)  # column nb takes the -1 slots
    chosen.scatter_(1, torch.where(block_idx < 0, nb, block_idx), True)
    in_block = chosen[:, j // block_size]  # [Hkv, N]
    return base[None] | ((j[None, None, :] <= i[None]) & in_block[:, None, :])


def logical_keys(
    k: torch.Tensor, v: torch.Tensor, n_keys: int, block_table: torch.Tensor, block_size: int,
    host: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys 0..n_keys-1 in logical order from a paged pool: logical block b lives at rows
    block_table[b]*B + (0..B-1) of k, v [rows, Hkv, D], or, for an entry -1-r < 0, at row-block
    r of the host pool `host=(hk, hv)` (engine/gpu/tiering.py). Returns k, v [n_keys, Hkv, D]."""
    j = torch.arange(n_keys, device=k.device)
    phys = block_table.to(k.device).long()[j // block_size]
    near = phys >= 0
    rows = torch.where(near, phys, -1 - phys) * block_size + j % block_size
    ko, vo = k.new_empty(n_keys, *k.shape[1:]), v.new_empty(n_keys, *v.shape[1:])
    ko[near], vo[near] = k[rows[near]], v[rows[near]]
    if not near.all():
        if host is None:
            raise ValueError("a negative block table entry needs the host pool")
        far = (~near).cpu()
        hrows = rows.cpu()[far]
        ko[~near], vo[~near] = host[0][hrows].to(k.device), host[1][hrows].to(v.device)
    return ko, vo


def naive_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offset,
    block_idx: torch.Tensor,
    block_size: int,
    sink_tokens: int,
    window: int,
    scale: float | None = None,
    *,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
    route_chunk: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    host: tuple[torch.Tensor, torch.Tensor] | None = None,
    staging: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over sinks ∪ selected blocks ∪ local window, with true positions.

    q [T, Hq, D], k, v [N, Hkv, D] (both already rotated); block_idx LongTensor [Hkv, K] of
    selected block ids (-1 = unused slot). Query i (absolute q_offset + t) sees key j <= i when
    j < sink_tokens, or i - window < j, or j lies in a block selected for its kv head. Each key
    is counted once even when it is in several of those sets. Returns out [T, Hq, D], lse [T, Hq].

    As `fused_sparse_attention`: block_idx [C, Hkv, K] holds one selection per routing chunk of
    `route_chunk` (default ceil(T / C)) queries; `block_table` (+ `host`) makes k, v a paged
    pool (`logical_keys`); `out` / `lse` are filled when given; `q_offset` may be a 1-element
    tensor. `num_splits` and `staging` only say how the kernel does the work: ignored here.
    """
    t, _, hkv, _ = _check(q, k, v)
    q_offset = int(q_offset)
    if block_idx.dim() == 2:
        block_idx = block_idx[None]
    if block_idx.dim() != 3 or block_idx.shape[1] != hkv:
        raise ValueError(f"block_idx must be [Hkv={hkv}, K] or [C, Hkv, K]; got {tuple(block_idx.shape)}")
    if block_table is not None:
        k, v = logical_keys(k, v, q_offset + t, block_table, block_size, host)
    n_c = block_idx.shape[0]
    if route_chunk is not None and n_c != -(-t // route_chunk):
        raise ValueError(f"{n_c} selections do not cover {t} queries in routing chunks of {route_chunk}")
    step = (route_chunk or -(-t // n_c)) if n_c > 1 else max(t, 1)
    o = torch.empty(t, q.shape[1], q.shape[2], device=q.device)
    l = torch.empty(t, q.shape[1], device=q.device)
    for c in range(n_c):
        a, b = c * step, min(t, (c + 1) * step)
        mask = sparse_mask(k.shape[0], q_offset + a, b - a, block_idx[c], block_size, sink_tokens, window)
        o[a:b], l[a:b] = naive_masked_attention(q[a:b], k.transpose(0, 1), v.transpose(0, 1), mask, scale)
    return (o if out is None else out.copy_(o)), (l if lse is None else lse.copy_(l))


def naive_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    scale: float | None = None,
    *,
    max_query_len: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense causal attention of many sequences at once over one paged pool.

    q [T, Hq, D] stacks the sequences' query rows: sequence s owns rows cu_seqlens_q[s] ..
    cu_seqlens_q[s+1]-1, the last q_len_s of its seq_lens[s] tokens (a prefill chunk, possibly
    after cached tokens, or one decode token). Its keys 0..seq_lens[s]-1 are in k, v [N, Hkv, D]
    at the rows `logical_keys` finds through block_tables[s]; each query sees the keys up to
    its own position. Returns out [T, Hq, D] fp32 (or fills `out`). `max_query_len` and
    `num_splits` only say how the kernel does the work: ignored here.
    """
    _check(q, k, v)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    if len(cu) != len(lens) + 1 or block_tables.shape[0] != len(lens):
        raise ValueError(f"{len(lens)} sequences need cu_seqlens_q [{len(lens) + 1}] and block_tables [{len(lens)}, W]")
    o = torch.zeros(q.shape, device=q.device)
    for s, n in enumerate(lens):
        a, b = cu[s], cu[s + 1]
        keys, values = logical_keys(k, v, n, block_tables[s], block_size)
        o[a:b] = naive_attention(q[a:b], keys, values, n - (b - a), scale)[0]
    return o if out is None else out.copy_(o)


def merge_attention(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine softmax attention over two disjoint key sets into attention over their union.

    o [T, H, D], lse [T, H]. lse = log(e^lse1 + e^lse2); out = (e^lse1 o1 + e^lse2 o2) / e^lse.
    A part with lse -inf (no keys) contributes nothing.
    """
    lse = torch.logaddexp(lse1.float(), lse2.float())
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w1 = torch.exp(lse1.float() - safe).unsqueeze(-1)
    w2 = torch.exp(lse2.float() - safe).unsqueeze(-1)
    return w1 * o1.float() + w2 * o2.float(), lse


def naive_append_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    kmin: torch.Tensor, kmax: torch.Tensor, pos: torch.Tensor, block_size: int,
                    kmean: torch.Tensor | None = None, ksum: torch.Tensor | None = None,
                    ring: tuple[int, int] = NO_RING) -> None:
    """Reference of `fused_append_kv`: one key/value [1, Hkv, D] written at position `pos` (row
    `ring_row(pos)` of a tiered pool), and block pos // block_size's running min / max (and mean,
    through the open block's fp32 key sum) updated; the block's first key replaces stale values."""
    p = int(pos.reshape(-1)[0])
    row = ring_row(p, ring)
    kf = k.reshape(k_cache.shape[1:]).float()
    k_cache[row] = kf.to(k_cache.dtype)
    v_cache[row] = v.reshape(v_cache.shape[1:]).to(v_cache.dtype)
    b, first = p // block_size, p % block_size == 0
    kmin[b] = kf if first else torch.minimum(kmin[b].float(), kf)
    kmax[b] = kf if first else torch.maximum(kmax[b].float(), kf)
    if kmean is not None:
        ksum.copy_(kf if first else ksum + kf)
        kmean[b] = ksum / (p % block_size + 1)


def naive_store_kv_blocks(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          kmin: torch.Tensor, kmax: torch.Tensor, start: int, block_size: int,
                          kmean: torch.Tensor | None = None, ksum: torch.Tensor | None = None,
                          ring: tuple[int, int] = NO_RING) -> None:
    """Reference of `fused_store_kv_blocks`: a prefill chunk's k, v [T, Hkv, D] written at
    positions start..start+T-1 (rows `ring_row` of them), then the min / max (and mean) of
    every block those positions touch, over all its keys up to start+T-1 as the cache holds them
    (earlier ones included); ksum [Hkv, D] gets the fp32 key sum of the last touched block."""
    t = k.shape[0]
    if t == 0:
        return
    end = start + t
    pos = torch.arange(start, end, device=k_cache.device)
    rows = ring_row(pos, ring)
    k_cache[rows] = k.to(k_cache.dtype)
    v_cache[rows] = v.to(v_cache.dtype)
    for b in range(start // block_size, -(-end // block_size)):
        keys = k_cache[ring_row(torch.arange(b * block_size, min(end, (b + 1) * block_size),
                                             device=k_cache.device), ring)].float()
        kmin[b], kmax[b] = keys.amin(0), keys.amax(0)
        if kmean is not None:
            kmean[b] = keys.mean(0)
            ksum.copy_(keys.sum(0))


def naive_rope_append(qkv: torch.Tensor, bias: torch.Tensor | None, q_norm: torch.Tensor | None,
                      k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor, heads: int,
                      kv_heads: int, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor, ksum: torch.Tensor,
                      block_size: int, ring: tuple[int, int] = NO_RING) -> torch.Tensor:
    """Reference of `fused_rope_append`: bias, per-head RMSNorm of q and k, RoPE of q and k (in
    fp32, written back into qkv), then `naive_append_kv` of the k and v heads."""
    d = k_cache.shape[-1]
    x = qkv.float().view(heads + 2 * kv_heads, d)
    if bias is not None:
        x = x + bias.float().view_as(x)
    q, k, v = x[:heads], x[heads:heads + kv_heads], x[heads + kv_heads:]
    if q_norm is not None:
        rms = lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        q, k = rms(q, q_norm), rms(k, k_norm)
    half = d // 2
    c, s = cos.float().reshape(1, half), sin.float().reshape(1, half)
    rot = lambda t: torch.cat([t[:, :half] * c - t[:, half:] * s, t[:, half:] * c + t[:, :half] * s], dim=-1)
    out = torch.cat([rot(q), rot(k), v]).to(qkv.dtype)
    qkv.copy_(out.view_as(qkv))
    k_out = out[heads:heads + kv_heads]
    naive_append_kv(k_out, out[heads + kv_heads:], k_cache, v_cache, kmin, kmax, pos, block_size, kmean, ksum, ring)
    return qkv
