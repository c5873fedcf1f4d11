"""Append one decode token's key/value to a time-major cache and update its block descriptors.

One launch per layer instead of the half-dozen small PyTorch ops it replaces; the position
comes from a device tensor so a captured decode step replays with a growing context.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _append_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr, pos_ptr,
    sk_h, sv_h, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h,
    BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_MEAN: tl.constexpr,
):
    h = tl.program_id(0)
    pos = tl.load(pos_ptr).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = d < D
    k = tl.load(k_ptr + h * sk_h + d, mask=m, other=0.0)
    v = tl.load(v_ptr + h * sv_h + d, mask=m, other=0.0)
    tl.store(kc_ptr + pos * skc_n + h * skc_h + d, k.to(kc_ptr.dtype.element_ty), mask=m)
    tl.store(vc_ptr + pos * svc_n + h * svc_h + d, v.to(vc_ptr.dtype.element_ty), mask=m)
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
    kmean: torch.Tensor | None = None, ksum: torch.Tensor | None = None,
) -> None:
    """k, v [1, Hkv, D] (or [Hkv, D]) -> k_cache[pos], v_cache[pos] ([N, Hkv, D], any dtype incl.
    fp8), and the running per-channel min/max of block pos // block_size in kmin, kmax
    [NB, Hkv, D]; with kmean [NB, Hkv, D] and ksum [Hkv, D] fp32 (the open block's key sum,
    which the caller seeds when a prefill leaves a block half full) also its mean key.
    `pos` is a 1-element integer device tensor."""
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
        kmin.stride(0), kmin.stride(1), mean_t.stride(0), mean_t.stride(1),
        BLOCK=block_size, D=d, BLOCK_D=triton.next_power_of_2(d), HAS_MEAN=has_mean, num_warps=1,
    )
