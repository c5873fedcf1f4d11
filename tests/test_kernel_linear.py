"""Decode GEMVs: `fused_gemv` against `naive_gemv`, `fused_qkv_gemv` against `naive_qkv_gemv`
(kernels/linear)."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, DTYPES, REAL_SHAPES, TOL, assert_close, needs_triton, poisoned, stale_caches

pytestmark = [pytest.mark.usefixtures("few_gemv_configs"), needs_triton]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 37, 200), (3, 64, 129), (1, 8, 64)])
@pytest.mark.parametrize("fusion", ["plain", "norm", "norm+swiglu", "residual"])
def test_gemv(m, n, k, fusion, dtype):
    from docqa.kernels.linear import fused_gemv, naive_gemv

    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = (torch.randn(m, k, generator=g) * 2).to(DEVICE, dtype)
    rows = 2 * n if "swiglu" in fusion else n
    w = (torch.randn(rows, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    kw = {}
    if "norm" in fusion:
        kw.update(norm_weight=(1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, dtype), eps=1e-5)
    if "swiglu" in fusion:
        kw.update(swiglu=True)
    if fusion == "residual":
        kw.update(residual=torch.randn(m, n, generator=g).to(DEVICE, dtype))
    ref = naive_gemv(x, w, **kw)
    out = fused_gemv(x, w, out=poisoned(ref), **kw)
    assert_close(out, ref, TOL[dtype])


def test_gemv_refuses_what_it_cannot_do():
    from docqa.kernels.linear import fused_gemv

    x = torch.randn(1, 8, device=DEVICE)
    with pytest.raises(ValueError, match="do not multiply"):
        fused_gemv(x, torch.randn(4, 9, device=DEVICE))
    with pytest.raises(ValueError, match="use a GEMM"):
        fused_gemv(torch.randn(17, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="even number"):
        fused_gemv(x, torch.randn(5, 8, device=DEVICE), swiglu=True)


# The interpreter runs the qkv GEMV's programs one by one (~45 ms each, (H + 2 Hkv) * D / 8 of
# them): on CPU two of the real shapes with bf16 caches, on the GPU all of them.
QKV_CASES = [(16, 2, dt) for dt in (torch.float32, torch.bfloat16)] + [
    (d, g, dt) for d, g in REAL_SHAPES if DEVICE == "cuda" or (d, g) in ((64, 1), (128, 4))
    for dt in ((torch.float32, torch.bfloat16) if DEVICE == "cuda" else (torch.bfloat16,))]


@pytest.mark.parametrize("d,group,cache_dtype", QKV_CASES)
def test_qkv_gemv_matches_reference(d, group, cache_dtype):
    """The decode qkv projection with RoPE, KV append and descriptor updates folded in equals
    the reference (GEMV, RoPE, `naive_append_kv`), over steps that open a block."""
    from docqa.kernels.linear import fused_qkv_gemv, naive_qkv_gemv
    from docqa.kernels.rope import rope_cos_sin

    hkv = 2 if group < 4 else 1
    hq, k, bs = group * hkv, 48, 4
    n = (hq + 2 * hkv) * d
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE)
    caches = [stale_caches(12, 3, hkv, d, cache_dtype) for _ in range(2)]
    steps = (2, 3, 4, 5) if d == 16 else (3, 4)  # 4 opens block 1: stale descriptors must be forgotten
    for p in steps:
        x = torch.randn(1, k, generator=g).to(DEVICE)
        pos = torch.tensor([p], device=DEVICE, dtype=torch.int32)
        cos, sin = rope_cos_sin(pos, d)
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        ref = naive_qkv_gemv(x, w, nw, 1e-5, cos, sin, hq, hkv, pos, *caches[0], bs)
        out = fused_qkv_gemv(x, w, nw, 1e-5, cos, sin, hq, hkv, pos, *caches[1], bs, out=poisoned(ref))
        assert_close(out, ref, 1e-5)
    for a, b in zip(caches[0], caches[1]):
        assert torch.allclose(a.float()[: 6 if a.shape[0] == 12 else None], b.float()[: 6 if b.shape[0] == 12 else None],
                              atol=1e-5, rtol=1e-2 if cache_dtype == torch.bfloat16 else 1e-5, equal_nan=True)
    assert not torch.isnan(caches[1][0][steps[0]:steps[-1] + 1].float()).any()
