"""Triton GEMV for decode: a few rows of x times W, with RMSNorm / SwiGLU / residual fused.

Same arguments and result as `naive_gemv`. One program owns BLOCK_N output features of one
row of x and streams its rows of W once; x (a few KiB) is re-read by every program, which is
what lets the RMSNorm prologue live here instead of in a kernel of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import interpreting

# On the GPU the best tile depends on N and K (few programs for small N starve the SMs);
# the interpreter only checks the arithmetic, so one small config keeps it quick.
_CONFIGS = [triton.Config({"BLOCK_N": 4, "BLOCK_K": 64}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw, num_stages=st)
    for bn, bk, nw in ((2, 2048, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4),
                       (16, 512, 8), (32, 256, 8), (64, 128, 8))
    for st in (2, 4)
]


@triton.autotune(configs=_CONFIGS, key=["N", "K", "HAS_NORM", "SWIGLU", "HAS_RES"])
@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, g_ptr, r_ptr, y_ptr,
    N, K, eps, sx, sw, sr, sy,
    HAS_NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BLOCK_K)
    rstd = 1.0
    if HAS_NORM:
        ss = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xv = tl.load(x_ptr + m * sx + k0 + kk, mask=k0 + kk < K, other=0.0).to(tl.float32)
            ss += xv * xv
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    wrow = w_ptr + rows[:, None].to(tl.int64) * sw
    for k0 in range(0, K, BLOCK_K):
        kmask = k0 + kk < K
        xv = tl.load(x_ptr + m * sx + k0 + kk, mask=kmask, other=0.0).to(tl.float32)
        if HAS_NORM:
            xv = xv * rstd * tl.load(g_ptr + k0 + kk, mask=kmask, other=0.0).to(tl.float32)
        lmask = rmask[:, None] & kmask[None, :]
        acc += tl.load(wrow + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv[None, :]
        if SWIGLU:  # the up row of feature n sits N rows below its gate row
            acc_up += tl.load(wrow + N * sw + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv[None, :]
    y = tl.sum(acc, axis=1)
    if SWIGLU:
        y = y * tl.sigmoid(y) * tl.sum(acc_up, axis=1)
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
        )
    return out
