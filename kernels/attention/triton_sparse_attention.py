"""Triton kernels for the three-layer sparse attention (sinks + local window + routed blocks).

Same arguments and semantics as `naive_sparse_attention` / `naive_attention` (naive.py):

- `fused_sparse_attention`: exact attention over sinks ∪ selected blocks ∪ window, for prefill
  chunks and decode. Decode runs `_sparse_attn_kernel`: the work of one kv head is a list of
  key tiles (selected blocks, then sink tiles, then window tiles), each masked so that a key is
  counted once even when it is in several sets; the list can be split across programs
  (flash-decoding) and the partial (out, lse) pairs are merged exactly by
  `_merge_splits_kernel`. Prefill runs `_sparse_prefill_attn_kernel` (three loops, no splits).
  Optionally the keys live in a paged pool addressed through `block_table`, with far blocks in
  a pinned host pool (read in place, or staged to the GPU by `_stage_far_blocks_kernel`).
- `fused_attention`: dense causal attention through the same kernel.

All query heads of one GQA group share a program, so each key tile is read once per kv head.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..gpu import interpreting
from ..pdl import dependent_launch, pdl_args

LOG2E = 1.4426950408889634
# Launch constants measured on the H200 (bench/results/archive/): constants, never reassigned.
PREFILL_LAUNCH = {"num_warps": 8, "num_stages": 3}  # long chunks (>= 4096 rows); shorter: 4 warps, 2 stages
PREFILL_BLOCK_M = 128  # query rows (query x GQA head) per prefill program in long chunks
MAX_SPLITS = 32  # split-KV programs per (query tile, kv head) in decode
# decode attention aims at about this many programs (2 per SM, 132 SMs); the interpreter runs
# programs one after another, so there a few splits keep the CPU tests quick
DECODE_PROGRAMS = 4 if interpreting() else 256
# Lengths and positions vary with every prompt; Triton would compile a variant of a kernel for
# each class of them (== 1, multiple of 16, other) it meets, ~0.4 s each inside a question's
# prefill in a new process (the H200 e2e run: 0.9 s to prefill a 19-token question). These
# arguments only bound loops and masks, so the kernels take them unspecialised.
SPECIALIZE_NOT = ["n_q", "n_keys_static", "sel_chunk"]


@triton.jit
def _program_queries(q_ptr, qoff_ptr, pid_m, h, n_q, group, n_keys_static, sq_t, sq_h, sel_chunk,
                     QOFF_PTR: tl.constexpr, KV_FP8: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr):
    """The rows of one attention program — (query, head of the GQA group) pairs — with their
    query vectors and absolute positions, the program's first and last query position, and
    its routing chunk (the wrapper checks that a program's rows lie in one)."""
    if QOFF_PTR:
        q_offset = tl.load(qoff_ptr).to(tl.int32)
    else:
        q_offset = n_keys_static
    n_rows = n_q * group
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = r < n_rows
    t = r // group
    hq = h * group + r % group
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(q_ptr + t[:, None].to(tl.int64) * sq_t + hq[:, None] * sq_h + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    if KV_FP8:
        q = q.to(tl.bfloat16)
    t_hi = tl.minimum(pid_m * BLOCK_M + BLOCK_M, n_rows) - 1
    p_lo = q_offset + (pid_m * BLOCK_M) // group
    p_hi = q_offset + t_hi // group
    rc = (pid_m * BLOCK_M) // group // sel_chunk
    return q, t, hq, q_offset + t, rmask, d, dmask, p_lo, p_hi, rc


@triton.jit
def _store_rows(out_ptr, lse_ptr, acc, m_i, l_i, t, hq, rmask, d, dmask, so_t, so_h, sl_t):
    """Normalise and store one program's rows: out, and lse in natural-log units (-inf for a
    row with no visible key)."""
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) / 1.4426950408889634)
    tl.store(out_ptr + t[:, None].to(tl.int64) * so_t + hq[:, None] * so_h + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])
    tl.store(lse_ptr + t.to(tl.int64) * sl_t + hq, lse, mask=rmask)


@triton.jit(do_not_specialize=SPECIALIZE_NOT)
def _sparse_attn_kernel(
    q_ptr, k_ptr, v_ptr, bidx_ptr, btab_ptr, out_ptr, lse_ptr, po_ptr, plse_ptr, qoff_ptr,
    n_q, group, n_sel, n_keys_static, sink_tokens, window, scale_log2,
    sq_t, sq_h, sk_n, sk_h, sv_n, sv_h, sb_c, sb_h, so_t, so_h, sl_t, sel_chunk, far_k, far_v,
    NUM_SPLITS: tl.constexpr, HAS_TABLE: tl.constexpr, QOFF_PTR: tl.constexpr, HOST: tl.constexpr,
    BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    KV_FP8: tl.constexpr, PDL: tl.constexpr = False,
):
    dependent_launch(PDL)
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    q, t, hq, pos, rmask, d, dmask, p_lo, p_hi, rc = _program_queries(
        q_ptr, qoff_ptr, pid_m, h, n_q, group, n_keys_static, sq_t, sq_h, sel_chunk, QOFF_PTR, KV_FP8, D, BLOCK_D,
        BLOCK_M)
    # the tile list of this program: selected blocks, sink tiles, then window tiles
    n_sink_tiles = (sink_tokens + BLOCK - 1) // BLOCK
    win_first = tl.maximum(p_lo - window + 1, 0) // BLOCK
    n_win_tiles = p_hi // BLOCK - win_first + 1
    n_items = n_sel + n_sink_tiles + n_win_tiles
    per = (n_items + NUM_SPLITS - 1) // NUM_SPLITS
    bidx_ptr += rc.to(tl.int64) * sb_c
    i_lo = split * per
    i_hi = tl.minimum(i_lo + per, n_items)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    j_in = tl.arange(0, BLOCK)
    for item in range(i_lo, i_hi):
        is_sel = item < n_sel
        is_sink = (item >= n_sel) & (item < n_sel + n_sink_tiles)
        is_win = item >= n_sel + n_sink_tiles
        one = item + tl.arange(0, 1)
        chosen = tl.max(tl.load(bidx_ptr + h * sb_h + one, mask=one < n_sel, other=-1), axis=0).to(tl.int32)
        blk = tl.where(is_sel, chosen, tl.where(is_sink, item - n_sel, win_first + (item - n_sel - n_sink_tiles)))
        j = tl.maximum(blk, 0) * BLOCK + j_in  # logical key index
        j0 = tl.maximum(blk, 0) * BLOCK
        # A tile every row of this program sees whole needs no per-element mask: a selected block
        # before every row's window and past the sinks, or a window tile inside every row's window
        # and causal for all. Most tiles are such; the mask's compares and selects cost about as
        # much CUDA-core time per tile as the exponentials (prefill attention ran ~200 TFLOP/s).
        whole = (j0 >= sink_tokens) & (
            (is_sel & (blk >= 0) & (j0 + BLOCK - 1 <= p_lo - window))
            | (is_win & (j0 > p_hi - window) & (j0 + BLOCK - 1 <= p_lo))
        )
        koff = 0
        voff = 0
        if HAS_TABLE:
            phys = tl.load(btab_ptr + tl.maximum(blk, 0)).to(tl.int64)
            if HOST == 1:
                # a negative entry -1-r: the block is row-block r of the pinned host pool, read
                # in place over PCIe (far_k / far_v: element offsets of that pool from k / v)
                far = phys < 0
                phys = tl.where(far, -1 - phys, phys)
                koff = tl.where(far, far_k, 0)
                voff = tl.where(far, far_v, 0)
            elif HOST == 2:
                # a host block the staging kernel copied to the GPU: slot (chunk, head, pick)
                far = phys < 0
                phys = tl.where(far, (rc.to(tl.int64) * tl.num_programs(1) + h) * n_sel + item, phys)
                koff = tl.where(far, far_k, 0)
                voff = tl.where(far, far_v, 0)
            row = phys * BLOCK + j_in
        else:
            row = j.to(tl.int64)
        # rows past the last query are never written (or past the tensor): 0 * NaN would poison
        kv_mask = (j[:, None] <= p_hi) & dmask[None, :]
        k = tl.load(k_ptr + koff + row[:, None] * sk_n + h * sk_h + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + voff + row[:, None] * sv_n + h * sv_h + d[None, :], mask=kv_mask, other=0.0)
        if KV_FP8:
            k = k.to(tl.bfloat16)
            v = v.to(tl.bfloat16)
        s = tl.dot(q, tl.trans(k)) * scale_log2
        if whole == 0:
            causal = j[None, :] <= pos[:, None]
            in_sink = j[None, :] < sink_tokens
            in_win = j[None, :] > pos[:, None] - window
            # each key counted once: a selected block skips what the sinks and window already cover
            valid = causal & (
                (is_sel & (blk >= 0) & ~in_sink & ~in_win) | (is_sink & in_sink) | (is_win & in_win & ~in_sink)
            )
            s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # rows that have seen no key yet keep a finite reference point (avoids inf - inf)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if NUM_SPLITS == 1:
        _store_rows(out_ptr, lse_ptr, acc, m_i, l_i, t, hq, rmask, d, dmask, so_t, so_h, sl_t)
    else:
        # partials in base-2 log units, unnormalised accumulators divided by l
        empty = l_i == 0.0
        o = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        base = ((pid_m * tl.num_programs(1) + h) * NUM_SPLITS + split).to(tl.int64)
        tl.store(po_ptr + (base * BLOCK_M + tl.arange(0, BLOCK_M))[:, None] * BLOCK_D + d[None, :], o)
        tl.store(plse_ptr + base * BLOCK_M + tl.arange(0, BLOCK_M), lse2)


@triton.jit
def _softmax_update(s, v, m_i, l_i, acc, scale_log2):
    """One key tile of online softmax: s [M, N] raw q.k (masked entries -inf), v [N, D]."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale_log2)
    # rows that have seen no key yet keep a finite reference point (avoids inf - inf)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s * scale_log2 - m_ref[:, None])  # one FMA per score, not a multiply and a subtract
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _load_tile(ptr, rows, stride_n, col0, d, dmask, live, MASKED: tl.constexpr, FULL_D: tl.constexpr):
    offs = rows[:, None] * stride_n + col0 + d[None, :]
    if MASKED:
        x = tl.load(ptr + offs, mask=live[:, None] & dmask[None, :], other=0.0)
    elif FULL_D:
        x = tl.load(ptr + offs)
    else:
        x = tl.load(ptr + offs, mask=dmask[None, :], other=0.0)
    return x


@triton.jit
def _window_tiles(q, k_ptr, v_ptr, btab_ptr, lo, hi, h, m_i, l_i, acc, pos, p_hi, sink_tokens, window,
                  scale_log2, sk_n, sk_h, sv_n, sv_h, d, dmask,
                  BLOCK: tl.constexpr, HAS_TABLE: tl.constexpr, MASKED: tl.constexpr, KV_FP8: tl.constexpr,
                  FULL_D: tl.constexpr):
    """Window tiles lo..hi-1, contiguous in logical key order. Unmasked tiles are the ones
    every row of the program sees whole: no load mask, no score mask."""
    j_in = tl.arange(0, BLOCK)
    for blk in range(lo, hi):
        j = blk * BLOCK + j_in
        if HAS_TABLE:
            rows = tl.load(btab_ptr + blk).to(tl.int64) * BLOCK + j_in
        else:
            rows = j.to(tl.int64)
        live = j <= p_hi  # rows past the last query are never written: 0 * NaN would poison
        k = _load_tile(k_ptr, rows, sk_n, h * sk_h, d, dmask, live, MASKED, FULL_D)
        v = _load_tile(v_ptr, rows, sv_n, h * sv_h, d, dmask, live, MASKED, FULL_D)
        if KV_FP8:
            k = k.to(tl.bfloat16)
            v = v.to(tl.bfloat16)
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            jj = j[None, :]
            valid = (jj <= pos[:, None]) & (jj > pos[:, None] - window) & (jj >= sink_tokens)
            s = tl.where(valid, s, float("-inf"))
        m_i, l_i, acc = _softmax_update(s, v, m_i, l_i, acc, scale_log2)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=SPECIALIZE_NOT)
def _sparse_prefill_attn_kernel(
    q_ptr, k_ptr, v_ptr, bidx_ptr, btab_ptr, out_ptr, lse_ptr, qoff_ptr,
    n_q, group, n_sel, n_keys_static, sink_tokens, window, scale_log2,
    sq_t, sq_h, sk_n, sk_h, sv_n, sv_h, sb_c, sb_h, so_t, so_h, sl_t, sel_chunk, far_k, far_v,
    HAS_TABLE: tl.constexpr, QOFF_PTR: tl.constexpr, STAGED: tl.constexpr,
    BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, KV_FP8: tl.constexpr,
):
    """`_sparse_attn_kernel` without key splits, for prefill: the same keys, visited as three
    loops (routed blocks, sink tiles, window tiles) instead of one list with a per-item branch,
    and the window split into masked edges and an unmasked middle, so the middle loop is
    uniform (plain loads, no selects) and the compiler pipelines it."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    q, t, hq, pos, rmask, d, dmask, p_lo, p_hi, rc = _program_queries(
        q_ptr, qoff_ptr, pid_m, h, n_q, group, n_keys_static, sq_t, sq_h, sel_chunk, QOFF_PTR, KV_FP8, D, BLOCK_D,
        BLOCK_M)
    bidx_ptr += rc.to(tl.int64) * sb_c + h * sb_h

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # routed blocks: those before every row's window and past the sinks are read whole (scalar
    # index loads: a per-key gather of the pick, tried for two-block tiles, ran 30 % slower)
    j_in = tl.arange(0, BLOCK)
    for item in range(n_sel):
        blk = tl.load(bidx_ptr + item).to(tl.int32)
        j0 = tl.maximum(blk, 0) * BLOCK
        j = j0 + j_in
        if HAS_TABLE:
            phys = tl.load(btab_ptr + tl.maximum(blk, 0)).to(tl.int64)
            koff = 0
            voff = 0
            if STAGED:  # a host block the staging kernel copied to the GPU: slot (chunk, head, pick)
                far = phys < 0
                phys = tl.where(far, (rc.to(tl.int64) * tl.num_programs(1) + h) * n_sel + item, phys)
                koff = tl.where(far, far_k, 0)
                voff = tl.where(far, far_v, 0)
            rows = phys * BLOCK + j_in
        else:
            koff = 0
            voff = 0
            rows = j.to(tl.int64)
        live = j <= p_hi
        k = _load_tile(k_ptr + koff, rows, sk_n, h * sk_h, d, dmask, live, True, D == BLOCK_D)
        v = _load_tile(v_ptr + voff, rows, sv_n, h * sv_h, d, dmask, live, True, D == BLOCK_D)
        if KV_FP8:
            k = k.to(tl.bfloat16)
            v = v.to(tl.bfloat16)
        s = tl.dot(q, tl.trans(k))
        whole = (blk >= 0) & (j0 >= sink_tokens) & (j0 + BLOCK - 1 <= p_lo - window)
        if whole == 0:
            jj = j[None, :]
            # each key counted once: a routed block skips what the sinks and window cover
            valid = (blk >= 0) & (jj <= pos[:, None]) & (jj >= sink_tokens) & (jj <= pos[:, None] - window)
            s = tl.where(valid, s, float("-inf"))
        m_i, l_i, acc = _softmax_update(s, v, m_i, l_i, acc, scale_log2)
    # sink tiles: keys below sink_tokens, causal
    n_sink_tiles = (sink_tokens + BLOCK - 1) // BLOCK
    for blk in range(n_sink_tiles):
        j = blk * BLOCK + j_in
        if HAS_TABLE:
            rows = tl.load(btab_ptr + blk).to(tl.int64) * BLOCK + j_in
        else:
            rows = j.to(tl.int64)
        live = j <= p_hi
        k = _load_tile(k_ptr, rows, sk_n, h * sk_h, d, dmask, live, True, D == BLOCK_D)
        v = _load_tile(v_ptr, rows, sv_n, h * sv_h, d, dmask, live, True, D == BLOCK_D)
        if KV_FP8:
            k = k.to(tl.bfloat16)
            v = v.to(tl.bfloat16)
        s = tl.dot(q, tl.trans(k))
        valid = (j[None, :] <= pos[:, None]) & (j[None, :] < sink_tokens)
        s = tl.where(valid, s, float("-inf"))
        m_i, l_i, acc = _softmax_update(s, v, m_i, l_i, acc, scale_log2)
    # window tiles: masked lead (window edges differ per row, or sinks inside), unmasked
    # middle, masked tail (the causal diagonal)
    win_first = tl.maximum(p_lo - window + 1, 0) // BLOCK
    last = p_hi // BLOCK
    whole_from = (tl.maximum(p_hi - window + 1, sink_tokens) + BLOCK - 1) // BLOCK
    whole_to = (p_lo + 1) // BLOCK  # tiles below this end at or before every row's own position
    lead_end = tl.minimum(tl.maximum(whole_from, win_first), last + 1)
    mid_end = tl.maximum(tl.minimum(whole_to, last + 1), lead_end)
    m_i, l_i, acc = _window_tiles(q, k_ptr, v_ptr, btab_ptr, win_first, lead_end, h, m_i, l_i, acc, pos, p_hi,
                                  sink_tokens, window, scale_log2, sk_n, sk_h, sv_n, sv_h, d, dmask,
                                  BLOCK, HAS_TABLE, True, KV_FP8, D == BLOCK_D)
    m_i, l_i, acc = _window_tiles(q, k_ptr, v_ptr, btab_ptr, lead_end, mid_end, h, m_i, l_i, acc, pos, p_hi,
                                  sink_tokens, window, scale_log2, sk_n, sk_h, sv_n, sv_h, d, dmask,
                                  BLOCK, HAS_TABLE, False, KV_FP8, D == BLOCK_D)
    m_i, l_i, acc = _window_tiles(q, k_ptr, v_ptr, btab_ptr, mid_end, last + 1, h, m_i, l_i, acc, pos, p_hi,
                                  sink_tokens, window, scale_log2, sk_n, sk_h, sv_n, sv_h, d, dmask,
                                  BLOCK, HAS_TABLE, True, KV_FP8, D == BLOCK_D)
    _store_rows(out_ptr, lse_ptr, acc, m_i, l_i, t, hq, rmask, d, dmask, so_t, so_h, sl_t)


@triton.jit
def _merge_splits_kernel(
    po_ptr, plse_ptr, out_ptr, lse_ptr, group, so_t, so_h, sl_t, n_heads,
    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, PDL: tl.constexpr = False,
):
    dependent_launch(PDL)
    # One program per (query row, kv head), all splits in one load: the merge is latency-bound
    # (a decode step has 4 rows per head), so one round trip beats a loop over the splits.
    r = tl.program_id(0)
    h = tl.program_id(1)
    pid_m = r // BLOCK_M
    rr = r % BLOCK_M
    sp = tl.arange(0, SPLITS_P2)
    smask = sp < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    row = (((pid_m * n_heads + h) * NUM_SPLITS + sp).to(tl.int64) * BLOCK_M + rr)
    part_lse = tl.load(plse_ptr + row, mask=smask, other=float("-inf"))
    m = tl.max(part_lse, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(part_lse - m_ref)
    tot = tl.sum(w, axis=0)
    parts = tl.load(po_ptr + row[:, None] * BLOCK_D + d[None, :], mask=smask[:, None], other=0.0)
    acc = tl.sum(w[:, None] * parts, axis=0)
    empty = tot == 0.0
    o = acc / tl.where(empty, 1.0, tot)
    lse = tl.where(empty, float("-inf"), (m_ref + tl.log2(tl.where(empty, 1.0, tot))) / 1.4426950408889634)
    t = r // group
    hq = h * group + r % group
    tl.store(out_ptr + t.to(tl.int64) * so_t + hq * so_h + d, o.to(out_ptr.dtype.element_ty), mask=d < D)
    tl.store(lse_ptr + t.to(tl.int64) * sl_t + hq, lse)


@triton.jit
def _stage_far_blocks_kernel(
    bidx_ptr, btab_ptr, hk_ptr, hv_ptr, sk_ptr, sv_ptr, n_sel, sb_c, sb_h, s_n, s_h,
    BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Copy the head-h slice of every selected block that lives in the host pool (table entry
    < 0) to staging slot (c, h, pick) on the GPU; other picks copy nothing."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.program_id(2)
    blk = tl.load(bidx_ptr + c.to(tl.int64) * sb_c + h * sb_h + i)
    phys = tl.load(btab_ptr + tl.maximum(blk, 0)).to(tl.int64)
    far = (blk >= 0) & (phys < 0)
    r = tl.arange(0, BLOCK)
    d = tl.arange(0, BLOCK_D)
    m = (r[:, None] < tl.where(far, BLOCK, 0)) & (d[None, :] < D)  # all rows or none
    src = ((-1 - phys) * BLOCK + r)[:, None] * s_n + h * s_h + d[None, :]
    slot = (c.to(tl.int64) * tl.num_programs(1) + h) * n_sel + i
    dst = (slot * BLOCK + r)[:, None] * s_n + h * s_h + d[None, :]
    tl.store(sk_ptr + dst, tl.load(hk_ptr + src, mask=m), mask=m)
    tl.store(sv_ptr + dst, tl.load(hv_ptr + src, mask=m), mask=m)


def staging_rows(n_chunks: int, kv_heads: int, top_k: int, block_size: int) -> int:
    """Rows of the staging buffers `fused_sparse_attention(..., staging=...)` needs."""
    return n_chunks * kv_heads * top_k * block_size


def _far_offset(base: torch.Tensor, other: torch.Tensor) -> int:
    """Element offset of `other`'s data from `base`'s: a kernel given `base` reaches `other`
    (pinned host memory is one address space with the GPU's under UVA)."""
    if other.dtype != base.dtype or other.stride() != base.stride():
        raise ValueError("far pools must match the GPU pool's dtype and strides")
    delta = other.data_ptr() - base.data_ptr()
    if delta % base.element_size():
        raise ValueError("far pool is not element-aligned with the GPU pool")
    return delta // base.element_size()


def fused_sparse_attention(
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
    """Exact attention over sinks ∪ selected blocks ∪ local window (see `naive_sparse_attention`).

    Tiered KV (engine/gpu/tiering.py): with `block_table` and `host=(hk, hv)` (pinned CPU pools,
    the GPU pool's strides), a negative table entry -1-r puts the block at row-block r of the
    host pool. Without `staging` the kernel reads such blocks in place over PCIe (decode: each
    selected block is read once). With `staging=(sk, sv)` (GPU, `staging_rows` rows) a first
    kernel copies the head slices of the selected host blocks to the GPU and the attention
    reads them there (prefill: many query tiles read each selected block; host reads are not
    cached). Sinks and window tiles must map to the GPU pool.

    block_idx may also be [C, Hkv, K]: one selection per routing chunk of ceil(T/C) queries
    (or of `route_chunk` queries, the last chunk shorter), so a long prefill chunk with several
    routing chunks is one launch.

    q [T, Hq, D] at absolute indices q_offset..q_offset+T-1 (already rotated); k, v [N, Hkv, D]
    time-major (bf16/fp16/fp32, or float8_e4m3fn read as bf16); block_idx [Hkv, K] int of
    selected block ids, -1 = unused. `q_offset` may be an int or a 1-element int device tensor
    (then nothing here reads it on the host, for CUDA graphs). With `block_table` [NB] int,
    k and v are a paged pool: logical block b lives in rows block_table[b]*block_size + (0..B-1).
    `num_splits` > 1 splits each kv head's key tiles across programs (flash-decoding) and
    merges the parts exactly; the default picks it from T. Returns out [T, Hq, D] in q's dtype
    (or fills `out`) and lse [T, Hq] fp32 (natural log; -inf for a query with no visible key).
    """
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"expected q [T,Hq,D], k=v [N,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    t, hq, d = q.shape
    hkv = k.shape[1]
    if k.shape[2] != d or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match k {tuple(k.shape)}")
    if block_idx.dim() == 2:
        block_idx = block_idx[None]
    if block_idx.dim() != 3 or block_idx.shape[1] != hkv:
        raise ValueError(f"block_idx must be [Hkv={hkv}, K] or [C, Hkv, K]; got {tuple(block_idx.shape)}")
    if block_size & (block_size - 1) or block_size < 16:
        raise ValueError("block_size must be a power of two >= 16")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q, k, v must be contiguous in their last dimension")
    if interpreting() and q.dtype != torch.float32:
        # the interpreter's bf16 matrix products are unreliable; the CUDA tests cover bf16
        f = lambda pair: None if pair is None else tuple(x.float() for x in pair)
        o, l = fused_sparse_attention(
            q.float(), k.float(), v.float(), q_offset, block_idx, block_size, sink_tokens, window, scale,
            block_table=block_table, num_splits=num_splits, route_chunk=route_chunk, host=f(host), staging=f(staging))
        out = o.to(q.dtype) if out is None else out.copy_(o)
        return out, (l if lse is None else lse.copy_(l))
    g = hq // hkv
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    block_idx = block_idx if block_idx.stride(-1) == 1 else block_idx.contiguous()
    # [C, Hkv, K]: routing chunk c = queries c*ceil(T/C) .. (c+1)*ceil(T/C)-1 share block_idx[c]
    if out is None:
        out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(t, hq, dtype=torch.float32, device=q.device)
    if t == 0:
        return out, lse
    rows = t * g
    # Tiles from the shape: 128-row query tiles only for long bf16/fp16 chunks. A 128-row tile of
    # fp32 queries at D=128 with three stages of fp32 K/V tiles needs 288 KiB of shared memory
    # (the H200 has 227 KiB per block): fp32 caches take 64-row tiles and two stages.
    wide = k.element_size() <= 2 or d <= 64
    block_m = 16 if rows <= 16 else (32 if rows <= 32 else (PREFILL_BLOCK_M if rows >= 4096 and wide else 64))
    n_m = triton.cdiv(rows, block_m)
    if num_splits is None and n_m * hkv >= 64:
        num_splits = 1
    elif num_splits is None:  # a power of two: each value is a compiled variant
        num_splits = 1 << (max(1, min(MAX_SPLITS, DECODE_PROGRAMS // (n_m * hkv))).bit_length() - 1)
    block_d = triton.next_power_of_2(d)
    qoff_is_tensor = isinstance(q_offset, torch.Tensor)
    n_c = block_idx.shape[0]
    if route_chunk is not None and n_c != triton.cdiv(t, route_chunk):
        raise ValueError(f"{n_c} selections do not cover {t} queries in routing chunks of {route_chunk}")
    sel_chunk = (route_chunk or max(1, triton.cdiv(t, n_c))) if n_c > 1 else 1 << 30
    if n_c > 1 and (block_m % g or sel_chunk % (block_m // g)):
        # a GQA group that does not divide a power-of-two tile (SmolLM2: 3 query heads per kv head):
        # one launch per routing chunk
        step = sel_chunk if route_chunk is not None else triton.cdiv(t, n_c)
        for c in range(n_c):
            a, b = c * step, min(t, (c + 1) * step)
            qo = q_offset + a
            fused_sparse_attention(q[a:b], k, v, qo, block_idx[c], block_size, sink_tokens, window, scale,
                                   block_table=block_table, out=out[a:b], lse=lse[a:b], host=host, staging=staging)
        return out, lse
    qoff_t = q_offset if qoff_is_tensor else block_idx  # any pointer; unused
    qoff_int = 0 if qoff_is_tensor else int(q_offset)
    fp8 = k.dtype == torch.float8_e4m3fn
    if fp8 and q.dtype != torch.bfloat16:
        raise ValueError("fp8 KV needs bf16 queries")
    if num_splits > 1:
        po = torch.empty(n_m * hkv * num_splits * block_m, block_d, dtype=torch.float32, device=q.device)
        plse = torch.empty(n_m * hkv * num_splits * block_m, dtype=torch.float32, device=q.device)
    else:
        po = plse = lse
    table = block_table if block_table is not None else block_idx
    host_mode, far_k, far_v = 0, 0, 0
    if host is not None:
        if block_table is None:
            raise ValueError("a host pool needs a block table")
        hk, hv = host
        if staging is None:
            host_mode, far_k, far_v = 1, _far_offset(k, hk), _far_offset(v, hv)
        else:
            sk, sv = staging
            n_sel = block_idx.shape[2]
            if sk.shape[0] < staging_rows(n_c, hkv, n_sel, block_size) or sv.shape != sk.shape:
                raise ValueError("staging buffers too small")
            _stage_far_blocks_kernel[(n_c, hkv, n_sel)](
                block_idx, block_table, hk, hv, sk, sv, n_sel, block_idx.stride(0), block_idx.stride(1),
                hk.stride(0), hk.stride(1), BLOCK=block_size, D=d, BLOCK_D=triton.next_power_of_2(d), num_warps=4)
            host_mode, far_k, far_v = 2, _far_offset(k, sk), _far_offset(v, sv)
    # prefill (no key splits, no in-place host reads) through the three-loop kernel
    if num_splits == 1 and host_mode != 1:
        launch = dict(PREFILL_LAUNCH) if block_m == PREFILL_BLOCK_M else {"num_warps": 4, "num_stages": 2}
        _sparse_prefill_attn_kernel[(n_m, hkv)](
            q, k, v, block_idx, table, out, lse, qoff_t,
            t, g, block_idx.shape[2], qoff_int, sink_tokens, window, scale * LOG2E,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            block_idx.stride(0), block_idx.stride(1), out.stride(0), out.stride(1), lse.stride(0), sel_chunk,
            far_k, far_v, HAS_TABLE=block_table is not None, QOFF_PTR=qoff_is_tensor, STAGED=host_mode == 2,
            BLOCK=block_size, D=d, BLOCK_D=block_d, BLOCK_M=block_m, KV_FP8=fp8, **launch,
        )
        return out, lse
    _sparse_attn_kernel[(n_m, hkv, num_splits)](
        q, k, v, block_idx, table, out, lse, po, plse, qoff_t,
        t, g, block_idx.shape[2], qoff_int, sink_tokens, window, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        block_idx.stride(0), block_idx.stride(1), out.stride(0), out.stride(1), lse.stride(0), sel_chunk, far_k, far_v,
        NUM_SPLITS=num_splits, HAS_TABLE=block_table is not None, QOFF_PTR=qoff_is_tensor, HOST=host_mode,
        BLOCK=block_size, D=d, BLOCK_D=block_d, BLOCK_M=block_m, KV_FP8=fp8,
        num_warps=8 if block_m == 128 else 4, num_stages=2, **pdl_args(),
    )
    if num_splits > 1:
        _merge_splits_kernel[(rows, hkv)](
            po, plse, out, lse, g, out.stride(0), out.stride(1), lse.stride(0), hkv,
            NUM_SPLITS=num_splits, SPLITS_P2=triton.next_power_of_2(num_splits), D=d, BLOCK_D=block_d,
            BLOCK_M=block_m, num_warps=1 if block_d <= 128 else 2, **pdl_args(),
        )
    return out, lse


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset, scale: float | None = None, **kw
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense causal attention (see `naive_attention`): the sparse kernel with no sinks, no
    routed blocks and a window wider than any context."""
    idx = torch.full((k.shape[1], 1), -1, dtype=torch.long, device=q.device)  # no empty pointer
    return fused_sparse_attention(q, k, v, q_offset, idx, 64, 0, 1 << 30, scale, **kw)

