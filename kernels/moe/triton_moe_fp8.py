"""The routed-expert decode GEMVs of triton_moe.py over FP8 experts (`Fp8Weight` stacked:
w13 [E, 2I, H] / w2 [E, H, I] e4m3 with per-row block scales [E, rows, ceil(cols / bk)]).

Same grids and results as `fused_moe_gate_up` / `fused_moe_down` on the dequantised weights;
each program walks K one column block at a time (SUB per iteration) and scales that block's
products by its rows' scales, as kernels/linear/triton_fp8.py `fp8_gemv`. A decode step reads
1 byte per chosen-expert weight instead of 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import interpreting
from ..linear.naive_fp8 import Fp8Weight

_CONFIGS = [triton.Config({"BLOCK_N": 4, "SUB": 2}, num_warps=1)] if interpreting() else [
    triton.Config({"BLOCK_N": bn, "SUB": sub}, num_warps=nw, num_stages=st)
    for bn, sub, nw in ((2, 8, 4), (4, 4, 4), (8, 2, 4), (8, 4, 8), (16, 2, 8))
    for st in (2, 4)
]


@triton.autotune(configs=_CONFIGS, key=["N", "K_DIM", "BK"], cache_results=True)
@triton.jit
def _fp8_moe_gate_up_kernel(x_ptr, w_ptr, s_ptr, ids_ptr, y_ptr, N, K_DIM, s_we, s_wn, s_se, s_sn, s_yk,
                            BK: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr):
    pid = tl.program_id(0)
    k = tl.program_id(1)
    e = tl.load(ids_ptr + k).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BK)
    gate_rows = w_ptr + e * s_we + rows[:, None].to(tl.int64) * s_wn
    up_rows = gate_rows + N * s_wn
    gate_s = s_ptr + e * s_se + rows.to(tl.int64) * s_sn
    up_s = gate_s + N * s_sn
    acc_g = tl.zeros([BLOCK_N, BK], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BK], tl.float32)
    for k0 in range(0, K_DIM, BK * SUB):
        for j in tl.static_range(SUB):
            kb = k0 + j * BK
            kmask = kb + kk < K_DIM
            xv = tl.load(x_ptr + kb + kk, mask=kmask, other=0.0).to(tl.float32)[None, :]
            lmask = rmask[:, None] & kmask[None, :]
            sb = tl.minimum(kb, K_DIM - 1) // BK  # past K_DIM the weights load as 0
            sg = tl.load(gate_s + sb, mask=rmask, other=0.0)[:, None]
            su = tl.load(up_s + sb, mask=rmask, other=0.0)[:, None]
            acc_g += tl.load(gate_rows + kb + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * (xv * sg)
            acc_u += tl.load(up_rows + kb + kk[None, :], mask=lmask, other=0.0).to(tl.float32) * (xv * su)
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + k * s_yk + rows, y.to(y_ptr.dtype.element_ty), mask=rmask)


@triton.autotune(configs=_CONFIGS, key=["N", "K_DIM", "N_EXP", "BK"], cache_results=True)
@triton.jit
def _fp8_moe_down_kernel(a_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, r_ptr, y_ptr, N, K_DIM, N_EXP, s_ak, s_we, s_wn,
                         s_se, s_sn, HAS_RES: tl.constexpr, BK: tl.constexpr, BLOCK_N: tl.constexpr,
                         SUB: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    kk = tl.arange(0, BK)
    out = tl.zeros([BLOCK_N], tl.float32)
    for j in range(0, N_EXP):
        e = tl.load(ids_ptr + j).to(tl.int64)
        wrow = w_ptr + e * s_we + rows[:, None].to(tl.int64) * s_wn
        srow = s_ptr + e * s_se + rows.to(tl.int64) * s_sn
        acc = tl.zeros([BLOCK_N, BK], tl.float32)
        for k0 in range(0, K_DIM, BK * SUB):
            for sb in tl.static_range(SUB):
                kb = k0 + sb * BK
                kmask = kb + kk < K_DIM
                av = tl.load(a_ptr + j * s_ak + kb + kk, mask=kmask, other=0.0).to(tl.float32)[None, :]
                s = tl.load(srow + tl.minimum(kb, K_DIM - 1) // BK, mask=rmask, other=0.0)[:, None]
                w = tl.load(wrow + kb + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
                acc += w.to(tl.float32) * (av * s)
        out += tl.sum(acc, axis=1) * tl.load(wt_ptr + j).to(tl.float32)
    if HAS_RES:
        out += tl.load(r_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=rmask)


def fp8_moe_gate_up(x: torch.Tensor, w13: Fp8Weight, ids: torch.Tensor) -> torch.Tensor:
    """As `naive_moe_gate_up` on w13.dequantize(): x [1, H], ids [K] -> [K, I] in x's dtype."""
    e, two_i, h = w13.w.shape
    if x.shape != (1, h) or two_i % 2 or ids.dim() != 1 or w13.w.stride(2) != 1 or w13.scale.stride(2) != 1:
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, w13 {tuple(w13.w.shape)}, ids {tuple(ids.shape)}")
    x = x.contiguous()
    n = two_i // 2
    k = ids.shape[0]
    out = torch.empty(k, n, dtype=x.dtype, device=x.device)
    if k:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), k)
        _fp8_moe_gate_up_kernel[grid](x, w13.w, w13.scale, ids, out, n, h, w13.w.stride(0), w13.w.stride(1),
                                      w13.scale.stride(0), w13.scale.stride(1), out.stride(0), BK=w13.bk)
    return out


def fp8_moe_down(act: torch.Tensor, w2: Fp8Weight, ids: torch.Tensor, weights: torch.Tensor,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """As `naive_moe_down` on w2.dequantize(): act [K, I], ids [K], weights [K] (+ residual
    [1, H]) -> [1, H] in act's dtype."""
    e, h, i = w2.w.shape
    k = ids.shape[0]
    if act.shape != (k, i) or weights.shape != (k,) or w2.w.stride(2) != 1 or act.stride(1) != 1:
        raise ValueError(f"shapes do not fit: act {tuple(act.shape)}, w2 {tuple(w2.w.shape)}, "
                         f"ids {tuple(ids.shape)}, weights {tuple(weights.shape)}")
    if residual is not None and residual.shape != (1, h):
        raise ValueError(f"residual must be [1, {h}], got {tuple(residual.shape)}")
    out = torch.empty(1, h, dtype=act.dtype, device=act.device)
    res = residual.contiguous() if residual is not None else out
    grid = lambda meta: (triton.cdiv(h, meta["BLOCK_N"]),)
    _fp8_moe_down_kernel[grid](act, w2.w, w2.scale, ids, weights.contiguous(), res, out, h, i, k, act.stride(0),
                               w2.w.stride(0), w2.w.stride(1), w2.scale.stride(0), w2.scale.stride(1),
                               HAS_RES=residual is not None, BK=w2.bk)
    return out
