"""Triton RoPE (rotate_half halves, or interleaved pairs): one program per token, all heads at once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, y_ptr,
    sx_t, sx_h, sy_t, sy_h, sc_t, n_heads, half,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < half)
    c = tl.load(cos_ptr + t * sc_t + d, mask=d < half, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * sc_t + d, mask=d < half, other=0.0).to(tl.float32)
    # the pair turned by angle d: (d, d + half), or (2d, 2d + 1) interleaved
    first = 2 * d if INTERLEAVED else d
    other = 1 if INTERLEAVED else half
    xp = x_ptr + t * sx_t + h * sx_h + first
    x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xp + other, mask=mask, other=0.0).to(tl.float32)
    yp = y_ptr + t * sy_t + h * sy_h + first
    ty = y_ptr.dtype.element_ty
    tl.store(yp, (x1 * c - x2 * s).to(ty), mask=mask)
    tl.store(yp + other, (x2 * c + x1 * s).to(ty), mask=mask)


def fused_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None, *,
    interleaved: bool = False,
) -> torch.Tensor:
    """Rotate x [T, H, D] by angles cos, sin [T, D/2] (rotate_half convention: pairs (d, d + D/2);
    interleaved: pairs (2d, 2d + 1), as GLM's MLA); the duplicated HF layout [T, 1, D] of
    `engine.rope.Rope.cos_sin` is accepted too. x and out may be strided views.

    `out` may be x itself (in place: each program reads its pairs before writing them).
    """
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"x must be [T, H, D] with even D, got {tuple(x.shape)}")
    t, h, d = x.shape
    if cos.dim() == 3 and cos.shape[1] == 1 and cos.shape[2] == d:
        # engine/rope.py's HF layout [T, 1, D] repeats the D/2 angles: keep one copy
        cos, sin = cos[:, 0, : d // 2], sin[:, 0, : d // 2]
    if cos.shape != (t, d // 2) or sin.shape != cos.shape:
        raise ValueError(f"cos/sin must be [{t}, {d // 2}], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if x.stride(-1) != 1:
        raise ValueError("x must be contiguous in its last dimension")
    cos, sin = cos.contiguous(), sin.contiguous()
    if out is None:
        out = torch.empty_like(x)
    if out.shape != x.shape or out.stride(-1) != 1:
        raise ValueError("out must be shaped like x, contiguous in its last dimension")
    if t:
        _rope_kernel[(t,)](
            x, cos, sin, out, x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos.stride(0), h, d // 2,
            BLOCK_H=triton.next_power_of_2(h), BLOCK_D=triton.next_power_of_2(d // 2), INTERLEAVED=interleaved,
            num_warps=4,
        )
    return out
