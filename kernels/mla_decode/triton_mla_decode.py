"""Triton absorbed-MLA decode attention, split over the keys (flash-decoding), graph-capturable.

All heads of an MLA layer share one latent per token, so a program owns a block of heads and a
contiguous share of the keys: each latent tile [BLOCK_K, R + P] is read once for BLOCK_H heads
(scores as two dots, latent part R and RoPE part P; online softmax; weighted sum of the same
tile's first R dims). The number of keys comes from a device tensor (dense: the current
length) or is the static length of a token list (DSA: the indexer's top-k, -1 = none), so the
grid never changes between steps. Each split writes its normalised partial output and its
log-sum-exp; `fused_mla_decode` merges the splits. DSA prefill runs the same kernel with one
program per query row (each with its own token list) instead of the token-sparse prefill of
kernels/mla_sparse.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mla_decode_kernel(q_ptr, kv_ptr, len_ptr, idx_ptr, o_ptr, lse_ptr, scale, n_static, sq_t, sq_h, skv, si_t,
                       so_s, so_t, so_h, sl_s, sl_t, H, n_sink, n_blk, win, bsz, R: tl.constexpr, P: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                       N_SPLIT: tl.constexpr, INDEXED: tl.constexpr, ROUTED: tl.constexpr, IEEE: tl.constexpr):
    sp = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t = tl.program_id(2).to(tl.int64)
    hmask = offs_h < H
    if INDEXED or ROUTED:
        n = n_static
    else:
        n = tl.load(len_ptr).to(tl.int32)
    if ROUTED:
        pos = tl.load(len_ptr).to(tl.int32) - 1
    per = ((n + N_SPLIT - 1) // N_SPLIT + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    lo = sp * per
    hi = tl.minimum(lo + per, n)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    q_row = q_ptr + t * sq_t + offs_h[:, None] * sq_h
    # operands stay in the cache's dtype (bf16 on the GPU: tensor-core dots, half the shared
    # memory of fp32 tiles at R = 512); fp32 inputs (tests) use IEEE dots
    q1 = tl.load(q_row + offs_r[None, :], mask=hmask[:, None] & (offs_r[None, :] < R), other=0.0)
    q2 = tl.load(q_row + R + offs_p[None, :], mask=hmask[:, None] & (offs_p[None, :] < P), other=0.0)
    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_R), tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        valid = offs_k < hi
        if INDEXED:
            ids = tl.load(idx_ptr + t * si_t + offs_k, mask=valid, other=-1)
            ok = ids >= 0
            rows = tl.where(ok, ids, 0).to(tl.int64)
        elif ROUTED:
            # slot v of the n_sink + n_blk * bsz + win list: a sink, a key of a routed block
            # (outside the window, past the sinks) or a window key (past the sinks): each key once
            vb = offs_k - n_sink
            in_blk = (offs_k >= n_sink) & (vb < n_blk * bsz)
            blk = tl.load(idx_ptr + tl.where(in_blk, vb // bsz, 0), mask=valid & in_blk, other=-1)
            tok_b = blk * bsz + vb % bsz
            tok_w = pos - win + 1 + (vb - n_blk * bsz)
            tok = tl.where(offs_k < n_sink, offs_k, tl.where(in_blk, tok_b, tok_w))
            ok = valid & tl.where(offs_k < n_sink, offs_k <= pos,
                                  tl.where(in_blk, (blk >= 0) & (tok_b >= n_sink) & (tok_b <= pos - win),
                                           tok_w >= n_sink))
            rows = tl.where(ok, tok, 0).to(tl.int64)
        else:
            ok = valid
            rows = offs_k.to(tl.int64)
        base = kv_ptr + rows[:, None] * skv
        k1 = tl.load(base + offs_r[None, :], mask=ok[:, None] & (offs_r[None, :] < R), other=0.0)
        k2 = tl.load(base + R + offs_p[None, :], mask=ok[:, None] & (offs_p[None, :] < P), other=0.0)
        if IEEE:
            s = tl.dot(q1, tl.trans(k1), input_precision="ieee") + tl.dot(q2, tl.trans(k2), input_precision="ieee")
        else:
            s = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
        s = tl.where(ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, k1, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(k1.dtype), k1)
        m = m_new
    has = l > 0
    out = acc / tl.where(has, l, 1.0)[:, None]
    lse = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), float("-inf"))
    tl.store(o_ptr + sp * so_s + t * so_t + offs_h[:, None] * so_h + offs_r[None, :], out,
             mask=hmask[:, None] & (offs_r[None, :] < R))
    tl.store(lse_ptr + sp * sl_s + t * sl_t + offs_h, lse, mask=hmask)


def decode_splits(n_keys: int) -> int:
    """Key splits for n_keys (the capacity, or the top-k): enough programs to fill the GPU's 132
    SMs at long contexts, each split at least 128 keys."""
    return max(1, min(256, n_keys // 128))


def fused_mla_decode(q: torch.Tensor, latents: torch.Tensor, length: torch.Tensor | None, r: int, scale: float,
                     indices: torch.Tensor | None = None, *, splits: int | None = None,
                     routed: tuple | None = None) -> torch.Tensor:
    """As `naive_mla_decode`: q [T, H, R + P], latents [S, R + P], length [1] (device int; dense,
    T = 1) or indices [T, K] (each row's tokens, -1 = none) -> [T, H, R] in q's dtype. One row
    splits its keys over many programs; many rows (DSA prefill) run one program per row.
    routed = (blocks [1, K], sinks, window, block_size), T = 1, length = position + 1: the
    engine's sparse attention (sinks, the blocks' keys outside the window, the window), as
    kernels/mla_sparse `naive_mla_routed_attention`."""
    if routed is not None:
        blocks, n_sink, win, bsz = routed
        if q.shape[0] != 1 or length is None or indices is not None or blocks.dim() != 2 or blocks.shape[0] != 1:
            raise ValueError("routed decode attention takes one query row, its length and blocks [1, K]")
    t, h, width = q.shape
    if latents.shape[-1] != width or not 0 < r < width or latents.stride(1) != 1:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, latents {tuple(latents.shape)}, r={r}")
    if indices is None and routed is None and (t != 1 or length is None):
        raise ValueError("dense decode attention takes one query row and its length")
    if indices is not None and (indices.dim() != 2 or indices.shape[0] != t):
        raise ValueError(f"indices must be [{t}, K], got {tuple(indices.shape)}")
    q = q.contiguous()
    n_static = latents.shape[0] if indices is None else indices.shape[1]
    if routed is not None:
        n_static = n_sink + blocks.shape[1] * bsz + win
        indices = None
    splits = splits or (decode_splits(n_static) if t == 1 else 1)
    o = torch.empty(splits, t, h, r, dtype=torch.float32, device=q.device)
    lse = torch.empty(splits, t, h, dtype=torch.float32, device=q.device)
    block_h = 16 if h <= 16 else 32
    idx = indices.contiguous() if indices is not None else length
    if routed is not None:
        idx = blocks.contiguous()
    fp32 = q.dtype == torch.float32
    _mla_decode_kernel[(splits, triton.cdiv(h, block_h), t)](
        q, latents, length if length is not None else idx, idx, o, lse, scale, n_static, q.stride(0), q.stride(1),
        latents.stride(0), idx.stride(0) if indices is not None else 0, o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1), h, *((n_sink, blocks.shape[1], win, bsz) if routed else (0, 0, 1, 1)),
        R=r, P=width - r, BLOCK_H=block_h, BLOCK_R=max(16, triton.next_power_of_2(r)),
        BLOCK_P=max(16, triton.next_power_of_2(width - r)), BLOCK_K=32, N_SPLIT=splits,
        INDEXED=indices is not None, ROUTED=routed is not None, IEEE=fp32, num_warps=4 if fp32 else 8, num_stages=2)
    if splits == 1:
        return o[0].to(q.dtype)
    # merge the splits: weights exp(lse_s - max) (a split with no keys has lse -inf, weight 0)
    w = torch.softmax(lse, dim=0)
    return (w[..., None] * o).sum(0).to(q.dtype)
