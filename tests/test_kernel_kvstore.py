"""KV store: `fused_store_kv_blocks`, `fused_append_kv` and `fused_rope_append` against
`naive_store_kv_blocks`, `naive_append_kv` and `naive_rope_append` (kernels/attention), and the
descriptors they keep against `naive_block_descriptors` of the keys."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, assert_close, needs_triton, stale_caches

from docqa.kernels.attention import naive_append_kv, naive_block_descriptors, naive_store_kv_blocks, ring_row

pytestmark = needs_triton


def test_append_kv_keeps_descriptors_equal_to_reference():
    from docqa.kernels.attention.triton_kvstore import fused_append_kv

    n, hkv, d, bs = 40, 2, 60, 16
    k = torch.randn(n, hkv, d, device=DEVICE)
    v = torch.randn(n, hkv, d, device=DEVICE)
    kc, vc = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    kmin = torch.randn(3, hkv, d, device=DEVICE)  # stale contents must be forgotten
    kmax, kmean = kmin.clone(), kmin.clone()
    ksum = torch.randn(hkv, d, device=DEVICE)
    for p in range(n):
        fused_append_kv(k[p:p + 1], v[p:p + 1], kc, vc, kmin, kmax, torch.tensor([p], device=DEVICE), bs,
                        kmean=kmean, ksum=ksum)
    rmin, rmax, rmean = naive_block_descriptors(k, bs)
    assert torch.equal(kc, k) and torch.equal(vc, v)
    assert torch.equal(kmin, rmin) and torch.equal(kmax, rmax)
    assert torch.allclose(kmean, rmean, atol=1e-6)  # the last block is partial: its mean so far


@pytest.mark.parametrize("bias,norm", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rope_append_matches_reference(bias, norm, cache_dtype):
    """Qwen2's biases / Qwen3's q/k norms + RoPE + the KV append in one decode launch equal the
    PyTorch reference (kernels/attention/naive.py), over steps that open a block, in a ring."""
    from docqa.kernels.attention import naive_rope_append
    from docqa.kernels.attention.triton_kvstore import fused_rope_append
    from docqa.kernels.rope import rope_cos_sin

    hq, hkv, d, bs = 4, 2, 24, 4  # D/2 = 12: not a power of two (masked lanes)
    g = torch.Generator().manual_seed(5)
    b = torch.randn((hq + 2 * hkv) * d, generator=g).to(DEVICE) if bias else None
    qn = (1 + 0.2 * torch.randn(d, generator=g)).to(DEVICE) if norm else None
    kn = (1 + 0.2 * torch.randn(d, generator=g)).to(DEVICE) if norm else None
    caches = [stale_caches(10, 4, hkv, d, cache_dtype) for _ in range(2)]
    ring = (4, 6)  # positions 4.. wrap in a 6-row ring: 11 -> row 5, 12 -> row 4
    for p in (3, 4, 5, 11, 12):
        qkv = (3 * torch.randn(1, (hq + 2 * hkv) * d, generator=g)).to(DEVICE)
        pos = torch.tensor([p], device=DEVICE, dtype=torch.int32)
        cos, sin = (t.contiguous() for t in rope_cos_sin(pos, d, theta=10000.0))
        ref = naive_rope_append(qkv.clone(), b, qn, kn, 1e-6, cos, sin, hq, hkv, pos, *caches[0], bs, ring=ring)
        out = fused_rope_append(qkv, b, qn, kn, 1e-6, cos, sin, hq, hkv, pos, *caches[1], bs, ring=ring)
        assert out.data_ptr() == qkv.data_ptr()
        assert_close(out, ref, 1e-5)
    for a, c in zip(caches[0], caches[1]):
        assert torch.allclose(a.float(), c.float(), atol=1e-5, rtol=1e-2 if cache_dtype == torch.bfloat16 else 1e-5,
                              equal_nan=True)


def test_append_kv_matches_reference_in_a_ring():
    from docqa.kernels.attention import naive_append_kv
    from docqa.kernels.attention.triton_kvstore import fused_append_kv

    hkv, d, bs, ring = 2, 20, 4, (4, 8)
    g = torch.Generator().manual_seed(2)
    states = [[torch.zeros(12, hkv, d, device=DEVICE), torch.zeros(12, hkv, d, device=DEVICE),
               *(torch.randn(6, hkv, d, generator=torch.Generator().manual_seed(1)).to(DEVICE) for _ in range(3)),
               torch.zeros(hkv, d, device=DEVICE)] for _ in range(2)]
    for p in range(0, 22):
        k, v = torch.randn(1, hkv, d, generator=g).to(DEVICE), torch.randn(1, hkv, d, generator=g).to(DEVICE)
        pos = torch.tensor([p], device=DEVICE)
        kc, vc, kmin, kmax, kmean, ksum = states[0]
        naive_append_kv(k, v, kc, vc, kmin, kmax, pos, bs, kmean, ksum, ring)
        kc, vc, kmin, kmax, kmean, ksum = states[1]
        fused_append_kv(k, v, kc, vc, kmin, kmax, pos, bs, kmean=kmean, ksum=ksum, ring=ring)
    for a, c in zip(*states):
        assert torch.allclose(a, c, atol=1e-6)


@pytest.mark.parametrize("start,t", [(40, 24), (70, 30)])
def test_store_and_append_into_a_ring(start, t):
    """A tiered GPU pool: positions past `pin` wrap in a ring of rows. The prefill store and the
    decode append write each key at its ring row, with descriptors per logical block."""
    from docqa.kernels.attention.triton_kvstore import fused_append_kv, fused_store_kv_blocks

    hkv, d, bs, pin, ring = 2, 16, 8, 16, 48
    n = start + t
    g = torch.Generator().manual_seed(start)
    keys = torch.randn(n + 1, hkv, d, generator=g).to(DEVICE)
    vals = torch.randn(n + 1, hkv, d, generator=g).to(DEVICE)
    row = lambda p: p if p < pin else pin + (p - pin) % ring
    kc = torch.full((pin + ring, hkv, d), float("nan"), device=DEVICE)
    vc = torch.full_like(kc, float("nan"))
    b0 = start // bs
    for p in range(b0 * bs, start):  # the open block's earlier keys, as an earlier chunk left them
        kc[row(p)], vc[row(p)] = keys[p], vals[p]
    nb = -(-(n + 1) // bs)
    kmin, kmax, kmean = (torch.full((nb, hkv, d), float("nan"), device=DEVICE) for _ in range(3))
    ksum = torch.zeros(hkv, d, device=DEVICE)
    fused_store_kv_blocks(keys[start:n], vals[start:n], kc, vc, kmin, kmax, start, bs, kmean=kmean, ksum=ksum,
                          ring=(pin, ring))
    pos = torch.tensor([n], dtype=torch.int32, device=DEVICE)
    fused_append_kv(keys[n:], vals[n:], kc, vc, kmin, kmax, pos, bs, kmean=kmean, ksum=ksum, ring=(pin, ring))
    for p in range(start, n + 1):
        assert torch.equal(kc[row(p)], keys[p]) and torch.equal(vc[row(p)], vals[p])
    rmin, rmax, rmean = naive_block_descriptors(keys, bs)
    b1 = nb
    assert torch.equal(kmin[b0:b1], rmin[b0:b1]) and torch.equal(kmax[b0:b1], rmax[b0:b1])
    assert torch.allclose(kmean[b0:b1], rmean[b0:b1], atol=1e-5)


@pytest.mark.parametrize("start,t", [(0, 32), (10, 40), (16, 5)])
def test_store_kv_blocks_matches_reference_descriptors(start, t):
    """A prefill chunk's KV store with its descriptors, partial blocks at both ends: the cache
    holds the keys, and every touched block's min/max/mean (over earlier keys too) and the
    last block's fp32 sum equal the reference."""
    from docqa.kernels.attention.triton_kvstore import fused_store_kv_blocks

    hkv, d, bs, n_cap = 2, 24, 16, 64
    g = torch.Generator().manual_seed(start * 100 + t)
    keys = torch.randn(start + t, hkv, d, generator=g).to(DEVICE)
    vals = torch.randn(start + t, hkv, d, generator=g).to(DEVICE)
    kc = torch.full((n_cap, hkv, d), float("nan"), device=DEVICE)
    vc = torch.full((n_cap, hkv, d), float("nan"), device=DEVICE)
    kc[:start], vc[:start] = keys[:start], vals[:start]
    nb = n_cap // bs
    kmin, kmax, kmean = (torch.full((nb, hkv, d), float("nan"), device=DEVICE) for _ in range(3))
    ksum = torch.full((hkv, d), float("nan"), device=DEVICE)
    qkv = torch.cat([keys[start:], vals[start:]], dim=1)  # strided views, as in the model
    fused_store_kv_blocks(qkv[:, :hkv], qkv[:, hkv:], kc, vc, kmin, kmax, start, bs, kmean=kmean, ksum=ksum)
    end = start + t
    assert torch.equal(kc[:end], keys) and torch.equal(vc[:end], vals)
    assert torch.isnan(kc[end:]).all()  # nothing past the chunk written
    rmin, rmax, rmean = naive_block_descriptors(keys, bs)
    b0, b1 = start // bs, -(-end // bs)
    assert torch.equal(kmin[b0:b1], rmin[b0:b1]) and torch.equal(kmax[b0:b1], rmax[b0:b1])
    assert torch.allclose(kmean[b0:b1], rmean[b0:b1], atol=1e-6)
    assert torch.isnan(kmin[b1:]).all() and (b0 == 0 or torch.isnan(kmin[:b0]).all())
    last = keys[(b1 - 1) * bs:end].sum(0)
    assert torch.allclose(ksum, last, atol=1e-5)



@pytest.mark.parametrize("ring", [None, (128, 192)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,hkv", [(64, 1), (128, 2), (64, 8)])
def test_store_then_append_match_references_real_shapes(d, hkv, cache_dtype, ring):
    """Blocks of 64 keys, head dims 64 / 128, 1-8 kv heads: a prefill chunk stored after an
    earlier one left a block half full, then decode appends that open a block, against the
    references with the same arguments (in a tiered pool's ring too)."""
    from docqa.kernels.attention.triton_kvstore import fused_append_kv, fused_store_kv_blocks

    bs, start, t = 64, 100, 90  # rows 100..189: blocks 1 (half stored before) to 2
    ring = ring or (0, 1 << 62)
    g = torch.Generator().manual_seed(d + hkv)
    keys = torch.randn(start + t + 3, hkv, d, generator=g).to(DEVICE)
    vals = torch.randn(start + t + 3, hkv, d, generator=g).to(DEVICE)
    states = [list(stale_caches(ring[0] + ring[1] if ring[0] else 256, 4, hkv, d, cache_dtype)) for _ in range(2)]
    for kc, vc, *_ in states:  # the open block's earlier keys, as an earlier chunk stored them
        rows = ring_row(torch.arange(64, start, device=DEVICE), ring)
        kc[rows], vc[rows] = keys[64:start].to(cache_dtype), vals[64:start].to(cache_dtype)
    naive_store_kv_blocks(keys[start:start + t], vals[start:start + t], *states[0][:4], start, bs,
                          states[0][4], states[0][5], ring=ring)
    fused_store_kv_blocks(keys[start:start + t], vals[start:start + t], *states[1][:4], start, bs,
                          kmean=states[1][4], ksum=states[1][5], ring=ring)
    for p in range(start + t, start + t + 3):  # 190, 191, then 192 opens block 3
        pos = torch.tensor([p], device=DEVICE)
        naive_append_kv(keys[p:p + 1], vals[p:p + 1], *states[0][:4], pos, bs, states[0][4], states[0][5], ring)
        fused_append_kv(keys[p:p + 1], vals[p:p + 1], *states[1][:4], pos, bs, kmean=states[1][4], ksum=states[1][5],
                        ring=ring)
    rows = ring_row(torch.arange(64, start + t + 3, device=DEVICE), ring)
    (kc, vc, kmin, kmax, kmean, ksum), (kc2, vc2, kmin2, kmax2, kmean2, ksum2) = states
    # bf16: the interpreter rounds fp32 -> bf16 differently from torch (one unit in the last place
    # of some keys), and a decode append sums the key before its rounding: means over 64 keys
    # differ by a few 1e-4
    rtol = 1e-2 if cache_dtype == torch.bfloat16 else 0.0
    mean_atol = 2e-3 if rtol else 1e-5

    def same(a, b):
        assert torch.allclose(a.float(), b.float(), rtol=rtol, atol=1e-5 if rtol else 0.0)

    same(kc2[rows], kc[rows])
    same(vc2[rows], vc[rows])
    same(kmin2[1:4], kmin[1:4])
    same(kmax2[1:4], kmax[1:4])
    assert torch.allclose(kmean2[1:4].float(), kmean[1:4].float(), atol=mean_atol, rtol=rtol or 1e-5)
    assert torch.allclose(ksum2, ksum, atol=1e-4, rtol=rtol or 1e-5)
    assert torch.equal(kmin2[0], kmin[0])  # block 0 untouched by both (its stale values)
    # and the reference's descriptors are those of the keys as stored
    rmin, rmax, rmean = naive_block_descriptors(kc[rows].float(), bs)
    assert torch.equal(kmin[1:4].float(), rmin.to(kmin.dtype).float())
    assert torch.equal(kmax[1:4].float(), rmax.to(kmax.dtype).float())
    assert torch.allclose(kmean[1:4].float(), rmean, atol=mean_atol, rtol=rtol or 1e-5)
