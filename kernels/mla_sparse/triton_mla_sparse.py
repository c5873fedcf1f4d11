"""Triton token-sparse MLA attention: each query attends to its own list of tokens (DSA's
top-k), reading only those rows of the latent cache.

One program per (query row, block of heads): all heads of an MLA layer share one latent per
token, so a gathered tile of BLOCK_K latents [BLOCK_K, R + P] is loaded once and used by
BLOCK_H heads — scores as two dots (latent part R and RoPE part P, each padded to a power of
two), online softmax, and the weighted sum of the same tile's first R dims. Decode (T = 1)
and chunked prefill (T rows, each with its own token list) are the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mla_sparse_kernel(q_ptr, kv_ptr, idx_ptr, out_ptr, n_sel, scale, sq_t, sq_h, skv, si_t,
                       so_t, so_h, H, R: tl.constexpr, P: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                       IEEE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    hmask = offs_h < H
    q_row = q_ptr + t * sq_t + offs_h[:, None] * sq_h
    q1 = tl.load(q_row + offs_r[None, :], mask=hmask[:, None] & (offs_r[None, :] < R), other=0.0)
    q2 = tl.load(q_row + R + offs_p[None, :], mask=hmask[:, None] & (offs_p[None, :] < P), other=0.0)
    q1, q2 = q1.to(tl.float32), q2.to(tl.float32)
    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_R), tl.float32)
    for k0 in range(0, n_sel, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        ids = tl.load(idx_ptr + t * si_t + offs_k, mask=offs_k < n_sel, other=-1)
        ok = ids >= 0
        rows = kv_ptr + tl.where(ok, ids, 0).to(tl.int64)[:, None] * skv
        k1 = tl.load(rows + offs_r[None, :], mask=ok[:, None] & (offs_r[None, :] < R), other=0.0)
        k2 = tl.load(rows + R + offs_p[None, :], mask=ok[:, None] & (offs_p[None, :] < P), other=0.0)
        k1, k2 = k1.to(tl.float32), k2.to(tl.float32)
        if IEEE:
            s = tl.dot(q1, tl.trans(k1), input_precision="ieee") + \
                tl.dot(q2, tl.trans(k2), input_precision="ieee")
        else:
            s = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
        s = tl.where(ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a tile with nothing selected yet
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, k1, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p, k1)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + t * so_t + offs_h[:, None] * so_h + offs_r[None, :],
             out.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & (offs_r[None, :] < R))


def fused_mla_sparse_attention(q: torch.Tensor, latents: torch.Tensor, indices: torch.Tensor,
                               r: int, scale: float, *, block_h: int = 16,
                               block_k: int = 32) -> torch.Tensor:
    """As `naive_mla_sparse_attention`: q [T, H, R + P], latents [S, R + P], indices [T, K]
    (-1 = none) -> [T, H, R] in q's dtype."""
    t, h, width = q.shape
    if latents.shape[-1] != width or indices.shape[0] != t or not 0 < r < width:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, latents {tuple(latents.shape)}, "
                         f"indices {tuple(indices.shape)}, r={r}")
    q, latents = q.contiguous(), latents.contiguous()
    indices = indices.to(torch.int64).contiguous()
    out = torch.empty(t, h, r, dtype=q.dtype, device=q.device)
    if t:
        _mla_sparse_kernel[(t, triton.cdiv(h, block_h))](
            q, latents, indices, out, indices.shape[1], scale, q.stride(0), q.stride(1),
            latents.stride(0), indices.stride(0), out.stride(0), out.stride(1), h, R=r,
            P=width - r, BLOCK_H=block_h, BLOCK_R=max(16, triton.next_power_of_2(r)),
            BLOCK_P=max(16, triton.next_power_of_2(width - r)), BLOCK_K=block_k,
            IEEE=q.dtype == torch.float32)
    return out
