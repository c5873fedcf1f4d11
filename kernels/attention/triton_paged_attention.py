"""Triton kernel for exact causal attention of many sequences at once over a paged KV pool.

Same arguments and semantics as `naive_paged_attention` (naive.py): the query rows of a batch
(prefill chunks and single decode tokens alike) are stacked, sequence s owning rows
cu_seqlens_q[s]..cu_seqlens_q[s+1]-1, which are the last of its seq_lens[s] tokens; its keys
live in the pool's blocks named by its row of block_tables. One launch covers every sequence.

A program takes one tile of BLOCK_Q consecutive queries of one sequence, with the query heads
of one GQA group (BLOCK_M rows = BLOCK_Q x group), and one kv head. The grid's first axis has
T // BLOCK_Q + S tiles, an upper bound on what the sequences need whatever their lengths (sequence
s's tiles start at cu_seqlens_q[s] // BLOCK_Q + s): the grid follows from T and S alone, so
the host never reads the lengths, and a decode step is capturable in a CUDA graph. A program
finds its sequence by binary search over those starts; tiles past a sequence's queries exit.

Key tiles are the pool's blocks (BLOCK = block_size keys, contiguous rows): those every row of
the tile sees whole run unmasked, the causal edge masked. Decode tiles (one query per sequence)
may split a sequence's key tiles across programs (flash-decoding), whose partial results
`_merge_splits_kernel` combines exactly by their log-sum-exp.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..gpu import interpreting

LOG2E = 1.4426950408889634
# Launch constants: chunks of many queries per sequence take wide tiles (BLOCK_M query rows);
# decode takes the smallest tile tl.dot allows and splits the keys instead.
PREFILL_BLOCK_M = {2: 128, 4: 64}  # by element size: fp32 tiles need twice the shared memory
PREFILL_LAUNCH = {2: {"num_warps": 8, "num_stages": 3}, 4: {"num_warps": 4, "num_stages": 2}}
DECODE_LAUNCH = {2: {"num_warps": 4, "num_stages": 3}, 4: {"num_warps": 4, "num_stages": 2}}
MAX_SPLITS = 16
# decode aims at about this many programs (a few per SM); the interpreter runs programs one
# after another, so there a few keep the CPU tests quick
DECODE_PROGRAMS = 8 if interpreting() else 512
# The batch's sequence count and the block table's width change from step to step: Triton would
# compile a variant for each class of them (== 1, multiple of 16, other) it meets.
SPECIALIZE_NOT = ["n_seqs", "st_s"]


@triton.jit
def _find_sequence(cu_q_ptr, tile, n_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence s whose first tile, cu_q[s] // BLOCK_Q + s, is at or before `tile`."""
    lo: tl.int32 = 0
    hi = n_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_q_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _key_tiles(q, k_ptr, v_ptr, tab_ptr, lo, hi, h, m_i, l_i, acc, pos, p_hi, scale_log2,
               sk_n, sk_h, sv_n, sv_h, d, dmask,
               BLOCK: tl.constexpr, MASKED: tl.constexpr, FULL_D: tl.constexpr):
    """Online softmax over key tiles lo..hi-1 (tile b: the sequence's block b). Unmasked tiles
    are the ones every row sees whole; masked ones hold the causal edge."""
    j_in = tl.arange(0, BLOCK)
    for blk in range(lo, hi):
        j = blk * BLOCK + j_in
        rows = tl.load(tab_ptr + blk).to(tl.int64) * BLOCK + j_in
        k_offs = rows[:, None] * sk_n + h * sk_h + d[None, :]
        v_offs = rows[:, None] * sv_n + h * sv_h + d[None, :]
        if MASKED:  # keys past the last query are not written yet: 0 * NaN would poison
            live = (j <= p_hi)[:, None] & dmask[None, :]
            k = tl.load(k_ptr + k_offs, mask=live, other=0.0)
            v = tl.load(v_ptr + v_offs, mask=live, other=0.0)
        elif FULL_D:
            k = tl.load(k_ptr + k_offs)
            v = tl.load(v_ptr + v_offs)
        else:
            k = tl.load(k_ptr + k_offs, mask=dmask[None, :], other=0.0)
            v = tl.load(v_ptr + v_offs, mask=dmask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            s = tl.where(j[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale_log2)
        # rows that have seen no key yet keep a finite reference point (avoids inf - inf)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s * scale_log2 - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit(do_not_specialize=SPECIALIZE_NOT)
def _paged_attn_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, lens_ptr, tab_ptr, po_ptr, plse_ptr,
    n_seqs, group, n_heads, scale_log2,
    sq_t, sq_h, sk_n, sk_h, sv_n, sv_h, so_t, so_h, st_s,
    NUM_SPLITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    s = _find_sequence(cu_q_ptr, tile, n_seqs, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + s)
    q_len = tl.load(cu_q_ptr + s + 1) - q_start
    local = tile - (q_start // BLOCK_Q + s)  # this program's tile among the sequence's
    if local * BLOCK_Q >= q_len:
        return
    p0 = tl.load(lens_ptr + s) - q_len  # position of the sequence's first query row

    r = tl.arange(0, BLOCK_M)
    tq = local * BLOCK_Q + r // group  # query index within the sequence
    rmask = (r < BLOCK_Q * group) & (tq < q_len)
    hq = h * group + r % group
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    row = (q_start + tq).to(tl.int64)
    q = tl.load(q_ptr + row[:, None] * sq_t + hq[:, None] * sq_h + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    pos = p0 + tq
    p_lo = p0 + local * BLOCK_Q
    p_hi = p0 + tl.minimum(local * BLOCK_Q + BLOCK_Q, q_len) - 1

    n_tiles = p_hi // BLOCK + 1
    per = (n_tiles + NUM_SPLITS - 1) // NUM_SPLITS
    lo = tl.minimum(split * per, n_tiles)
    hi = tl.minimum(lo + per, n_tiles)
    whole = tl.maximum(tl.minimum((p_lo + 1) // BLOCK, hi), lo)  # tiles below end before every row
    tab = tab_ptr + s.to(tl.int64) * st_s

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    m_i, l_i, acc = _key_tiles(q, k_ptr, v_ptr, tab, lo, whole, h, m_i, l_i, acc, pos, p_hi, scale_log2,
                               sk_n, sk_h, sv_n, sv_h, d, dmask, BLOCK, False, D == BLOCK_D)
    m_i, l_i, acc = _key_tiles(q, k_ptr, v_ptr, tab, whole, hi, h, m_i, l_i, acc, pos, p_hi, scale_log2,
                               sk_n, sk_h, sv_n, sv_h, d, dmask, BLOCK, True, D == BLOCK_D)

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    omask = rmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + row[:, None] * so_t + hq[:, None] * so_h + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=omask)
    else:
        # partials: the normalised output and its log2-sum-exp, per (row, query head, split)
        part = (row * n_heads + hq) * NUM_SPLITS + split
        tl.store(po_ptr + part[:, None] * BLOCK_D + d[None, :], o, mask=omask)
        lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(plse_ptr + part, lse2, mask=rmask)


@triton.jit
def _merge_splits_kernel(po_ptr, plse_ptr, out_ptr, group, n_heads, so_t, so_h,
                         NUM_SPLITS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """One row, the query heads of one GQA group: out = sum_i w_i o_i / sum_i w_i over the
    splits i, with w_i = 2^(lse_i - max lse)."""
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUP)
    hq = tl.program_id(1) * group + g
    sp = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    part = (t * n_heads + hq[:, None]) * NUM_SPLITS + sp[None, :]  # [GROUP, NUM_SPLITS]
    hmask = (g < group)[:, None]
    lse = tl.load(plse_ptr + part, mask=hmask, other=0.0)
    m = tl.max(lse, axis=1)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m)[:, None])
    keep = hmask[:, :, None] & (d < D)[None, None, :]
    parts = tl.load(po_ptr + part[:, :, None] * BLOCK_D + d[None, None, :], mask=keep, other=0.0)
    tot = tl.sum(w, axis=1)
    o = tl.sum(w[:, :, None] * parts, axis=1) / tl.where(tot == 0.0, 1.0, tot)[:, None]
    tl.store(out_ptr + t * so_t + hq[:, None] * so_h + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=hmask & (d < D)[None, :])


def decode_splits(n_seqs: int, kv_heads: int) -> int:
    """Key splits per sequence for a decode step of n_seqs sequences: enough programs to fill
    the GPU (a power of two: each value is a compiled variant)."""
    want = max(1, min(MAX_SPLITS, DECODE_PROGRAMS // max(1, n_seqs * kv_heads)))
    return 1 << (want.bit_length() - 1)


def fused_paged_attention(
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
    """Exact causal attention of S sequences' stacked query rows over a paged pool (see
    `naive_paged_attention`): one launch (two with key splits) for the whole batch.

    q [T, Hq, D] (already rotated): sequence s's queries are rows cu_seqlens_q[s] ..
    cu_seqlens_q[s+1]-1 (cu_seqlens_q [S+1] int32, from 0 to T, non-decreasing), at positions
    seq_lens[s] - q_len_s .. seq_lens[s] - 1 (seq_lens [S] int32: the sequence's tokens with
    these ones); a query sees the keys at positions up to its own. k, v [N, Hkv, D] are the pool
    (bf16/fp16/fp32): position j of sequence s lives at row block_tables[s, j // block_size] *
    block_size + j % block_size (block_tables [S, W] int32, any width covering the sequences).
    Keys up to each sequence's last query must be written before the call. Nothing is read on
    the host: with static tensors the call can be captured in a CUDA graph.

    max_query_len: an upper bound on any sequence's query rows (default T): 1 selects the decode
    tiles and key splits. num_splits (a power of two) splits each sequence's keys across programs;
    the default picks it for decode from S. Returns out [T, Hq, D] in q's dtype (or fills `out`).
    """
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"expected q [T,Hq,D], k=v [N,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    t, hq, d = q.shape
    hkv = k.shape[1]
    if k.shape[2] != d or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match k {tuple(k.shape)}")
    n_seqs = seq_lens.shape[0]
    if cu_seqlens_q.shape != (n_seqs + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != n_seqs:
        raise ValueError(f"{n_seqs} sequences need cu_seqlens_q [{n_seqs + 1}] and block_tables [{n_seqs}, W]; "
                         f"got {tuple(cu_seqlens_q.shape)}, {tuple(block_tables.shape)}")
    if block_size & (block_size - 1) or block_size < 16:
        raise ValueError("block_size must be a power of two >= 16")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or block_tables.stride(-1) != 1:
        raise ValueError("q, k, v and block_tables must be contiguous in their last dimension")
    if num_splits is not None and (num_splits < 1 or num_splits & (num_splits - 1)):
        raise ValueError("num_splits must be a power of two")
    if interpreting() and q.dtype != torch.float32:
        # the interpreter's bf16 matrix products are unreliable; the CUDA tests cover bf16
        o = fused_paged_attention(q.float(), k.float(), v.float(), cu_seqlens_q, seq_lens, block_tables, block_size,
                                  scale, max_query_len=max_query_len, num_splits=num_splits)
        return o.to(q.dtype) if out is None else out.copy_(o)
    if out is None:
        out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    if t == 0 or n_seqs == 0:
        return out
    g = hq // hkv
    decode = max_query_len == 1
    size = k.element_size() if k.element_size() in (2, 4) else 2
    block_m = max(16 if decode else PREFILL_BLOCK_M[size], triton.next_power_of_2(g))
    block_q = block_m // g
    splits = num_splits or (decode_splits(n_seqs, hkv) if decode else 1)
    block_d = triton.next_power_of_2(d)
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    po = plse = out  # any pointer; unused without splits
    if splits > 1:
        po = torch.empty(t * hq * splits, block_d, dtype=torch.float32, device=q.device)
        plse = torch.empty(t * hq * splits, dtype=torch.float32, device=q.device)
    launch = (DECODE_LAUNCH if decode else PREFILL_LAUNCH)[size]
    _paged_attn_kernel[(t // block_q + n_seqs, hkv, splits)](
        q, k, v, out, cu_seqlens_q, seq_lens, block_tables, po, plse,
        n_seqs, g, hq, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0),
        NUM_SPLITS=splits, BLOCK=block_size, BLOCK_Q=block_q, BLOCK_M=block_m, D=d, BLOCK_D=block_d, **launch,
    )
    if splits > 1:  # every split of a row writes its part (an empty range: lse -inf)
        _merge_splits_kernel[(t, hkv)](po, plse, out, g, hq, out.stride(0), out.stride(1), NUM_SPLITS=splits,
                                       GROUP=triton.next_power_of_2(g), D=d, BLOCK_D=block_d, num_warps=2)
    return out
