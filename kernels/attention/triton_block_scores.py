"""Triton kernel for block scores: how relevant each block of keys is to a query chunk.

Same arguments and result as `naive_block_scores` (naive.py): minmax / mean scores, the max
over a query chunk and over the query heads of a GQA group, optionally per routing chunk and
with the non-candidate blocks (sinks, window) scored -inf in the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pdl import dependent_launch, pdl_args

SCORE_TILE = (64, 256)  # (query rows, blocks) per program of prefill block scoring, measured on the H200


@triton.jit(do_not_specialize=["n_q", "chunk", "n_blocks", "first", "q0"])
def _block_scores_kernel(
    q_ptr, kmin_ptr, kmax_ptr, kmean_ptr, out_ptr, end_ptr,
    n_q, chunk, n_blocks, group, first, q0, win, bsz,
    sq_t, sq_h, sd_b, sd_h, so_c, so_h,
    MINMAX: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_END: tl.constexpr, CHUNK_END: tl.constexpr,
    PDL: tl.constexpr = False,
):
    dependent_launch(PDL)
    h = tl.program_id(0)
    nb = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.program_id(2)
    t0 = c * chunk
    n_rows = (tl.minimum(t0 + chunk, n_q) - t0) * group
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    bmask = nb < n_blocks
    dptr = nb[:, None].to(tl.int64) * sd_b + h * sd_h + d[None, :]
    lmask = bmask[:, None] & dmask[None, :]
    # descriptors stay in their storage dtype (bf16 on the GPU path: tensor-core products)
    if MINMAX:
        kmax = tl.load(kmax_ptr + dptr, mask=lmask, other=0.0)
        kmin = tl.load(kmin_ptr + dptr, mask=lmask, other=0.0)
        ddt = kmax.dtype
    else:
        kmean = tl.load(kmean_ptr + dptr, mask=lmask, other=0.0)
        ddt = kmean.dtype
    # A running elementwise max over row tiles, reduced across rows once after the loop: a
    # cross-warp reduction per tile made the prefill scoring ~5x slower than its matmuls.
    best2d = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
    # rows enumerate (query, head-in-group) pairs of this kv head; whole row tiles first, with
    # no row mask (a select per score element costs about a quarter of the tile's dot), then
    # the ragged last tile
    n_full = (n_rows // BLOCK_M) * BLOCK_M
    for r0 in range(0, n_full, BLOCK_M):
        r = r0 + tl.arange(0, BLOCK_M)
        t = t0 + r // group
        hq = h * group + r % group
        x = tl.load(q_ptr + t[:, None].to(tl.int64) * sq_t + hq[:, None] * sq_h + d[None, :],
                    mask=dmask[None, :], other=0.0).to(ddt)
        if MINMAX:
            # max(x*lo, x*hi) summed over d == relu(x).hi + min(x,0).lo: two matrix products
            s = tl.dot(tl.maximum(x, 0.0).to(ddt), tl.trans(kmax)) + tl.dot(tl.minimum(x, 0.0).to(ddt), tl.trans(kmin))
        else:
            s = tl.dot(x, tl.trans(kmean))
        best2d = tl.maximum(best2d, s)
    if n_full < n_rows:
        r = n_full + tl.arange(0, BLOCK_M)
        rmask = r < n_rows
        t = t0 + r // group
        hq = h * group + r % group
        x = tl.load(q_ptr + t[:, None].to(tl.int64) * sq_t + hq[:, None] * sq_h + d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0).to(ddt)
        if MINMAX:
            s = tl.dot(tl.maximum(x, 0.0).to(ddt), tl.trans(kmax)) + tl.dot(tl.minimum(x, 0.0).to(ddt), tl.trans(kmin))
        else:
            s = tl.dot(x, tl.trans(kmean))
        best2d = tl.maximum(best2d, tl.where(rmask[:, None], s, float("-inf")))
    best = tl.max(best2d, axis=0)
    if HAS_END:
        # non-candidates (sink-covered or window-covered blocks) can never win a top-k slot
        best = tl.where((nb >= first) & (nb < tl.load(end_ptr)), best, float("-inf"))
    if CHUNK_END:
        # prefill: the candidates of routing chunk c end at the first block the window of the
        # chunk's last query (absolute index q0 + its row) covers (router.py's rule)
        last = tl.minimum(t0 + chunk, n_q) - 1 + q0
        end_c = tl.maximum((last - win + bsz) // bsz, 0)
        best = tl.where((nb >= first) & (nb < end_c), best, float("-inf"))
    tl.store(out_ptr + c * so_c + h * so_h + nb, best, mask=bmask)


def fused_block_scores(
    q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor, method: str = "minmax",
    *, chunk: int | None = None, candidates: tuple | None = None, tile: tuple[int, int] | None = None,
    chunk_candidates: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """Relevance of each block to a query chunk, shared by the chunk and by a GQA group.

    q [T, Hq, D]; descriptors [NB, Hkv, D] (the unused one may be any tensor of that shape).
    Returns scores [Hkv, NB] fp32, the max over the T queries and the G heads of a group of
    `minmax`: sum_d max(x_d kmin_d, x_d kmax_d), or `mean`: x . kmean.
    With `chunk`, the queries are cut into ceil(T / chunk) routing chunks scored in one launch:
    returns [C, Hkv, NB]. With `candidates=(first, end)` (end a 1-element device tensor) blocks
    outside first..end-1 score -inf, which lets a decode step skip `fused_topk_blocks`' masking.
    `tile=(rows, blocks)` overrides the program tile (powers of two, rows >= 16; for tests).
    With `chunk_candidates=(first, q0, window, block_size)` (queries at absolute indices q0..)
    each routing chunk's non-candidates score -inf: blocks before `first` and from the first
    block the window of the chunk's last query covers, i.e. end = max(0, (last - window +
    block_size) // block_size) — the prefill routing's masking, done in the kernel.
    """
    if method not in ("minmax", "mean"):
        raise ValueError(f"unknown block score method {method!r} (minmax, mean)")
    t, hq, d = q.shape
    ref = kmin if method == "minmax" else kmean
    nb, hkv, dd = ref.shape
    if dd != d or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match descriptors {tuple(ref.shape)}")
    if method == "minmax" and (kmax.shape != kmin.shape or kmax.stride() != kmin.stride()):
        raise ValueError("kmin and kmax must have one shape and layout")
    if q.stride(-1) != 1 or ref.stride(-1) != 1:
        raise ValueError("q and descriptors must be contiguous in their last dimension")
    c_len = t if chunk is None else chunk
    n_c = max(1, triton.cdiv(t, c_len))
    out = torch.empty(n_c, hkv, nb, dtype=torch.float32, device=q.device)
    if nb and t:
        g = hq // hkv
        first, end = candidates if candidates is not None else (0, out)
        q0 = win = bsz = 1
        if chunk_candidates is not None:
            if candidates is not None:
                raise ValueError("candidates and chunk_candidates exclude each other")
            first, q0, win, bsz = chunk_candidates
            if q0 + min(c_len, t) - 1 - win + bsz < 0:
                raise ValueError("negative candidate end: the kernel divides truncating")
        big = min(c_len, t) * g >= 512  # prefill routing chunks: larger tensor-core tiles
        # Prefill: every program re-reads its routing chunk's queries from L2 once per tile of
        # blocks, so wide block tiles cut that traffic (the 1M profile: 64 ms per chunk, ~130 TFLOP/s)
        block_m, block_n = (SCORE_TILE if big else (32, 64)) if tile is None else tile
        if method == "minmax" and tile is None:
            block_n = min(block_n, 128)  # kmin and kmax both resident: 2 x 64 KiB at 256 blocks overflowed
        _block_scores_kernel[(hkv, triton.cdiv(nb, block_n), n_c)](
            q, kmin, kmax, kmean, out, end, t, c_len, nb, g, first, q0, win, bsz,
            q.stride(0), q.stride(1), ref.stride(0), ref.stride(1), out.stride(0), out.stride(1),
            MINMAX=method == "minmax", D=d, BLOCK_D=triton.next_power_of_2(d),
            BLOCK_M=block_m, BLOCK_N=block_n, HAS_END=candidates is not None,
            CHUNK_END=chunk_candidates is not None,
            num_warps=8 if big else 4, **pdl_args(candidates is not None),  # decode's scoring
        )
    elif nb:
        out.fill_(float("-inf"))
    return out if chunk is not None else out[0]

