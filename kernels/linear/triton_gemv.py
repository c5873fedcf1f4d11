"""Triton GEMV for decode: a few rows of x times W, with RMSNorm / SwiGLU / residual fused.

Same arguments and result as `naive_gemv`. One program owns BLOCK_N output features of one
row of x and streams its rows of W once; x (a few KiB) is re-read by every program, which is
what lets the RMSNorm prologue live here instead of in a kernel of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..attention.triton_kvstore import NO_RING, store_kv_halves
from ..gpu import interpreting
# dependent launch (kernels/pdl.py): a GEMV waits before its first load and lets its successor
# launch once its weight loop is done
from ..pdl import gdc_launch_dependents, gdc_wait, pdl_args

# On the GPU the best tile depends on N and K (few programs for small N starve the SMs);
# the interpreter only checks the arithmetic, so one config keeps it quick: it pays per program
# instance, so 16 rows a program (tests' N such as 37, 8 or 260 still end in a masked tile, and
# K = 96, 129 or 200 still loops over BLOCK_K).
_CONFIGS = [triton.Config({"BLOCK_N": 16, "BLOCK_K": 64}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw, num_stages=st)
    for bn, bk, nw in ((1, 4096, 4), (2, 4096, 8), (2, 2048, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4),
                       (16, 512, 8), (32, 256, 8), (64, 128, 8))
    for st in (2, 4)
]


# cache_results: the chosen config is kept on disk with the compiled kernels, so a new process
# (every `docqa ask`) does not re-time 22 configs per shape before its first decode step (~12 s
# for an 8B model on the H200)
@triton.autotune(configs=_CONFIGS, key=["N", "K", "HAS_NORM", "SWIGLU", "HAS_RES"], cache_results=True)
@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, g_ptr, r_ptr, y_ptr,
    N, K, eps, sx, sw, sr, sy,
    HAS_NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
    PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    if PDL:
        gdc_wait()  # x (and the residual) come from the previous kernel
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BLOCK_K)
    # RMSNorm folds into the epilogue: y = rstd * W (g * x), with the sum of squares gathered in
    # the same pass over x as the products, so W streams from the first iteration instead of
    # after a separate prologue pass over x
    ss = tl.zeros([BLOCK_K], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    wrow = w_ptr + rows[:, None].to(tl.int64) * sw
    for k0 in range(0, K, BLOCK_K):
        kmask = k0 + kk < K
        xv = tl.load(x_ptr + m * sx + k0 + kk, mask=kmask, other=0.0).to(tl.float32)
        if HAS_NORM:
            ss += xv * xv
            xv = xv * tl.load(g_ptr + k0 + kk, mask=kmask, other=0.0).to(tl.float32)
        lmask = rmask[:, None] & kmask[None, :]
        acc += tl.load(wrow + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv[None, :]
        if SWIGLU:  # the up row of feature n sits N rows below its gate row
            acc_up += tl.load(wrow + N * sw + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv[None, :]
    if PDL:
        gdc_launch_dependents()
    y = tl.sum(acc, axis=1)
    up = tl.sum(acc_up, axis=1)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        y = y * rstd
        up = up * rstd
    if SWIGLU:
        y = y * tl.sigmoid(y) * up
    if HAS_RES:
        y += tl.load(r_ptr + m * sr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * sy + rows, y.to(y_ptr.dtype.element_ty), mask=rmask)


MAX_ROWS = 16  # beyond a few rows a tensor-core GEMM wins: this kernel re-reads W per row


def fused_gemv(
    x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
    residual: torch.Tensor | None = None, swiglu: bool = False, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS), w [N, K] row-major -> [M, N] (or [M, N/2] with swiglu)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and w {tuple(w.shape)} do not multiply")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"fused_gemv is for at most {MAX_ROWS} rows, got {x.shape[0]}: use a GEMM")
    if w.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("x and w must be contiguous in K")
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    if swiglu and w.shape[0] % 2:
        raise ValueError("swiglu needs W as [gate rows; up rows], an even number of rows")
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"norm_weight must be [{k}], got {tuple(norm_weight.shape)}")
    if residual is not None and residual.shape != (m, n):
        raise ValueError(f"residual must be [{m}, {n}], got {tuple(residual.shape)}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] and contiguous in its last dimension")
    if m and n:
        res = residual if residual is not None else out
        g = norm_weight if norm_weight is not None else x
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), m)
        _gemv_kernel[grid](
            x, w, g, res, out, n, k, eps, x.stride(0), w.stride(0), res.stride(0), out.stride(0),
            HAS_NORM=norm_weight is not None, SWIGLU=swiglu, HAS_RES=residual is not None,
            **pdl_args(),
        )
    return out


# the running key sum is read-modify-write: autotuning's repeated launches must not compound it
@triton.autotune(configs=_CONFIGS, key=["N", "K"], restore_value=["ksum_ptr"], cache_results=True)
@triton.jit
def _qkv_gemv_kernel(
    x_ptr, w_ptr, g_ptr, y_ptr, cos_ptr, sin_ptr, pos_ptr,
    kc_ptr, vc_ptr, kmin_ptr, kmax_ptr, kmean_ptr, ksum_ptr,
    N, K, eps, sw, n_rot_heads, q_heads,
    skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring,
    HALF: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    if PDL:
        gdc_wait()
    # A program owns BLOCK_N rotation pairs (feature j and j + HALF of one head), so RoPE, the
    # KV-cache append and the per-channel block descriptors all happen on its own outputs:
    # descriptors (min / max / mean per channel) need no other program's values.
    i = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pmask = i < N // 2
    head = i // HALF
    jj = i % HALF
    row_a = head * (2 * HALF) + jj
    kk = tl.arange(0, BLOCK_K)
    ss = tl.zeros([BLOCK_K], tl.float32)
    acc_a = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_b = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    wa = w_ptr + row_a[:, None].to(tl.int64) * sw
    wb = wa + HALF * sw
    for k0 in range(0, K, BLOCK_K):
        kmask = k0 + kk < K
        xv = tl.load(x_ptr + k0 + kk, mask=kmask, other=0.0).to(tl.float32)
        ss += xv * xv
        xv = xv * tl.load(g_ptr + k0 + kk, mask=kmask, other=0.0).to(tl.float32)
        lmask = pmask[:, None] & kmask[None, :]
        acc_a += tl.load(wa + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv[None, :]
        acc_b += tl.load(wb + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv[None, :]
    if PDL:
        gdc_launch_dependents()
    rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    ya = tl.sum(acc_a, axis=1) * rstd
    yb = tl.sum(acc_b, axis=1) * rstd
    rot = head < n_rot_heads  # q and k heads rotate, v heads do not
    c = tl.load(cos_ptr + jj, mask=pmask & rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + jj, mask=pmask & rot, other=0.0).to(tl.float32)
    ra = (ya * c - yb * s).to(y_ptr.dtype.element_ty)
    rb = (yb * c + ya * s).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row_a, ra, mask=pmask)
    tl.store(y_ptr + row_a + HALF, rb, mask=pmask)

    store_kv_halves(ra, rb, jj, head, pmask, pos_ptr, q_heads, n_rot_heads, kc_ptr, vc_ptr, kmin_ptr, kmax_ptr,
                    kmean_ptr, ksum_ptr, skc_n, skc_h, svc_n, svc_h, sd_b, sd_h, sm_b, sm_h, pin, ring, HALF, BLOCK)


def fused_qkv_gemv(
    x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    heads: int, kv_heads: int, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor, ksum: torch.Tensor, block_size: int,
    out: torch.Tensor | None = None, ring: tuple[int, int] = NO_RING,
) -> torch.Tensor:
    """One decode token's q/k/v projection with everything that follows it before attention:
    RMSNorm(x) @ W^T for W = [q rows; k rows; v rows] ([(H + 2 Hkv) * D, K]), RoPE
    (rotate_half, cos/sin [1, D/2]) on the q and k heads, then k and v appended to the caches
    [N, Hkv, D] at the device position `pos` with the block's per-channel min / max / mean
    descriptors [NB, Hkv, D] and fp32 key sum ksum [Hkv, D] kept up to date, as
    `fused_rope` + `fused_append_kv` do (`ring` as there). Returns the rotated qkv [1, (H + 2 Hkv) * D]."""
    n, k = w.shape
    if x.shape != (1, k) or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"x must be one contiguous row [1, {k}]")
    d = k_cache.shape[-1]
    if n != (heads + 2 * kv_heads) * d or d % 2 or k_cache.shape[1:] != (kv_heads, d):
        raise ValueError("W rows, heads and cache shapes do not match")
    if cos.shape[-1] != d // 2 or not cos.is_contiguous() or not sin.is_contiguous():
        raise ValueError(f"cos/sin must be contiguous [1, {d // 2}]")
    if kmin.shape[1:] != (kv_heads, d) or kmax.stride() != kmin.stride() or kmean.shape[1:] != (kv_heads, d):
        raise ValueError("descriptors must be [NB, Hkv, D]")
    if ksum.shape != (kv_heads, d) or ksum.dtype != torch.float32 or not ksum.is_contiguous():
        raise ValueError("ksum must be a contiguous fp32 [Hkv, D]")
    if out is None:
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(n // 2, meta["BLOCK_N"]),)
    _qkv_gemv_kernel[grid](
        x, w, norm_weight, out, cos, sin, pos, k_cache, v_cache, kmin, kmax, kmean, ksum,
        n, k, eps, w.stride(0), heads + kv_heads, heads,
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        kmin.stride(0), kmin.stride(1), kmean.stride(0), kmean.stride(1), ring[0], ring[1],
        HALF=d // 2, BLOCK=block_size, **pdl_args(),
    )
    return out
