"""Triton routed-expert GEMVs for batch-1 decode, graph-capturable: the chosen experts' ids stay
on the device and each program reads its expert's rows straight from the stacked weights
([E, 2I, H] gate+up, [E, H, I] down), so a step streams only the chosen experts' bytes and the
launch shapes never change.

`fused_moe_gate_up`: grid (I / BLOCK_N, K): one program owns BLOCK_N features of one chosen
expert, streams the gate and up rows together and applies SwiGLU in its epilogue.
`fused_moe_down`: grid (H / BLOCK_N,): one program owns BLOCK_N output features, loops over the
K chosen experts, and sums their rows weighted by the gate (plus the residual stream), so no
atomics and no second pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import interpreting

_CONFIGS = [triton.Config({"BLOCK_N": 4, "BLOCK_K": 32}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw, num_stages=st)
    for bn, bk, nw in ((2, 1024, 4), (4, 512, 4), (4, 1024, 8), (8, 256, 4), (8, 512, 8), (16, 256, 8),
                       (32, 128, 8))
    for st in (2, 4)
]


@triton.autotune(configs=_CONFIGS, key=["N", "K_DIM"], cache_results=True)
@triton.jit
def _moe_gate_up_kernel(x_ptr, w_ptr, ids_ptr, y_ptr, N, K_DIM, s_we, s_wn, s_yk,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    k = tl.program_id(1)
    e = tl.load(ids_ptr + k).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BLOCK_K)
    gate_rows = w_ptr + e * s_we + rows[:, None].to(tl.int64) * s_wn
    up_rows = gate_rows + N * s_wn
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K_DIM, BLOCK_K):
        kmask = k0 + kk < K_DIM
        xv = tl.load(x_ptr + k0 + kk, mask=kmask, other=0.0).to(tl.float32)[None, :]
        lmask = rmask[:, None] & kmask[None, :]
        acc_g += tl.load(gate_rows + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv
        acc_u += tl.load(up_rows + k0 + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * xv
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + k * s_yk + rows, y.to(y_ptr.dtype.element_ty), mask=rmask)


@triton.autotune(configs=_CONFIGS, key=["N", "K_DIM", "N_EXP"], cache_results=True)
@triton.jit
def _moe_down_kernel(a_ptr, w_ptr, ids_ptr, wt_ptr, r_ptr, y_ptr, N, K_DIM, N_EXP, s_ak, s_we, s_wn,
                     HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BLOCK_K)
    out = tl.zeros([BLOCK_N], tl.float32)
    for j in range(0, N_EXP):
        e = tl.load(ids_ptr + j).to(tl.int64)
        wrow = w_ptr + e * s_we + rows[:, None].to(tl.int64) * s_wn
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K_DIM, BLOCK_K):
            kmask = k0 + kk < K_DIM
            av = tl.load(a_ptr + j * s_ak + k0 + kk, mask=kmask, other=0.0).to(tl.float32)[None, :]
            acc += tl.load(wrow + k0 + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32) * av
        out += tl.sum(acc, axis=1) * tl.load(wt_ptr + j).to(tl.float32)
    if HAS_RES:
        out += tl.load(r_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=rmask)


def fused_moe_gate_up(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """As `naive_moe_gate_up`: x [1, H], w13 [E, 2I, H], ids [K] -> [K, I] in x's dtype."""
    e, two_i, h = w13.shape
    if x.shape != (1, h) or two_i % 2 or ids.dim() != 1 or w13.stride(2) != 1:
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, ids {tuple(ids.shape)}")
    x = x.contiguous()
    n = two_i // 2
    k = ids.shape[0]
    out = torch.empty(k, n, dtype=x.dtype, device=x.device)
    if k:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), k)
        _moe_gate_up_kernel[grid](x, w13, ids, out, n, h, w13.stride(0), w13.stride(1), out.stride(0))
    return out


def fused_moe_down(act: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """As `naive_moe_down`: act [K, I], w2 [E, H, I], ids [K], weights [K] (+ residual [1, H])
    -> [1, H] in act's dtype."""
    e, h, i = w2.shape
    k = ids.shape[0]
    if act.shape != (k, i) or weights.shape != (k,) or w2.stride(2) != 1 or act.stride(1) != 1:
        raise ValueError(f"shapes do not fit: act {tuple(act.shape)}, w2 {tuple(w2.shape)}, "
                         f"ids {tuple(ids.shape)}, weights {tuple(weights.shape)}")
    if residual is not None and residual.shape != (1, h):
        raise ValueError(f"residual must be [1, {h}], got {tuple(residual.shape)}")
    out = torch.empty(1, h, dtype=act.dtype, device=act.device)
    res = residual.contiguous() if residual is not None else out
    grid = lambda meta: (triton.cdiv(h, meta["BLOCK_N"]),)
    _moe_down_kernel[grid](act, w2, ids, weights.contiguous(), res, out, h, i, k, act.stride(0), w2.stride(0),
                           w2.stride(1), HAS_RES=residual is not None)
    return out
