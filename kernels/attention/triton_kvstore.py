"""Triton KV store: keys/values into a time-major cache with their blocks' descriptors.

Same arguments and effects as the references in naive.py (`naive_x` <-> `fused_x`):
`fused_store_kv_blocks` (a prefill chunk), `fused_append_kv` (one decode token) and
`fused_rope_append` (Qwen's biases / q-k norms + RoPE + the append). One launch per layer
instead of the half-dozen small PyTorch ops each replaces; a decode position comes from a
device tensor so a captured decode step replays with a growing context.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .naive import NO_RING


@triton.jit
def ring_row(p, pin, ring):
    """Cache row of logical position p in a tiered GPU pool (engine/gpu/tiering.py): the first
    `pin` positions at their own rows, later ones in a ring of `ring` rows after them. With
    pin = 0 and a ring past any position this is p."""
    return tl.where(p < pin, p, pin + (p - pin) % ring)


# Channels `ch` of a decode key (fp32 `kf`) folded into block b's min / max / mean and the open
# block's fp32 key sum (a fresh block forgets what its slot held).
@triton.jit
def append_desc(kf, ch, b, fresh, cnt, hk, is_k, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr, sd_b, sd_h, sm_b, sm_h,
                D: tl.constexpr):
    dp = b * sd_b + hk * sd_h + ch
    lo = tl.load(kmin_ptr + dp, mask=is_k, other=0.0).to(tl.float32)
    hi = tl.load(kmax_ptr + dp, mask=is_k, other=0.0).to(tl.float32)
    tl.store(kmin_ptr + dp, tl.where(fresh, kf, tl.minimum(lo, kf)).to(kmin_ptr.dtype.element_ty), mask=is_k)
    tl.store(kmax_ptr + dp, tl.where(fresh, kf, tl.maximum(hi, kf)).to(kmax_ptr.dtype.element_ty), mask=is_k)
    sp = ksum_ptr + hk * D + ch
    acc = tl.load(sp, mask=is_k, other=0.0)
    acc = tl.where(fresh, kf, acc + kf)
    tl.store(sp, acc, mask=is_k)
    tl.store(kmean_ptr + b * sm_b + hk * sm_h + ch, (acc / cnt).to(kmean_ptr.dtype.element_ty), mask=is_k)


# A decode token's rotated head halves (ra: channels jj, rb: jj + HALF; `head` per lane) into
# the caches at the device position: k heads (q_heads <= head < n_rot) with their block's
# descriptors, v heads (head >= n_rot) as they are, q heads not at all. Shared by the kernels
# that finish a decode token's projection (here and the qkv GEMV's epilogue).
@triton.jit
def store_kv_halves(ra, rb, jj, head, live, pos_ptr, q_heads, n_rot, kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr,
                    ksum_ptr, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring,
                    HALF: tl.constexpr, BLOCK: tl.constexpr):
    pos = tl.load(pos_ptr).to(tl.int64)
    is_k = live & (head >= q_heads) & (head < n_rot)
    is_v = live & (head >= n_rot)
    hk = tl.maximum(head - q_heads, 0)
    hv = tl.maximum(head - n_rot, 0)
    prow = ring_row(pos, pin, ring)  # the cache row (a tiered pool's ring; else pos itself)
    kp = kc_ptr + prow * skc_n + hk * skc_h + jj
    vp = vc_ptr + prow * svc_n + hv * svc_h + jj
    tl.store(kp, ra.to(kc_ptr.dtype.element_ty), mask=is_k)
    tl.store(kp + HALF, rb.to(kc_ptr.dtype.element_ty), mask=is_k)
    tl.store(vp, ra.to(vc_ptr.dtype.element_ty), mask=is_v)
    tl.store(vp + HALF, rb.to(vc_ptr.dtype.element_ty), mask=is_v)
    # block descriptors from the key as stored (as the append kernel below)
    b = pos // BLOCK
    fresh = (pos % BLOCK) == 0  # first key of a block: forget what the slot held before
    cnt = ((pos % BLOCK) + 1).to(tl.float32)
    append_desc(ra.to(tl.float32), jj, b, fresh, cnt, hk, is_k, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr,
                sd_b, sd_h, sm_b, sm_h, 2 * HALF)
    append_desc(rb.to(tl.float32), jj + HALF, b, fresh, cnt, hk, is_k, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr,
                sd_b, sd_h, sm_b, sm_h, 2 * HALF)


@triton.jit
def _append_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr, pos_ptr,
    sk_h, sv_h, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring,
    BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_MEAN: tl.constexpr,
):
    h = tl.program_id(0)
    pos = tl.load(pos_ptr).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = d < D
    k = tl.load(k_ptr + h * sk_h + d, mask=m, other=0.0)
    v = tl.load(v_ptr + h * sv_h + d, mask=m, other=0.0)
    prow = ring_row(pos, pin, ring)
    tl.store(kc_ptr + prow * skc_n + h * skc_h + d, k.to(kc_ptr.dtype.element_ty), mask=m)
    tl.store(vc_ptr + prow * svc_n + h * svc_h + d, v.to(vc_ptr.dtype.element_ty), mask=m)
    b = pos // BLOCK
    dp = b * sd_b + h * sd_h + d
    kf = k.to(tl.float32)
    fresh = (pos % BLOCK) == 0  # first key of a block: forget what the slot held before
    lo = tl.load(kmin_ptr + dp, mask=m, other=0.0).to(tl.float32)
    hi = tl.load(kmax_ptr + dp, mask=m, other=0.0).to(tl.float32)
    lo = tl.where(fresh, kf, tl.minimum(lo, kf))
    hi = tl.where(fresh, kf, tl.maximum(hi, kf))
    tl.store(kmin_ptr + dp, lo.to(kmin_ptr.dtype.element_ty), mask=m)
    tl.store(kmax_ptr + dp, hi.to(kmax_ptr.dtype.element_ty), mask=m)
    if HAS_MEAN:
        # the open block's key sum stays in fp32 (ksum [Hkv, D]); its mean is stored rounded once
        acc = tl.load(ksum_ptr + h * D + d, mask=m, other=0.0)
        acc = tl.where(fresh, kf, acc + kf)
        tl.store(ksum_ptr + h * D + d, acc, mask=m)
        mean = acc / ((pos % BLOCK) + 1).to(tl.float32)
        tl.store(kmean_ptr + b * sm_b + h * sm_h + d, mean.to(kmean_ptr.dtype.element_ty), mask=m)


def fused_append_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kmin: torch.Tensor, kmax: torch.Tensor, pos: torch.Tensor, block_size: int,
    kmean: torch.Tensor | None = None, ksum: torch.Tensor | None = None, ring: tuple[int, int] = NO_RING,
) -> None:
    """k, v [1, Hkv, D] (or [Hkv, D]) -> k_cache[pos], v_cache[pos] ([N, Hkv, D], any dtype incl.
    fp8), and the running per-channel min/max of block pos // block_size in kmin, kmax
    [NB, Hkv, D]; with kmean [NB, Hkv, D] and ksum [Hkv, D] fp32 (the open block's key sum,
    which the caller seeds when a prefill leaves a block half full) also its mean key.
    `pos` is a 1-element integer device tensor. `ring=(pin, ring)`: the cache is a tiered GPU
    pool whose row for position p is `ring_row(p, pin, ring)` (descriptors stay per logical block)."""
    k2, v2 = k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])
    hkv, d = k2.shape
    if k_cache.shape[1:] != (hkv, d) or kmin.shape[1:] != (hkv, d) or kmax.stride() != kmin.stride():
        raise ValueError("cache and descriptor shapes do not match k")
    has_mean = kmean is not None
    if has_mean and (ksum is None or kmean.shape[1:] != (hkv, d) or ksum.shape != (hkv, d)
                     or ksum.dtype != torch.float32 or not ksum.is_contiguous()):
        raise ValueError("kmean must be [NB, Hkv, D] and ksum a contiguous fp32 [Hkv, D]")
    mean_t = kmean if has_mean else kmin
    _append_kv_kernel[(hkv,)](
        k2, v2, k_cache, v_cache, kmin, kmax, mean_t, ksum if has_mean else kmin, pos,
        k2.stride(0), v2.stride(0), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        kmin.stride(0), kmin.stride(1), mean_t.stride(0), mean_t.stride(1), ring[0], ring[1],
        BLOCK=block_size, D=d, BLOCK_D=triton.next_power_of_2(d), HAS_MEAN=has_mean, num_warps=1,
    )


@triton.jit
def _rope_append_kernel(
    qkv_ptr, bias_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr,
    kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr,
    eps, q_heads, kv_heads, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    # one program per head of the projected row: q heads, then k heads, then v heads
    head = tl.program_id(0)
    jj = tl.arange(0, BLOCK_HALF)
    m = jj < HALF
    heads = head + tl.zeros([BLOCK_HALF], tl.int32)  # per lane: masks stay vectors
    base = head * (2 * HALF)
    a = tl.load(qkv_ptr + base + jj, mask=m, other=0.0).to(tl.float32)
    b = tl.load(qkv_ptr + base + HALF + jj, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        a += tl.load(bias_ptr + base + jj, mask=m, other=0.0).to(tl.float32)
        b += tl.load(bias_ptr + base + HALF + jj, mask=m, other=0.0).to(tl.float32)
    n_rot = q_heads + kv_heads
    rot = heads < n_rot  # q and k heads are normalised and rotated, v heads are not
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * HALF) + eps)
        is_q = heads < q_heads
        wa = tl.where(is_q, tl.load(qn_ptr + jj, mask=m & is_q, other=1.0),
                      tl.load(kn_ptr + jj, mask=m & rot & ~is_q, other=1.0)).to(tl.float32)
        wb = tl.where(is_q, tl.load(qn_ptr + HALF + jj, mask=m & is_q, other=1.0),
                      tl.load(kn_ptr + HALF + jj, mask=m & rot & ~is_q, other=1.0)).to(tl.float32)
        scale = tl.where(rot, rstd, 1.0)
        a = a * scale * wa
        b = b * scale * wb
    c = tl.load(cos_ptr + jj, mask=m & rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + jj, mask=m & rot, other=0.0).to(tl.float32)
    ra = (a * c - b * s).to(qkv_ptr.dtype.element_ty)
    rb = (b * c + a * s).to(qkv_ptr.dtype.element_ty)
    tl.store(qkv_ptr + base + jj, ra, mask=m)
    tl.store(qkv_ptr + base + HALF + jj, rb, mask=m)

    store_kv_halves(ra, rb, jj, heads, m, pos_ptr, q_heads, n_rot, kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr,
                    ksum_ptr, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring, HALF, BLOCK)


def fused_rope_append(
    qkv: torch.Tensor, bias: torch.Tensor | None, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
    eps: float, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int, pos: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor,
    ksum: torch.Tensor, block_size: int, ring: tuple[int, int] = NO_RING,
) -> torch.Tensor:
    """What follows a decode token's qkv projection when it cannot ride in the GEMV's epilogue
    (Qwen2's biases, Qwen3's per-head q/k RMSNorm), in one launch: qkv [1, (H + 2 Hkv) * D] +
    `bias`, RMSNorm of each q and k head (weights `q_norm`, `k_norm` [D]) when given, RoPE
    (rotate_half, cos/sin [1, D/2]) on the q and k heads, all in place, then k and v appended to
    the caches at the device position `pos` with their block descriptors (as `fused_append_kv`).
    Computed in fp32 and rounded once. Returns qkv."""
    n = qkv.shape[-1]
    d = k_cache.shape[-1]
    if qkv.shape != (1, n) or not qkv.is_contiguous() or n != (heads + 2 * kv_heads) * d or d % 2:
        raise ValueError("qkv must be one contiguous row of (H + 2 Hkv) * D features")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    if kmin.shape[1:] != (kv_heads, d) or kmax.stride() != kmin.stride() or kmean.shape[1:] != (kv_heads, d):
        raise ValueError("descriptors must be [NB, Hkv, D]")
    if ksum.shape != (kv_heads, d) or ksum.dtype != torch.float32 or not ksum.is_contiguous():
        raise ValueError("ksum must be a contiguous fp32 [Hkv, D]")
    if not cos.is_contiguous() or not sin.is_contiguous() or cos.shape[-1] != d // 2:
        raise ValueError(f"cos/sin must be contiguous [1, {d // 2}]")
    norm = q_norm is not None
    _rope_append_kernel[(heads + 2 * kv_heads,)](
        qkv, bias if bias is not None else qkv, q_norm if norm else qkv, k_norm if norm else qkv, cos, sin, pos,
        k_cache, v_cache, kmin, kmax, kmean, ksum, eps, heads, kv_heads,
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        kmin.stride(0), kmin.stride(1), kmean.stride(0), kmean.stride(1), ring[0], ring[1],
        HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2), BLOCK=block_size, HAS_BIAS=bias is not None,
        HAS_NORM=norm, num_warps=1,
    )
    return qkv


@triton.jit(do_not_specialize=["start", "end", "b0", "b_last"])  # positions: see triton_sparse_attention.SPECIALIZE_NOT
def _store_kv_blocks_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr,
    start, end, b0, b_last,
    sk_t, sk_h, sv_t, sv_h, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring,
    BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_MEAN: tl.constexpr,
):
    b = b0 + tl.program_id(0)
    h = tl.program_id(1)
    j = b * BLOCK + tl.arange(0, BLOCK)  # absolute positions of this block's keys
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    new = (j >= start) & (j < end)
    old = j < start  # stored by an earlier call: summarised from the cache
    jn = (j - start).to(tl.int64)
    kn = tl.load(k_ptr + jn[:, None] * sk_t + h * sk_h + d[None, :], mask=new[:, None] & dm[None, :], other=0.0)
    vn = tl.load(v_ptr + jn[:, None] * sv_t + h * sv_h + d[None, :], mask=new[:, None] & dm[None, :], other=0.0)
    kq = kn.to(kc_ptr.dtype.element_ty)
    jc = ring_row(j.to(tl.int64), pin, ring)  # cache rows (a block never straddles the ring's end)
    tl.store(kc_ptr + jc[:, None] * skc_n + h * skc_h + d[None, :], kq, mask=new[:, None] & dm[None, :])
    tl.store(vc_ptr + jc[:, None] * svc_n + h * svc_h + d[None, :], vn.to(vc_ptr.dtype.element_ty),
             mask=new[:, None] & dm[None, :])
    ko = tl.load(kc_ptr + jc[:, None] * skc_n + h * skc_h + d[None, :], mask=old[:, None] & dm[None, :], other=0.0)
    # descriptors of the keys as stored (after any fp8 rounding), like the reference that reads
    # them back from the cache
    kf = tl.where(new[:, None], kq.to(tl.float32), ko.to(tl.float32))
    valid = (j < end)[:, None]
    lo = tl.min(tl.where(valid, kf, float("inf")), axis=0)
    hi = tl.max(tl.where(valid, kf, float("-inf")), axis=0)
    dp = b.to(tl.int64) * sd_b + h * sd_h + d
    tl.store(kmin_ptr + dp, lo.to(kmin_ptr.dtype.element_ty), mask=dm)
    tl.store(kmax_ptr + dp, hi.to(kmax_ptr.dtype.element_ty), mask=dm)
    if HAS_MEAN:
        s = tl.sum(tl.where(valid, kf, 0.0), axis=0)
        cnt = (tl.minimum(end - b * BLOCK, BLOCK)).to(tl.float32)
        tl.store(kmean_ptr + b.to(tl.int64) * sm_b + h * sm_h + d, (s / cnt).to(kmean_ptr.dtype.element_ty), mask=dm)
        if b == b_last:  # decode's append continues the open block from this fp32 sum
            tl.store(ksum_ptr + h * D + d, s, mask=dm)


def fused_store_kv_blocks(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kmin: torch.Tensor, kmax: torch.Tensor, start: int, block_size: int,
    kmean: torch.Tensor | None = None, ksum: torch.Tensor | None = None, ring: tuple[int, int] = NO_RING,
) -> None:
    """A prefill chunk's keys/values k, v [T, Hkv, D] (any strides but the last) -> k_cache,
    v_cache [N, Hkv, D] rows start..start+T-1, and the min/max (and mean) descriptors of every
    block those rows touch, over all stored keys of the block (earlier rows are read back from
    the cache); ksum [Hkv, D] fp32 gets the key sum of the last touched block. One launch per
    layer instead of two copies, three reductions, casts and descriptor copies. `ring`: as in
    `fused_append_kv` (rows start.. of a tiered pool; pin and ring multiples of block_size)."""
    t, hkv, d = k.shape
    if v.shape != k.shape or k_cache.shape[1:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError("k, v and the caches do not match")
    if kmin.shape[1:] != (hkv, d) or kmax.stride() != kmin.stride():
        raise ValueError("descriptors must be [NB, Hkv, D], kmin and kmax of one layout")
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or kmin.stride(-1) != 1:
        raise ValueError("last dimensions must be contiguous")
    end = start + t
    if t == 0:
        return
    if (ring == NO_RING and end > k_cache.shape[0]) or -(-end // block_size) > kmin.shape[0]:
        raise ValueError("rows past the cache")
    has_mean = kmean is not None
    if has_mean and (ksum is None or kmean.shape[1:] != (hkv, d) or ksum.shape != (hkv, d)
                     or ksum.dtype != torch.float32 or not ksum.is_contiguous()):
        raise ValueError("kmean must be [NB, Hkv, D] and ksum a contiguous fp32 [Hkv, D]")
    b0, b1 = start // block_size, -(-end // block_size)
    mean_t = kmean if has_mean else kmin
    _store_kv_blocks_kernel[(b1 - b0, hkv)](
        k, v, k_cache, v_cache, kmin, kmax, mean_t, ksum if has_mean else kmin,
        start, end, b0, b1 - 1,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), kmin.stride(0), kmin.stride(1), mean_t.stride(0), mean_t.stride(1),
        ring[0], ring[1],
        BLOCK=block_size, D=d, BLOCK_D=triton.next_power_of_2(d), HAS_MEAN=has_mean, num_warps=4,
    )
