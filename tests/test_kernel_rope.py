"""RoPE: `fused_rope` against `naive_rope` (kernels/rope), and the reference against the
rotate_half formula."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, DTYPES, TOL, assert_close, needs_triton, poisoned


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,d", [(1, 1, 2), (63, 3, 60), (17, 8, 128)])
def test_rope(t, h, d, dtype):
    from docqa.kernels.rope import fused_rope, naive_rope, rope_cos_sin

    g = torch.Generator().manual_seed(t * 100 + d)
    x = torch.randn(t, h, d, generator=g).to(DEVICE, dtype)
    pos = torch.randint(0, 1 << 20, (t,), generator=g).to(DEVICE)
    cos, sin = rope_cos_sin(pos, d)
    ref = naive_rope(x, cos, sin)
    assert_close(fused_rope(x, cos, sin, out=poisoned(x)), ref, TOL[dtype])
    # in place, on a strided view (q of a fused qkv projection)
    qkv = torch.randn(t, h + 2, d, generator=g).to(DEVICE, dtype)
    q = qkv[:, :h]
    ref2 = naive_rope(q, cos, sin)
    fused_rope(q, cos, sin, out=q)
    assert_close(q, ref2, TOL[dtype])


def test_rope_matches_rotate_half_formula():
    from docqa.kernels.rope import naive_rope, rope_cos_sin

    x = torch.randn(5, 2, 8, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(5), 8)
    c, s = torch.cat([cos, cos], -1)[:, None].double(), torch.cat([sin, sin], -1)[:, None].double()
    rot = torch.cat([-x[..., 4:], x[..., :4]], -1)
    assert torch.allclose(naive_rope(x, cos, sin), x * c + rot * s, atol=1e-6)


@needs_triton
def test_rope_accepts_engine_cos_sin_layout():
    from docqa.kernels.rope import fused_rope, naive_rope, rope_cos_sin

    x = torch.randn(9, 3, 60, device=DEVICE)
    cos, sin = rope_cos_sin(torch.arange(9, device=DEVICE) + 1000, 60)
    hf_cos, hf_sin = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    assert_close(fused_rope(x, hf_cos, hf_sin), naive_rope(x, cos, sin), 1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_interleaved_pairs_as_complex_rotation(dtype):
    """GLM's MLA convention: pairs (x0, x1), (x2, x3).. turned as complex numbers x0 + i x1 by
    e^(i angle); written into a strided view (the rope slice of a wider row), as the GLM decoder
    does."""
    from docqa.kernels.rope import fused_rope, rope_cos_sin

    g = torch.Generator().manual_seed(7)
    t, h, d = 13, 5, 64
    x = torch.randn(t, h, d, generator=g).to(DEVICE, dtype)
    pos = torch.randint(0, 1 << 17, (t,), generator=g).to(DEVICE)
    cos, sin = rope_cos_sin(pos, d)
    ref = torch.view_as_real(torch.view_as_complex(x.float().reshape(t, h, d // 2, 2)) *
                             torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))[:, None]).flatten(-2)
    wide = poisoned(torch.empty(t, h, d + 32, device=DEVICE, dtype=dtype))
    fused_rope(x, cos, sin, out=wide[..., 32:], interleaved=True)
    assert_close(wide[..., 32:], ref.to(dtype), TOL[dtype])
