"""Triton routed (block-sparse) MLA attention on the latent cache: sinks + top-k blocks + window.

The engine's sparse settings (engine/settings.py; the Llama path's kernels/attention) for MLA
models without an indexer (GLM-4.7-Flash). The cached latent [R + P] (normalised latent and
roped shared key) is the one key head of all H query heads, its first R dims the values, so
the absorbed queries q [T, H, R + P] route and attend on it directly (references in naive.py):

- `store_latent_descriptors` / `fused_latent_append`: per block of the cache, min / max / mean
  of the stored latents (prefill: the chunk's blocks recomputed from the cache; decode: the
  row appended and its block's descriptors recomputed; each one launch, graph-capturable).
- `fused_mla_block_scores`: each routing chunk's score of every block, the max over its
  queries and heads of q.kmean (or the minmax bound), with the chunk's non-candidates at -inf.
  The R + P dims are summed in 64-wide slices (576 = 9 x 64, no padding to 1024); a chunk's
  rows may be split over programs (partial maxima, merged after) so early chunks, with few
  blocks, still fill the GPU.
- `fused_mla_routed_attention`: prefill. A program owns BLOCK_M (query, head) rows of one
  routing chunk, loads their queries once and walks key tiles: the sinks, the chunk's
  selected blocks (keys outside each row's window), then the window range of its rows
  (causal). A key is in exactly one of the three sets, so the result is exact softmax
  attention over their union; with every candidate selected it is dense causal attention.
- `fused_mla_routed_attention_expanded`: prefill on keys and values expanded per head from
  the latent rows the call reads (long calls; below).
- decode attention is kernels/mla_decode's split-K kernel over the same three sets
  (`fused_mla_decode(..., routed=...)`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import interpreting

LOG2E = 1.4426950408889634
SCORE_PROGRAMS = 4 if interpreting() else 264  # block scoring aims at 2 programs per SM of the H200

# prefill attention: BLOCK_M (query, head) rows x a [BLOCK_N, R + P] key tile; at R = 512 the
# fp32 accumulator [BLOCK_M, 512] is what limits the tile, so a few shapes are tried once
# (each compiles in seconds at R = 512, inside the first prefill of a process). As (BLOCK_M,
# BLOCK_N, num_warps, num_stages); tests run each at the real head dims. On the H200 at
# GLM-4.7-Flash's dims (`bench/gpu_glm.py --parts attention`) these three ran at 150-190
# TFLOP/s; 128 rows (48), a 128-key tile (105) and a third stage (170) did not help, nor
# did rescaling the accumulator only when a row's max grows by 2^8 (FlashAttention-4's trick).
ATTN_TILES = ((64, 64, 8, 2), (32, 64, 4, 2), (64, 32, 8, 2))
_ATTN_CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4)] if interpreting() else [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=st) for bm, bn, nw, st in ATTN_TILES]


# --- descriptors --------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["b0", "end"])
def _latent_blocks_kernel(kv_ptr, kmin_ptr, kmax_ptr, kmean_ptr, b0, end, skv, sd, W, bsz, BLOCK_W: tl.constexpr,
                          BLOCK_B: tl.constexpr):
    blk = b0 + tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    cm = cols < W
    rows = blk * bsz + tl.arange(0, BLOCK_B)
    valid = (tl.arange(0, BLOCK_B) < bsz) & (rows < end)
    m = valid[:, None] & cm[None, :]
    x = tl.load(kv_ptr + rows.to(tl.int64)[:, None] * skv + cols[None, :], mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / tl.sum(valid.to(tl.float32), axis=0)
    lo = tl.min(tl.where(m, x, float("inf")), axis=0)
    hi = tl.max(tl.where(m, x, float("-inf")), axis=0)
    d = blk.to(tl.int64) * sd + cols
    tl.store(kmean_ptr + d, mean.to(kmean_ptr.dtype.element_ty), mask=cm)
    tl.store(kmin_ptr + d, lo.to(kmin_ptr.dtype.element_ty), mask=cm)
    tl.store(kmax_ptr + d, hi.to(kmax_ptr.dtype.element_ty), mask=cm)


def store_latent_descriptors(latents: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor,
                             start: int, end: int, block_size: int) -> None:
    """Recompute the descriptors of the blocks holding positions start..end-1 from the stored
    latents [S, W] (rows < end; S a multiple of block_size), one launch. Prefill, after the
    chunk's latents are stored: a partial block's earlier rows are re-read, so this continues
    any prefix."""
    b0, b1 = start // block_size, -(-end // block_size)
    w = latents.shape[1]
    if latents.stride(1) != 1 or kmean.stride(1) != 1 or kmin.stride() != kmean.stride() \
            or kmax.stride() != kmean.stride() or kmean.shape[1] != w:
        raise ValueError(f"shapes do not fit: latents {tuple(latents.shape)}, descriptors {tuple(kmean.shape)}")
    if b1 > b0:
        block_w = 64
        _latent_blocks_kernel[(b1 - b0, triton.cdiv(w, block_w))](
            latents, kmin, kmax, kmean, b0, end, latents.stride(0), kmean.stride(0), w, block_size,
            BLOCK_W=block_w, BLOCK_B=triton.next_power_of_2(block_size), num_warps=4)


@triton.jit
def _latent_append_kernel(row_ptr, kv_ptr, kmin_ptr, kmax_ptr, kmean_ptr, pos_ptr, skv, sd, W, bsz,
                          BLOCK_W: tl.constexpr, BLOCK_B: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    cm = cols < W
    p = tl.load(pos_ptr).to(tl.int64)
    new = tl.load(row_ptr + cols, mask=cm, other=0.0)
    tl.store(kv_ptr + p * skv + cols, new, mask=cm)
    b0 = (p // bsz) * bsz
    rows = b0 + tl.arange(0, BLOCK_B)
    before = rows < p  # the block's rows stored before this one (row p is `new`, in registers)
    lm = before[:, None] & cm[None, :]
    x = tl.load(kv_ptr + rows[:, None] * skv + cols[None, :], mask=lm, other=0.0).to(tl.float32)
    nf = new.to(tl.float32)
    mean = (tl.sum(x, axis=0) + nf) / (p - b0 + 1).to(tl.float32)
    lo = tl.minimum(tl.min(tl.where(lm, x, float("inf")), axis=0), nf)
    hi = tl.maximum(tl.max(tl.where(lm, x, float("-inf")), axis=0), nf)
    d = (p // bsz) * sd + cols
    tl.store(kmean_ptr + d, mean.to(kmean_ptr.dtype.element_ty), mask=cm)
    tl.store(kmin_ptr + d, lo.to(kmin_ptr.dtype.element_ty), mask=cm)
    tl.store(kmax_ptr + d, hi.to(kmax_ptr.dtype.element_ty), mask=cm)


def fused_latent_append(row: torch.Tensor, latents: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                        kmean: torch.Tensor, pos: torch.Tensor, block_size: int) -> None:
    """Decode: store row [1, W] at position pos ([1] device int) of latents [S, W] and recompute
    that block's descriptors [NB, W] over its rows 0..pos (as `store_latent_descriptors`)."""
    w = latents.shape[1]
    if row.shape != (1, w) or latents.stride(1) != 1 or kmean.stride(1) != 1 or kmin.stride() != kmean.stride():
        raise ValueError(f"shapes do not fit: row {tuple(row.shape)}, latents {tuple(latents.shape)}")
    row = row.contiguous()
    block_w = 64
    _latent_append_kernel[(triton.cdiv(w, block_w),)](
        row, latents, kmin, kmax, kmean, pos, latents.stride(0), kmean.stride(0), w, block_size,
        BLOCK_W=block_w, BLOCK_B=triton.next_power_of_2(block_size), num_warps=4)


# --- block scores -------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n_rows", "rows_per_chunk", "chunk", "n_q", "n_blocks", "first", "q0", "n_split"])
def _latent_scores_kernel(q_ptr, kmin_ptr, kmax_ptr, kmean_ptr, out_ptr, end_ptr, n_rows, rows_per_chunk, chunk,
                          n_q, n_blocks, first, q0, win, bsz, n_split, sq, sd, so_s, so_c,
                          W: tl.constexpr, BLOCK_D: tl.constexpr, MINMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, HAS_END: tl.constexpr, IEEE: tl.constexpr):
    nb = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.program_id(1)
    sp = tl.program_id(2)
    bmask = nb < n_blocks
    row_lo = c * rows_per_chunk
    row_hi = tl.minimum(row_lo + rows_per_chunk, n_rows)
    per = tl.cdiv(tl.cdiv(row_hi - row_lo, BLOCK_M), n_split) * BLOCK_M
    r_lo = row_lo + sp * per
    r_hi = tl.minimum(r_lo + per, row_hi)
    best = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
    for r0 in range(r_lo, r_hi, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        rmask = rows < r_hi
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        # a loop, not unrolled: unrolled, the pipeliner keeps every step's tiles of a query tile
        # in shared memory at once (576 KB at W = 576, prefill; the H200 has 227 KB)
        for d0 in range(0, W, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            dm = d < W
            x = tl.load(q_ptr + rows[:, None].to(tl.int64) * sq + d[None, :], mask=rmask[:, None] & dm[None, :],
                        other=0.0)
            dptr = nb[:, None].to(tl.int64) * sd + d[None, :]
            lm = bmask[:, None] & dm[None, :]
            if MINMAX:
                # max(x lo, x hi) summed over d == relu(x).hi + min(x, 0).lo
                hi = tl.load(kmax_ptr + dptr, mask=lm, other=0.0)
                lo = tl.load(kmin_ptr + dptr, mask=lm, other=0.0)
                xp = tl.maximum(x, 0.0).to(hi.dtype)
                xn = tl.minimum(x, 0.0).to(hi.dtype)
                if IEEE:
                    hi, lo = hi.to(tl.float32), lo.to(tl.float32)
                    xp, xn = xp.to(tl.float32), xn.to(tl.float32)
                    s += tl.dot(xp, tl.trans(hi), input_precision="ieee") + \
                        tl.dot(xn, tl.trans(lo), input_precision="ieee")
                else:
                    s += tl.dot(xp, tl.trans(hi)) + tl.dot(xn, tl.trans(lo))
            else:
                mean = tl.load(kmean_ptr + dptr, mask=lm, other=0.0)
                if IEEE:
                    s += tl.dot(x.to(tl.float32), tl.trans(mean.to(tl.float32)), input_precision="ieee")
                else:
                    s += tl.dot(x.to(mean.dtype), tl.trans(mean))
        best = tl.maximum(best, tl.where(rmask[:, None], s, float("-inf")))
    top = tl.max(best, axis=0)
    if HAS_END:  # decode: candidates first .. end-1, end on the device
        end = tl.load(end_ptr)
    else:  # prefill: end = the first block the window of the chunk's last query covers
        last = tl.minimum((c + 1) * chunk, n_q) - 1 + q0
        end = tl.maximum((last - win + bsz) // bsz, 0)
    top = tl.where((nb >= first) & (nb < end), top, float("-inf"))
    tl.store(out_ptr + sp * so_s + c * so_c + nb, top, mask=bmask)


def fused_mla_block_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor,
                           method: str, chunk: int, q0: int, first: int, window: int, block_size: int,
                           *, end: torch.Tensor | None = None) -> torch.Tensor:
    """As `naive_mla_block_scores`: q [T, H, W] at positions q0.., descriptors [NB, W] -> [C, NB]
    fp32 per routing chunk of `chunk` queries. With `end` ([1] device int; decode, T = 1) the
    candidates are first .. end-1 instead (no host value of the position needed)."""
    if method not in ("minmax", "mean"):
        raise ValueError(f"unknown block score method {method!r} (minmax, mean)")
    t, h, w = q.shape
    nb = kmean.shape[0]
    if kmean.shape[1] != w or kmin.shape != kmean.shape or kmax.shape != kmean.shape or kmean.stride(1) != 1 \
            or kmin.stride() != kmean.stride() or kmax.stride() != kmean.stride():
        raise ValueError(f"q {tuple(q.shape)} does not match descriptors {tuple(kmean.shape)}")
    q = q.contiguous()
    n_c = max(1, triton.cdiv(t, chunk))
    decode = t * h <= 64
    block_m, block_n = (32, 64) if decode else (128, 128)
    if interpreting():
        block_m, block_n = 32, 16
    tiles = triton.cdiv(nb, block_n) * n_c
    rows = min(chunk, t) * h
    split = max(1, min(triton.cdiv(rows, block_m), triton.cdiv(SCORE_PROGRAMS, tiles)))
    out = torch.empty(split, n_c, nb, dtype=torch.float32, device=q.device)
    if nb and t:
        _latent_scores_kernel[(triton.cdiv(nb, block_n), n_c, split)](
            q, kmin, kmax, kmean, out, end if end is not None else out, t * h, chunk * h, chunk, t, nb, first, q0,
            window, block_size, split, w, kmean.stride(0), out.stride(0), out.stride(1), W=w,
            BLOCK_D=min(64, max(16, triton.next_power_of_2(w))), MINMAX=method == "minmax", BLOCK_M=block_m,
            BLOCK_N=block_n, HAS_END=end is not None, IEEE=q.dtype == torch.float32 or interpreting(),
            num_warps=4 if decode else 8, num_stages=2 if decode else 3)
    else:
        out.fill_(float("-inf"))
    return out[0] if split == 1 else out.amax(0)


# --- prefill attention --------------------------------------------------------------------------
@triton.jit
def _softmax_step(s, vis, qk_scale, m_i, l_i):
    """Online softmax (base 2) over one key tile's scores s [BLOCK_M, BLOCK_N], the keys each row
    sees in vis: -> (new row max, new row sum, the factor the accumulator is rescaled by, the
    tile's probabilities unnormalised)."""
    s = tl.where(vis, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), alpha, p


@triton.jit
def _attend_tile(q1, q2, kv_ptr, keys, live, vis, skv, m_i, l_i, acc, qk_scale, R: tl.constexpr, P: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, IEEE: tl.constexpr):
    """One key tile of online softmax (base 2): keys [BLOCK_N] (rows of the latent cache, `live`
    ones loaded), vis [BLOCK_M, BLOCK_N] which of them each query row sees. IEEE: fp32 operands
    and dots (fp32 inputs; and bf16 under the interpreter, whose bf16 dots are not exact)."""
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    base = kv_ptr + tl.where(live, keys, 0).to(tl.int64)[:, None] * skv
    k1 = tl.load(base + offs_r[None, :], mask=live[:, None] & (offs_r[None, :] < R), other=0.0)
    k2 = tl.load(base + R + offs_p[None, :], mask=live[:, None] & (offs_p[None, :] < P), other=0.0)
    if IEEE:
        k1, k2 = k1.to(tl.float32), k2.to(tl.float32)
        s = tl.dot(q1, tl.trans(k1), input_precision="ieee") + tl.dot(q2, tl.trans(k2), input_precision="ieee")
    else:
        s = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
    m_new, l_i, alpha, p = _softmax_step(s, vis, qk_scale, m_i, l_i)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, k1, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(k1.dtype), k1)
    return m_new, l_i, acc


@triton.autotune(configs=_ATTN_CONFIGS, key=["H", "R", "P", "IEEE"], cache_results=True)
@triton.jit(do_not_specialize=["n_q", "q0", "chunk", "n_blk", "sinks", "win"])
def _routed_prefill_kernel(q_ptr, kv_ptr, blk_ptr, o_ptr, n_q, q0, chunk, n_blk, sinks, win, bsz, H, qk_scale,
                           sq, skv, sb, so, R: tl.constexpr, P: tl.constexpr, BLOCK_R: tl.constexpr,
                           BLOCK_P: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    c = tl.program_id(0)
    t_lo = c * chunk
    t_hi = tl.minimum(t_lo + chunk, n_q)
    r0 = t_lo * H + tl.program_id(1) * BLOCK_M
    r_end = tl.minimum(r0 + BLOCK_M, t_hi * H)  # rows of this program: (query, head) pairs
    rows = r0 + tl.arange(0, BLOCK_M)
    rmask = rows < r_end
    rows = tl.minimum(rows, t_hi * H - 1)
    pos = q0 + rows // H  # each row's absolute position
    p_lo = q0 + r0 // H
    p_hi = q0 + (r_end - 1) // H
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    q_row = q_ptr + rows.to(tl.int64)[:, None] * sq
    q1 = tl.load(q_row + offs_r[None, :], mask=offs_r[None, :] < R, other=0.0)
    q2 = tl.load(q_row + R + offs_p[None, :], mask=offs_p[None, :] < P, other=0.0)
    if IEEE:
        q1, q2 = q1.to(tl.float32), q2.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    # A key past the program's last query is never seen, and its row may not be stored (the last
    # block of the cache is partial): it is not loaded either. Loaded, a row of inf / NaN there
    # would make 0 * NaN in the probabilities' product with the values (rows of nothing seen).
    k_end = p_hi + 1
    # sinks: keys 0 .. sinks-1 (causal)
    s_end = tl.minimum(sinks, k_end)
    for k0 in range(0, s_end, BLOCK_N):
        keys = k0 + tl.arange(0, BLOCK_N)
        live = keys < s_end
        vis = live[None, :] & (keys[None, :] <= pos[:, None])
        m_i, l_i, acc = _attend_tile(q1, q2, kv_ptr, keys, live, vis, skv, m_i, l_i, acc, qk_scale, R, P, BLOCK_R,
                                     BLOCK_P, IEEE)
    # the routing chunk's blocks: their keys outside each row's window and past the sinks. Each
    # block's range is clipped to the keys some row of the program sees (at or past the sinks, at
    # or before p_hi - win), so a block inside every row's window costs no tile.
    k_far = tl.minimum(p_hi - win + 1, k_end)
    for j in range(0, n_blk):
        # int32 like the other loops' bounds: the compiler refuses a loop variable whose type
        # changes between loops (the block ids are int64)
        b = tl.load(blk_ptr + c * sb + j).to(tl.int32)
        start = tl.maximum(tl.maximum(b, 0) * bsz, sinks)
        stop = tl.where(b >= 0, tl.minimum(tl.maximum(b, 0) * bsz + bsz, k_far), start)
        for kb in range(start, stop, BLOCK_N):
            keys = kb + tl.arange(0, BLOCK_N)
            live = keys < stop
            vis = live[None, :] & (keys[None, :] <= pos[:, None] - win)
            m_i, l_i, acc = _attend_tile(q1, q2, kv_ptr, keys, live, vis, skv, m_i, l_i, acc, qk_scale, R, P,
                                         BLOCK_R, BLOCK_P, IEEE)
    # the window: keys pos - win + 1 .. pos of each row (none below the sinks)
    w_lo = tl.maximum(sinks, p_lo - win + 1)
    for k0 in range(w_lo, p_hi + 1, BLOCK_N):
        keys = k0 + tl.arange(0, BLOCK_N)
        live = keys <= p_hi
        vis = live[None, :] & (keys[None, :] > pos[:, None] - win) & (keys[None, :] <= pos[:, None])
        m_i, l_i, acc = _attend_tile(q1, q2, kv_ptr, keys, live, vis, skv, m_i, l_i, acc, qk_scale, R, P, BLOCK_R,
                                     BLOCK_P, IEEE)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + rows.to(tl.int64)[:, None] * so + offs_r[None, :], out.to(o_ptr.dtype.element_ty),
             mask=rmask[:, None] & (offs_r[None, :] < R))


def fused_mla_routed_attention(q: torch.Tensor, latents: torch.Tensor, q0: int, blocks: torch.Tensor, chunk: int,
                               block_size: int, sinks: int, window: int, r: int, scale: float,
                               out: torch.Tensor | None = None, *, tile: tuple | None = None) -> torch.Tensor:
    """As `naive_mla_routed_attention`: q [T, H, R + P] at positions q0.., latents [S, R + P]
    (rows 0..q0+T-1 stored), blocks [C, K] per routing chunk of `chunk` queries (-1 = none) ->
    [T, H, R] in q's dtype (written into `out` when given, a contiguous [T, H, R]). `tile`, one
    of ATTN_TILES, runs that config instead of the autotuner's choice (tests check each one)."""
    t, h, width = q.shape
    if latents.shape[-1] != width or not 0 < r < width or latents.stride(1) != 1:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, latents {tuple(latents.shape)}, r={r}")
    n_c = max(1, triton.cdiv(t, chunk))
    if blocks.dim() != 2 or blocks.shape[0] != n_c:
        raise ValueError(f"blocks must be [{n_c}, K], got {tuple(blocks.shape)}")
    q = q.contiguous()
    blocks = blocks.contiguous()
    if out is None:
        out = torch.empty(t, h, r, dtype=q.dtype, device=q.device)
    if not out.is_contiguous() or out.shape != (t, h, r):
        raise ValueError(f"out must be a contiguous [{t}, {h}, {r}] tensor")
    if t:
        rows = min(chunk, t) * h
        grid = lambda meta: (n_c, triton.cdiv(rows, meta["BLOCK_M"]))
        kernel, config = _routed_prefill_kernel, {}
        if tile is not None:
            bm, bn, nw, st = tile
            kernel, config = kernel.fn, dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=st)
        kernel[grid](
            q, latents, blocks, out, t, q0, chunk, blocks.shape[1], sinks, window, block_size, h, scale * LOG2E,
            width, latents.stride(0), blocks.stride(0), r, R=r, P=width - r,
            BLOCK_R=max(16, triton.next_power_of_2(r)), BLOCK_P=max(16, triton.next_power_of_2(width - r)),
            IEEE=q.dtype == torch.float32 or interpreting(), **config)
    return out


# --- prefill attention on keys and values expanded per head ------------------------------------
# The absorbed form costs (R + P) + R = 1,088 multiply-adds per (query, head, key) at
# GLM-4.7-Flash's dims; the model's own form, keys [c W_UK^T | k_rot] and values c W_UV^T per
# head, (N + P) + V = 512. A long prefill chunk's queries far outnumber the distinct keys they
# read (4,096 queries, ~13K keys at 128K), so expanding those keys once (one GEMM, cuBLAS) and
# attending head by head halves the attention kernel's work; DeepSeek's and vLLM's MLA prefill
# do the same. Short calls (a question after a cached document) stay absorbed: there the
# expansion would cost more than it saves (`GlmCudaDecoder._expands` decides).
# As (BLOCK_M queries of one head, BLOCK_N keys, warps, stages); the fp32 accumulator is
# [BLOCK_M, V = 256].
EXP_TILES = ((64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 3))
_EXP_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4)] if interpreting() else [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=st) for bm, bn, nw, st in EXP_TILES]


@triton.jit
def _attend_expanded_tile(qa, qb, qr, kv_ptr, kr_ptr, slots, live, vis, skv, skr, m_i, l_i, acc, qk_scale,
                          N: tl.constexpr, V: tl.constexpr, P: tl.constexpr, BLOCK_NA: tl.constexpr,
                          BLOCK_NB: tl.constexpr, HAS_NB: tl.constexpr, BLOCK_P: tl.constexpr,
                          BLOCK_V: tl.constexpr, IEEE: tl.constexpr):
    """One key tile of online softmax (base 2) for one head: `slots` [BLOCK_N] rows of the
    expanded buffer (kv_ptr: this head's [N keys | V values], kr_ptr: the shared roped keys),
    vis [BLOCK_M, BLOCK_N] which keys each query sees. N is read as BLOCK_NA + BLOCK_NB columns
    (192 = 128 + 64: no padding to 256)."""
    offs_a = tl.arange(0, BLOCK_NA)
    offs_p = tl.arange(0, BLOCK_P)
    offs_v = tl.arange(0, BLOCK_V)
    row = tl.where(live, slots, 0).to(tl.int64)[:, None]
    base = kv_ptr + row * skv
    ka = tl.load(base + offs_a[None, :], mask=live[:, None] & (offs_a[None, :] < N), other=0.0)
    kr = tl.load(kr_ptr + row * skr + offs_p[None, :], mask=live[:, None] & (offs_p[None, :] < P), other=0.0)
    vv = tl.load(base + N + offs_v[None, :], mask=live[:, None] & (offs_v[None, :] < V), other=0.0)
    if HAS_NB:
        offs_b = BLOCK_NA + tl.arange(0, BLOCK_NB)
        kb = tl.load(base + offs_b[None, :], mask=live[:, None] & (offs_b[None, :] < N), other=0.0)
    if IEEE:
        s = tl.dot(qa, tl.trans(ka.to(tl.float32)), input_precision="ieee") + \
            tl.dot(qr, tl.trans(kr.to(tl.float32)), input_precision="ieee")
        if HAS_NB:
            s += tl.dot(qb, tl.trans(kb.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(qa, tl.trans(ka)) + tl.dot(qr, tl.trans(kr))
        if HAS_NB:
            s += tl.dot(qb, tl.trans(kb))
    m_new, l_i, alpha, p = _softmax_step(s, vis, qk_scale, m_i, l_i)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, vv.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
    return m_new, l_i, acc


@triton.autotune(configs=_EXP_CONFIGS, key=["N", "V", "P", "IEEE"], cache_results=True)
@triton.jit(do_not_specialize=["n_q", "q0", "chunk", "n_blk", "sinks", "win", "n_s", "w_lo", "n_w"])
def _routed_expanded_kernel(qn_ptr, qr_ptr, kv_ptr, kr_ptr, blk_ptr, o_ptr, n_q, q0, chunk, n_blk, sinks, win, bsz,
                            n_s, w_lo, n_w, qk_scale, sqn_t, sqn_h, sqr_t, sqr_h, skv_u, skv_h, skr, sb, so_t, so_h,
                            N: tl.constexpr, V: tl.constexpr, P: tl.constexpr, BLOCK_NA: tl.constexpr,
                            BLOCK_NB: tl.constexpr, HAS_NB: tl.constexpr, BLOCK_P: tl.constexpr,
                            BLOCK_V: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # the buffer's rows (slots): the n_s sinks (keys 0..), the window range (keys w_lo..,
    # n_w of them), then each routing chunk's blocks in order (block j of chunk c at
    # n_s + n_w + (c * n_blk + j) * bsz)
    c = tl.program_id(0)
    h = tl.program_id(1)
    t_lo = c * chunk
    t_hi = tl.minimum(t_lo + chunk, n_q)
    r0 = t_lo + tl.program_id(2) * BLOCK_M
    rows = r0 + tl.arange(0, BLOCK_M)
    rmask = rows < t_hi
    rows = tl.minimum(rows, t_hi - 1)
    pos = q0 + rows
    p_lo = q0 + tl.minimum(r0, t_hi - 1)
    p_hi = q0 + tl.minimum(r0 + BLOCK_M, t_hi) - 1
    offs_a = tl.arange(0, BLOCK_NA)
    offs_p = tl.arange(0, BLOCK_P)
    offs_v = tl.arange(0, BLOCK_V)
    qn = qn_ptr + rows.to(tl.int64)[:, None] * sqn_t + h * sqn_h
    qa = tl.load(qn + offs_a[None, :], mask=offs_a[None, :] < N, other=0.0)
    qb = qa
    if HAS_NB:
        offs_b = BLOCK_NA + tl.arange(0, BLOCK_NB)
        qb = tl.load(qn + offs_b[None, :], mask=offs_b[None, :] < N, other=0.0)
    qr = tl.load(qr_ptr + rows.to(tl.int64)[:, None] * sqr_t + h * sqr_h + offs_p[None, :],
                 mask=offs_p[None, :] < P, other=0.0)
    if IEEE:
        qa, qb, qr = qa.to(tl.float32), qb.to(tl.float32), qr.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    kvh = kv_ptr + h * skv_h
    k_end = p_hi + 1
    s_end = tl.minimum(sinks, k_end)  # sinks: keys (= slots) 0 .. sinks-1, causal
    for k0 in range(0, s_end, BLOCK_N):
        keys = k0 + tl.arange(0, BLOCK_N)
        live = keys < s_end
        vis = live[None, :] & (keys[None, :] <= pos[:, None])
        m_i, l_i, acc = _attend_expanded_tile(qa, qb, qr, kvh, kr_ptr, keys, live, vis, skv_u, skr, m_i, l_i, acc,
                                              qk_scale, N, V, P, BLOCK_NA, BLOCK_NB, HAS_NB, BLOCK_P, BLOCK_V, IEEE)
    # the routing chunk's blocks, clipped as in `_routed_prefill_kernel`
    k_far = tl.minimum(p_hi - win + 1, k_end)
    for j in range(0, n_blk):
        b = tl.load(blk_ptr + c * sb + j).to(tl.int32)
        start = tl.maximum(tl.maximum(b, 0) * bsz, sinks)
        stop = tl.where(b >= 0, tl.minimum(tl.maximum(b, 0) * bsz + bsz, k_far), start)
        shift = n_s + n_w + (c * n_blk + j) * bsz - tl.maximum(b, 0) * bsz  # key -> slot
        for kb in range(start, stop, BLOCK_N):
            keys = kb + tl.arange(0, BLOCK_N)
            live = keys < stop
            vis = live[None, :] & (keys[None, :] <= pos[:, None] - win)
            m_i, l_i, acc = _attend_expanded_tile(qa, qb, qr, kvh, kr_ptr, keys + shift, live, vis, skv_u, skr, m_i,
                                                  l_i, acc, qk_scale, N, V, P, BLOCK_NA, BLOCK_NB, HAS_NB, BLOCK_P,
                                                  BLOCK_V, IEEE)
    # the window: keys pos - win + 1 .. pos of each row (none below the sinks)
    wl = tl.maximum(sinks, p_lo - win + 1)
    for k0 in range(wl, p_hi + 1, BLOCK_N):
        keys = k0 + tl.arange(0, BLOCK_N)
        live = keys <= p_hi
        vis = live[None, :] & (keys[None, :] > pos[:, None] - win) & (keys[None, :] <= pos[:, None])
        m_i, l_i, acc = _attend_expanded_tile(qa, qb, qr, kvh, kr_ptr, keys + (n_s - w_lo), live, vis, skv_u, skr,
                                              m_i, l_i, acc, qk_scale, N, V, P, BLOCK_NA, BLOCK_NB, HAS_NB, BLOCK_P,
                                              BLOCK_V, IEEE)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + rows.to(tl.int64)[:, None] * so_t + h * so_h + offs_v[None, :],
             out.to(o_ptr.dtype.element_ty), mask=rmask[:, None] & (offs_v[None, :] < V))


@triton.jit(do_not_specialize=["n_s", "w_lo", "n_w", "n_rows"])
def _gather_rows_kernel(src_ptr, dst_ptr, blk_ptr, n_s, w_lo, n_w, n_rows, n_src, bsz, ss, sd, W: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr):
    """dst[slot] = src[key] for the expanded buffer's slots (layout in `_routed_expanded_kernel`)."""
    slots = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    live = slots < n_rows
    j = tl.maximum(slots - n_s - n_w, 0)  # slot within the routed blocks
    b = tl.load(blk_ptr + j // bsz, mask=live & (slots >= n_s + n_w), other=0)
    key = tl.where(slots < n_s, slots, tl.where(slots < n_s + n_w, w_lo + slots - n_s,
                                                tl.maximum(b, 0) * bsz + j % bsz))
    # a block's rows past the stored ones are never read (clamped: a partial last block may end
    # past `src`)
    key = tl.minimum(key, n_src - 1).to(tl.int64)
    for w0 in range(0, W, BLOCK_W):
        cols = w0 + tl.arange(0, BLOCK_W)
        m = live[:, None] & (cols[None, :] < W)
        x = tl.load(src_ptr + key[:, None] * ss + cols[None, :], mask=m)
        tl.store(dst_ptr + slots.to(tl.int64)[:, None] * sd + cols[None, :], x, mask=m)


def expanded_rows(t: int, q0: int, n_blocks: int, block_size: int, sinks: int, window: int) -> int:
    """Rows of keys and values `fused_mla_routed_attention_expanded` expands for t queries at
    q0.. with n_blocks routed blocks in all: the sinks, the window range, every block."""
    end = q0 + t
    return min(sinks, end) + max(0, end - max(sinks, q0 - window + 1)) + n_blocks * block_size


def fused_mla_routed_attention_expanded(q_nope: torch.Tensor, q_rot: torch.Tensor, latents: torch.Tensor,
                                        w_kv: torch.Tensor, q0: int, blocks: torch.Tensor, chunk: int,
                                        block_size: int, sinks: int, window: int, scale: float,
                                        out: torch.Tensor | None = None, *, tile: tuple | None = None) -> torch.Tensor:
    """As `naive_mla_routed_attention_expanded`: q_nope [T, H, N], q_rot [T, H, P] (roped) at
    positions q0.., latents [S, R + P], w_kv [H, N + V, R] (kv_b_proj), blocks [C, K] per
    routing chunk of `chunk` queries (-1 = none) -> [T, H, V] (into `out` when given: any
    [T, H, V] view with unit last stride). The latents the call reads (`expanded_rows`) are
    gathered and expanded by one GEMM, then attended per head. `tile`, one of EXP_TILES, runs
    that config instead of the autotuner's choice."""
    t, h, n = q_nope.shape
    p = q_rot.shape[-1]
    nv, r = w_kv.shape[1:]
    v = nv - n
    if w_kv.shape[0] != h or q_rot.shape[:2] != (t, h) or latents.shape[-1] != r + p or v <= 0 \
            or q_nope.stride(-1) != 1 or q_rot.stride(-1) != 1:
        raise ValueError(f"shapes do not fit: q_nope {tuple(q_nope.shape)}, q_rot {tuple(q_rot.shape)}, "
                         f"latents {tuple(latents.shape)}, w_kv {tuple(w_kv.shape)}")
    n_c = max(1, triton.cdiv(t, chunk))
    if blocks.dim() != 2 or blocks.shape[0] != n_c:
        raise ValueError(f"blocks must be [{n_c}, K], got {tuple(blocks.shape)}")
    if out is None:
        out = q_nope.new_empty(t, h, v)
    if out.shape != (t, h, v) or out.stride(-1) != 1:
        raise ValueError(f"out must be a [{t}, {h}, {v}] view with unit last stride")
    if not t:
        return out
    blocks = blocks.contiguous()
    end = q0 + t
    n_s, w_lo = min(sinks, end), max(sinks, q0 - window + 1)
    n_w = max(0, end - w_lo)
    u = expanded_rows(t, q0, blocks.numel(), block_size, sinks, window)
    lat = latents.new_empty(u, r + p)
    _gather_rows_kernel[(triton.cdiv(u, 32),)](latents, lat, blocks, n_s, w_lo, n_w, u, latents.shape[0], block_size,
                                               latents.stride(0), lat.stride(0), W=r + p, BLOCK_S=32, BLOCK_W=64,
                                               num_warps=4)
    kv = torch.mm(lat[:, :r], w_kv.view(h * nv, r).t()).view(u, h, nv)
    na = max(16, 1 << (n.bit_length() - 1))  # N as a power of two and a (masked) remainder
    nb = max(16, triton.next_power_of_2(n - na)) if n > na else 16
    grid = lambda meta: (n_c, h, triton.cdiv(min(chunk, t), meta["BLOCK_M"]))
    kernel, config = _routed_expanded_kernel, {}
    if tile is not None:
        bm, bn, nw, st = tile
        kernel, config = kernel.fn, dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=st)
    kernel[grid](
        q_nope, q_rot, kv, lat[:, r:], blocks, out, t, q0, chunk, blocks.shape[1], sinks, window, block_size, n_s,
        w_lo, n_w, scale * LOG2E, q_nope.stride(0), q_nope.stride(1), q_rot.stride(0),
        q_rot.stride(1), kv.stride(0), kv.stride(1), lat.stride(0), blocks.stride(0), out.stride(0), out.stride(1),
        N=n, V=v, P=p, BLOCK_NA=na, BLOCK_NB=nb, HAS_NB=n > na, BLOCK_P=max(16, triton.next_power_of_2(p)),
        BLOCK_V=max(16, triton.next_power_of_2(v)), IEEE=q_nope.dtype == torch.float32 or interpreting(), **config)
    return out
