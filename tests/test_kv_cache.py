"""Segments, blocks and tiers of the segmented KV cache."""

from __future__ import annotations

import pytest
import torch

from docqa.engine.kv_cache import SegmentedKVCache
from docqa.engine.rope import Rope
from docqa.engine.settings import EngineSettings
from docqa.engine.sparse_state import SparseKVState
from docqa.kernels.attention import naive_block_descriptors

from test_sparse_attention import CFG, SMALL, feed, qkv, rel_err


def filled(n, seg=32, block=8, layers=2, **kw):
    cache = SegmentedKVCache(layers, 2, 4, segment_size=seg, block_size=block, **kw)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(n, 2, 4, generator=g), torch.randn(n, 2, 4, generator=g)
    p = 0
    for c in (5, 30, 1, n - 36):
        for layer in range(layers):
            cache.write(layer, p, k[p:p + c] + layer, v[p:p + c] - layer)
            cache.write_descriptors(layer, p // block, *naive_block_descriptors(
                cache.range(layer, (p // block) * block, p + c)[0], block))
        cache.commit(c)
        p += c
    return cache, k, v


def test_segments_and_blocks_bookkeeping():
    cache, k, v = filled(100)
    assert cache.num_tokens == 100
    assert [(s.start, s.length, s.full) for s in cache.segments] == [
        (0, 32, True), (32, 32, True), (64, 32, True), (96, 4, False)]
    assert torch.equal(cache.range(1, 0, 100)[0], k + 1)
    assert torch.equal(cache.range(0, 30, 70)[1], v[30:70])
    kmin, kmax, kmean = cache.descriptors(1, 13)
    ref = naive_block_descriptors(k + 1, 8)
    for got, want in zip((kmin, kmax, kmean), ref):
        assert torch.allclose(got, want)
    idx = torch.tensor([[0, 33, 99], [64, 5, 31]])
    gk, gv = cache.gather(0, idx)
    assert torch.equal(gk[0], k[[0, 33, 99], 0]) and torch.equal(gv[1], v[[64, 5, 31], 1])


def test_writes_must_append():
    cache, _, _ = filled(50)
    with pytest.raises(ValueError):
        cache.write(0, 10, torch.zeros(2, 2, 4), torch.zeros(2, 2, 4))


def test_truncate_then_append():
    cache, k, v = filled(100)
    cache.truncate(40)
    assert cache.num_tokens == 40 and len(cache.segments) == 2 and cache.segments[1].length == 8
    cache.write(0, 40, torch.ones(3, 2, 4), torch.ones(3, 2, 4))
    cache.commit(3)
    assert torch.equal(cache.range(0, 0, 43)[0][:40], k[:40])
    assert torch.equal(cache.range(0, 40, 43)[0], torch.ones(3, 2, 4))


def test_lru_spills_to_disk_and_reloads(tmp_path):
    cache, k, v = filled(100, live_segments=2, spill_dir=tmp_path)
    assert cache.resident_segments() <= 2 and cache.spills >= 2
    assert len(list(tmp_path.glob("*.safetensors"))) >= 2
    assert torch.equal(cache.range(1, 0, 100)[0], k + 1)  # pages everything back through LRU
    assert cache.loads >= 2 and cache.resident_segments() <= 2
    assert torch.equal(cache.descriptors(0, 13)[0], naive_block_descriptors(k, 8)[0])


def test_spilled_state_gives_identical_outputs(tmp_path):
    """A sparse state whose segments keep leaving memory answers exactly as one that keeps all."""
    n = sum([100, 37, 200, 63, 1, 1, 1, 97])
    q, k, v = qkv(n, seed=4)
    rope = Rope(CFG)
    chunks = [100, 37, 200, 63, 1, 1, 1, 97]
    keep = SparseKVState(CFG, EngineSettings(top_k=4, **SMALL), rope)
    ref = feed(keep, q, k, v, chunks, layers=2)
    tiered = SparseKVState(CFG, EngineSettings(top_k=4, live_segments=1, **SMALL), rope,
                           spill_dir=tmp_path)
    out = feed(tiered, q, k, v, chunks, layers=2)
    assert tiered.cache.spills > 0 and tiered.cache.loads > 0
    assert tiered.cache.resident_segments() <= 2  # the budget plus the segment being read
    assert torch.equal(out, ref)
    assert rel_err(out, ref) == 0.0
