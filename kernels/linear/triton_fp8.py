"""Triton kernels over block-scaled FP8 weights (`Fp8Weight`: e4m3 + one fp32 scale per row
and bk columns), with the weight never expanded to bf16 in memory.

`fp8_gemv` (decode, a few rows): as `fused_gemv` (RMSNorm prologue, SwiGLU, residual) but
reading 1 byte per weight, which is what a memory-bound GEMV costs: half the bf16 traffic. A
program owns BLOCK_N rows and walks K one column block (bk) at a time, SUB blocks per
iteration, scaling each block's products by its row scales (a [BLOCK_N] vector: one load per
row and block, so the scales cost nothing next to the weights).

`fp8_matmul` (prefill chunks, and `fp8_grouped_matmul` for MoE experts): a tiled GEMM whose K
step is one column block. With act_fp8 (the default for bf16 activations) the activation tile is
quantised to e4m3 in the kernel, per row and block (scale = amax / 448, DeepSeek-V3's
per-token-group scheme) and the product is an FP8 tensor-core dot (Hopper: twice bf16's
rate), both scales applied to each block's fp32 partial sum, so the e4m3 dot only ever adds
bk products before promotion. Quantising in the kernel costs BLOCK_M x bk element operations
per BLOCK_M x BLOCK_N x bk products and saves a kernel and a pass over the activations. Without
act_fp8 (fp32 activations: the tests' reference dtype) the e4m3 tile is converted in registers
and the dot runs in the activations' dtype (fp32: IEEE, not tf32).

`linear_gemv` / `linear_mm` / `linear_add_mm`: the products a model calls on whatever weight it
holds (plain, FP8, or a mixed fused projection's runs), so engine/gpu/glm.py and
engine/gpu/moe.py pick the kernel in one place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import interpreting
from .naive_fp8 import E4M3_MAX, Fp8Weight, is_fp8
from .triton_gemv import MAX_ROWS, fused_gemv

_GEMV_CONFIGS = [triton.Config({"BLOCK_N": 4, "SUB": 2}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_N": bn, "SUB": sub}, num_warps=nw, num_stages=st)
    # 12 configs (fused_gemv has 22): a fresh machine compiles each once per shape before its first step
    for bn, sub, nw in ((2, 8, 4), (4, 4, 4), (4, 8, 8), (8, 4, 8), (16, 2, 8), (32, 2, 8))
    for st in (2, 4)
]


@triton.autotune(configs=_GEMV_CONFIGS, key=["N", "K", "BK", "HAS_NORM", "SWIGLU", "HAS_RES"], cache_results=True)
@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, r_ptr, y_ptr,
    N, K, eps, sx, sw, ss, sr, sy,
    HAS_NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
    BK: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr,
):
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BK)
    sq = tl.zeros([BK], tl.float32)
    acc = tl.zeros([BLOCK_N, BK], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BK], tl.float32)
    wrow = w_ptr + rows[:, None].to(tl.int64) * sw
    srow = s_ptr + rows.to(tl.int64) * ss
    for k0 in range(0, K, BK * SUB):
        for j in tl.static_range(SUB):
            kb = k0 + j * BK
            kmask = kb + kk < K
            xv = tl.load(x_ptr + m * sx + kb + kk, mask=kmask, other=0.0).to(tl.float32)
            if HAS_NORM:
                sq += xv * xv
                xv = xv * tl.load(g_ptr + kb + kk, mask=kmask, other=0.0).to(tl.float32)
            lmask = rmask[:, None] & kmask[None, :]
            # past K (the last iteration's spare sub-blocks) the weights load as 0: any scale will do
            sb = tl.minimum(kb, K - 1) // BK
            s = tl.load(srow + sb, mask=rmask, other=0.0)
            w = tl.load(wrow + kb + kk[None, :], mask=lmask, other=0.0).to(tl.float32)
            acc += w * (xv[None, :] * s[:, None])
            if SWIGLU:  # the up row of feature n sits N rows below its gate row
                su = tl.load(srow + N * ss + sb, mask=rmask, other=0.0)
                wu = tl.load(wrow + N * sw + kb + kk[None, :], mask=lmask, other=0.0).to(tl.float32)
                acc_up += wu * (xv[None, :] * su[:, None])
    y = tl.sum(acc, axis=1)
    up = tl.sum(acc_up, axis=1)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
        y = y * rstd
        up = up * rstd
    if SWIGLU:
        y = y * tl.sigmoid(y) * up
    if HAS_RES:
        y += tl.load(r_ptr + m * sr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * sy + rows, y.to(y_ptr.dtype.element_ty), mask=rmask)


def fp8_gemv(
    x: torch.Tensor, w: Fp8Weight, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
    residual: torch.Tensor | None = None, swiglu: bool = False, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """As `fused_gemv` with W block-scaled e4m3: x [M, K] (M <= MAX_ROWS) -> [M, N] (or [M, N/2])."""
    n_all, k = w.w.shape
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} and w {tuple(w.w.shape)} do not multiply")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"fp8_gemv is for at most {MAX_ROWS} rows, got {x.shape[0]}: use fp8_matmul")
    if w.w.stride(1) != 1 or w.scale.stride(1) != 1 or w.scale.shape != (n_all, -(-k // w.bk)):
        raise ValueError("w must be contiguous in K with scales [N, ceil(K / bk)]")
    if swiglu and n_all % 2:
        raise ValueError("swiglu needs W as [gate rows; up rows], an even number of rows")
    m = x.shape[0]
    n = n_all // 2 if swiglu else n_all
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"norm_weight must be [{k}], got {tuple(norm_weight.shape)}")
    if residual is not None and residual.shape != (m, n):
        raise ValueError(f"residual must be [{m}, {n}], got {tuple(residual.shape)}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m and n:
        res = residual if residual is not None else out
        g = norm_weight if norm_weight is not None else x
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), m)
        _fp8_gemv_kernel[grid](
            x, w.w, w.scale, g, res, out, n, k, eps, x.stride(0), w.w.stride(0), w.scale.stride(0),
            res.stride(0), out.stride(0), HAS_NORM=norm_weight is not None, SWIGLU=swiglu,
            HAS_RES=residual is not None, BK=w.bk,
        )
    return out


# --- GEMM -------------------------------------------------------------------------------------

@triton.jit
def _fp8_mm_kernel(
    a_ptr, w_ptr, s_ptr, c_ptr, tile_e_ptr, tile_r_ptr, tile_end_ptr,
    M, N, K, sa, s_we, sw, s_se, ss, sc,
    GROUPED: tl.constexpr, ACT_FP8: tl.constexpr, IEEE: tl.constexpr, FP8_MAX: tl.constexpr,
    BK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if GROUPED:  # the tile's expert and rows (rows of the other experts, or none, are masked)
        e = tl.load(tile_e_ptr + pid_m).to(tl.int64)
        row0 = tl.load(tile_r_ptr + pid_m)
        row_end = tl.load(tile_end_ptr + pid_m)
    else:
        e = 0
        row0 = pid_m * BLOCK_M
        row_end = M
    rows = row0 + tl.arange(0, BLOCK_M)
    rmask = rows < row_end
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    kk = tl.arange(0, BK)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * sa + kk[None, :]
    # W [N, K] read as its transpose [BK, BLOCK_N], contiguous along K: the K-major B operand
    # Hopper's FP8 tensor-core dot takes
    w_ptrs = w_ptr + e * s_we + cols[None, :].to(tl.int64) * sw + kk[:, None]
    s_ptrs = s_ptr + e * s_se + cols.to(tl.int64) * ss
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BK):
        kmask = k0 + kk < K
        a = tl.load(a_ptrs + k0, mask=rmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_ptrs + k0, mask=kmask[:, None] & cmask[None, :], other=0.0)
        s_w = tl.load(s_ptrs + k0 // BK, mask=cmask, other=0.0)
        if ACT_FP8:
            af = a.to(tl.float32)
            s_a = tl.maximum(tl.max(tl.abs(af), axis=1), 1e-12) / FP8_MAX
            a8 = (af / s_a[:, None]).to(tl.float8e4nv)
            acc += tl.dot(a8, w, out_dtype=tl.float32) * (s_a[:, None] * s_w[None, :])
        elif IEEE:
            acc += tl.dot(a, w.to(tl.float32), input_precision="ieee") * s_w[None, :]
        else:
            acc += tl.dot(a, w.to(a.dtype), out_dtype=tl.float32) * s_w[None, :]
    tl.store(c_ptr + rows[:, None].to(tl.int64) * sc + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


# stages x (BLOCK_M x bk activations (2 B) + BLOCK_N x bk weights (1 B)) of shared memory: the
# largest here, 128 x 128 at 4 stages, is 192 KiB of the H200's 227; configs that do not fit
# (fp32 activations) are skipped by the autotuner. BLOCK_M >= 64 everywhere: Hopper's wgmma
# (FP8 included) works on 64-row warpgroup tiles
_MM_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=st)
    for bm, bn, nw, st in ((128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 4),
                           (128, 256, 8, 3), (64, 64, 4, 2))
]
GROUP_BLOCK_M = 16 if interpreting() else 64  # fixed: the host builds the tile map with it
_GROUPED_CONFIGS = [triton.Config({"BLOCK_N": 16}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_N": bn}, num_warps=nw, num_stages=st)
    for bn, nw, st in ((128, 4, 3), (128, 8, 4), (64, 4, 3), (256, 8, 3), (64, 4, 2))
]
_KEY = ["N", "K", "BK", "GROUPED", "ACT_FP8", "IEEE"]
_mm = triton.autotune(configs=_MM_CONFIGS, key=_KEY, cache_results=True)(_fp8_mm_kernel)
_grouped = triton.autotune(configs=_GROUPED_CONFIGS, key=_KEY, cache_results=True)(_fp8_mm_kernel)


def _modes(a: torch.Tensor, w: Fp8Weight, act_fp8: bool | None) -> tuple[bool, bool]:
    if act_fp8 is None:  # the FP8 dot for half-precision activations; fp32 stays exact
        act_fp8 = a.dtype != torch.float32
    if act_fp8 and w.bk < 32 and not interpreting():
        raise ValueError(f"the FP8 dot needs column blocks of at least 32, not {w.bk}")
    return act_fp8, a.dtype == torch.float32 and not act_fp8


def fp8_matmul(a: torch.Tensor, w: Fp8Weight, *, act_fp8: bool | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] @ W^T -> [M, N] in a's dtype (as `naive_fp8_matmul`). act_fp8: None = on
    unless a is fp32."""
    n, k = w.w.shape
    if a.dim() != 2 or a.shape[1] != k or a.stride(1) != 1 or w.w.stride(1) != 1:
        raise ValueError(f"a {tuple(a.shape)} and w {tuple(w.w.shape)} do not multiply (K contiguous)")
    act_fp8, ieee = _modes(a, w, act_fp8)
    m = a.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=a.dtype, device=a.device)
    if m and n:
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
        _mm[grid](a, w.w, w.scale, out, a, a, a, m, n, k, a.stride(0), 0, w.w.stride(0), 0, w.scale.stride(0),
                  out.stride(0), GROUPED=False, ACT_FP8=act_fp8, IEEE=ieee, FP8_MAX=E4M3_MAX, BK=w.bk)
    return out


def fp8_grouped_matmul(a: torch.Tensor, w: Fp8Weight, ends: torch.Tensor, *,
                       act_fp8: bool | None = None) -> torch.Tensor:
    """As kernels/moe/grouped.py `grouped_mm` with FP8 experts: a [R, K] (rows grouped by
    expert), w [E, N, K] e4m3 (scales [E, N, ceil(K/bk)]), ends [E] cumulative end rows -> [R, N].
    The tile map (each BLOCK_M tile's expert and rows) is built on the device: no host sync."""
    e, n, k = w.w.shape
    r = a.shape[0]
    if a.dim() != 2 or a.shape[1] != k or a.stride(1) != 1 or ends.shape != (e,):
        raise ValueError(f"a {tuple(a.shape)}, w {tuple(w.w.shape)} and ends {tuple(ends.shape)} do not fit")
    act_fp8, ieee = _modes(a, w, act_fp8)
    out = torch.empty(r, n, dtype=a.dtype, device=a.device)
    bm = GROUP_BLOCK_M
    tiles = triton.cdiv(r, bm) + e  # at most one partial tile per expert
    ends = ends.long()
    starts = torch.cat((ends.new_zeros(1), ends[:-1]))
    per = (ends - starts + bm - 1) // bm  # tiles of each expert
    last = per.cumsum(0)
    t = torch.arange(tiles, device=a.device)
    te = torch.searchsorted(last, t, right=True)
    used = te < e
    te = te.clamp_max(e - 1)
    row0 = starts[te] + (t - (last[te] - per[te])) * bm
    tile_end = torch.where(used, ends[te], 0)
    if r and n:
        grid = lambda meta: (tiles, triton.cdiv(n, meta["BLOCK_N"]))
        _grouped[grid](a, w.w, w.scale, out, te.to(torch.int32), row0.to(torch.int32), tile_end.to(torch.int32),
                       r, n, k, a.stride(0), w.w.stride(0), w.w.stride(1), w.scale.stride(0), w.scale.stride(1),
                       out.stride(0), GROUPED=True, ACT_FP8=act_fp8, IEEE=ieee, FP8_MAX=E4M3_MAX, BK=w.bk,
                       BLOCK_M=bm)
    return out


# --- products over any weight a model holds: plain, `Fp8Weight`, or a list of row runs (naive_fp8.py `fuse_rows`)


def linear_gemv(x: torch.Tensor, w, **kw) -> torch.Tensor:
    """Decode product x @ W^T with `fused_gemv`'s keywords (a list of runs: each run's outputs concatenated)."""
    if isinstance(w, list):
        return torch.cat([linear_gemv(x, p, **kw) for p in w], dim=1)
    return fp8_gemv(x, w, **kw) if is_fp8(w) else fused_gemv(x, w, **kw)


def linear_mm(x: torch.Tensor, w) -> torch.Tensor:
    """Prefill product x @ W^T."""
    if isinstance(w, list):
        return torch.cat([linear_mm(x, p) for p in w], dim=1)
    return fp8_matmul(x.contiguous(), w) if is_fp8(w) else x @ w.t()


def linear_add_mm(x: torch.Tensor, a: torch.Tensor, w) -> torch.Tensor:
    """x += a @ W^T in place (returned)."""
    if is_fp8(w) or isinstance(w, list):
        return x.add_(linear_mm(a, w))
    return x.addmm_(a, w.t())
