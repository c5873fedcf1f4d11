"""Attention references against direct fp64 computations, on awkward shapes."""

from __future__ import annotations

import math

import pytest
import torch

from docqa.kernels.attention import (
    merge_attention,
    naive_attention,
    naive_block_descriptors,
    naive_block_scores,
    naive_sparse_attention,
    naive_topk_blocks,
)

SHAPES = [  # (T, q_offset, Hq, Hkv, D)
    (63, 0, 6, 2, 60),  # GQA 3:1, odd T, D=60
    (500, 0, 4, 1, 64),  # GQA 4:1
    (37, 100, 8, 2, 64),  # a chunk after a prefix
    (1, 211, 3, 1, 60),  # decode
]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output"
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def data(t, off, hq, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = off + t
    return (torch.randn(t, hq, d, generator=g), torch.randn(n, hkv, d, generator=g),
            torch.randn(n, hkv, d, generator=g))


def ref_attention(q, k, v, q_offset, allowed=None):
    """Direct fp64 softmax attention; allowed: bool [Hkv, T, N] restricting the causal keys."""
    t, hq, d = q.shape
    n, hkv = k.shape[:2]
    g = hq // hkv
    i = torch.arange(q_offset, q_offset + t)[:, None]
    causal = torch.arange(n)[None, :] <= i
    out = torch.zeros(t, hq, d, dtype=torch.float64)
    lse = torch.zeros(t, hq, dtype=torch.float64)
    for h in range(hq):
        kv = h // g
        s = q[:, h].double() @ k[:, kv].double().T / math.sqrt(d)  # [T, N]
        keep = causal if allowed is None else causal & allowed[kv]
        s = s.masked_fill(~keep, -math.inf)
        lse[:, h] = torch.logsumexp(s, 1)
        out[:, h] = torch.softmax(s, 1) @ v[:, kv].double()
    return out, lse


def allowed_mask(hkv, q_offset, t, n, rule):
    """bool [Hkv, T, N] from a per-element rule(kv, i, j) written as plain Python."""
    return torch.tensor([[[rule(kv, q_offset + ti, j) for j in range(n)] for ti in range(t)]
                         for kv in range(hkv)])


@pytest.mark.parametrize("shape", SHAPES)
def test_dense_attention_matches_fp64(shape):
    t, off, hq, hkv, d = shape
    q, k, v = data(*shape)
    out, lse = naive_attention(q, k, v, off)
    ref, ref_lse = ref_attention(q, k, v, off)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(lse, ref_lse) < 1e-5


@pytest.mark.parametrize("n,block", [(63, 16), (500, 64), (128, 64)])
def test_block_descriptors_match_loops(n, block):
    k = torch.randn(n, 3, 60, generator=torch.Generator().manual_seed(1))
    kmin, kmax, kmean = naive_block_descriptors(k, block)
    nb = -(-n // block)
    assert kmin.shape == (nb, 3, 60)
    for b in range(nb):
        part = k[b * block:(b + 1) * block].double()
        assert torch.equal(kmin[b].double(), part.min(0).values)
        assert torch.equal(kmax[b].double(), part.max(0).values)
        assert rel_err(kmean[b], part.mean(0)) < 1e-6


@pytest.mark.parametrize("method", ["minmax", "mean"])
def test_block_scores_match_loops_and_bound(method):
    gen = torch.Generator().manual_seed(2)
    t, hq, hkv, d, n, block = 5, 6, 2, 60, 200, 16
    q, k = torch.randn(t, hq, d, generator=gen), torch.randn(n, hkv, d, generator=gen)
    kmin, kmax, kmean = naive_block_descriptors(k, block)
    scores = naive_block_scores(q, kmin, kmax, kmean, method)
    g = hq // hkv
    for kv in range(hkv):
        for b in range(kmin.shape[0]):
            best = -math.inf
            for h in range(kv * g, (kv + 1) * g):
                x = q[:, h].double()
                if method == "minmax":
                    s = torch.maximum(x * kmin[b, kv].double(), x * kmax[b, kv].double()).sum(-1)
                    true = (x @ k[b * block:(b + 1) * block, kv].double().T).max()
                    assert (s >= true - 1e-9).all()  # an upper bound of every q.k in the block
                else:
                    s = x @ kmean[b, kv].double()
                best = max(best, s.max().item())
            assert abs(scores[kv, b].item() - best) < 1e-4 * max(1.0, abs(best))


def test_topk_excludes_sink_and_window_blocks():
    scores = torch.tensor([[9.0, 1, 5, 3, 8, 7, 9], [0.0, 4, 1, 6, 2, 0, 9]])
    idx = naive_topk_blocks(scores, 2, first=1, end=5)
    assert idx.tolist() == [[2, 4], [1, 3]]
    assert naive_topk_blocks(scores, 10, first=1, end=5).tolist() == [[1, 2, 3, 4]] * 2
    assert naive_topk_blocks(scores, 3, first=4, end=4).shape == (2, 0)


@pytest.mark.parametrize("shape", SHAPES)
def test_sparse_attention_matches_fp64_masked(shape):
    t, off, hq, hkv, d = shape
    q, k, v = data(*shape, seed=3)
    n, block, sinks, window = off + t, 16, 4, 24
    nb = -(-n // block)
    gen = torch.Generator().manual_seed(4)
    block_idx = torch.stack([torch.randperm(nb, generator=gen)[: min(3, nb)].sort().values for _ in range(hkv)])
    block_idx[0, -1] = -1  # an unused slot
    chosen = [set(x for x in row.tolist() if x >= 0) for row in block_idx]

    def allowed(kv, i, j):
        return j < sinks or j > i - window or j // block in chosen[kv]

    out, lse = naive_sparse_attention(q, k, v, off, block_idx, block, sinks, window)
    ref, ref_lse = ref_attention(q, k, v, off, allowed_mask(hkv, off, t, n, allowed))
    assert rel_err(out, ref) < 1e-5
    assert rel_err(lse, ref_lse) < 1e-5


def test_sparse_attention_with_every_block_equals_dense():
    q, k, v = data(40, 300, 6, 2, 64, seed=5)
    nb = -(-340 // 32)
    every = torch.arange(nb).expand(2, nb)
    out, lse = naive_sparse_attention(q, k, v, 300, every, 32, 4, 64)
    ref, ref_lse = ref_attention(q, k, v, 300)
    assert rel_err(out, ref) < 1e-5 and rel_err(lse, ref_lse) < 1e-5


def test_merge_of_disjoint_parts_equals_whole():
    q, k, v = data(7, 93, 4, 2, 60, seed=6)
    i0 = 93

    first = torch.arange(100)[None, None, :].expand(2, 7, 100) < 50
    o1, l1 = ref_attention(q, k, v, i0, first)
    o2, l2 = ref_attention(q, k, v, i0, ~first)
    out, lse = merge_attention(o1.float(), l1.float(), o2.float(), l2.float())
    ref, ref_lse = ref_attention(q, k, v, i0)
    assert rel_err(out, ref) < 1e-5 and rel_err(lse, ref_lse) < 1e-6
    # An empty part (lse -inf) contributes nothing and makes no NaN.
    empty = torch.full_like(l1.float(), -math.inf)
    out, lse = merge_attention(torch.zeros_like(o1.float()), empty, ref.float(), ref_lse.float())
    assert rel_err(out, ref) < 1e-6


def test_bad_shapes_are_rejected():
    q, k, v = data(4, 0, 5, 2, 16)
    with pytest.raises(ValueError):
        naive_attention(q, k, v, 0)  # 5 query heads over 2 kv heads
    q, k, v = data(4, 0, 4, 2, 16)
    with pytest.raises(ValueError):
        naive_attention(q, k, v, 1)  # queries beyond the keys
