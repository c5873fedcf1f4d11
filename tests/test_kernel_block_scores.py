"""Block descriptors and block scores: the references against loops in fp64, and
`fused_block_scores` against `naive_block_scores` (kernels/attention)."""

from __future__ import annotations

import math

import pytest
import torch

from kernel_check import DEVICE, REAL_SHAPES, assert_close, needs_triton, qkv

from docqa.kernels.attention import naive_block_descriptors, naive_block_scores


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
        assert_close(kmean[b], part.mean(0), 1e-6)


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


def test_block_scores_reference_chunks_and_candidates():
    """The reference's routing chunks are the scores of each chunk's queries, and its candidate
    masks leave -inf exactly outside first..end-1 (per chunk: from the window of its last query)."""
    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(10, 4, 16, generator=gen), torch.randn(160, 2, 16, generator=gen)
    desc = naive_block_descriptors(k, 16)
    per_chunk = naive_block_scores(q, *desc, chunk=4)
    assert per_chunk.shape == (3, 2, 10)
    for c, (a, b) in enumerate([(0, 4), (4, 8), (8, 10)]):
        assert torch.equal(per_chunk[c], naive_block_scores(q[a:b], *desc))
    plain = naive_block_scores(q, *desc)
    masked = naive_block_scores(q, *desc, candidates=(2, torch.tensor([7])))
    assert torch.equal(masked[:, 2:7], plain[:, 2:7]) and torch.isneginf(masked[:, [0, 1, 7, 8, 9]]).all()
    # queries at 100..109, window 32, blocks of 16: chunk ends 103, 107, 109 -> candidate ends
    # (103-32+16)//16 = 5, (107-32+16)//16 = 5, (109-32+16)//16 = 5; and from block 1
    folded = naive_block_scores(q, *desc, chunk=4, chunk_candidates=(1, 100, 32, 16))
    assert torch.isneginf(folded[:, :, [0, 5, 6, 7, 8, 9]]).all()
    assert torch.equal(folded[:, :, 1:5], per_chunk[:, :, 1:5])
    late = naive_block_scores(q, *desc, chunk=4, chunk_candidates=(1, 104, 32, 16))  # last 107, 111, 113: ends 5, 5, 6
    assert torch.isfinite(late[2, :, 5]).all() and torch.isneginf(late[:2, :, 5]).all()


@needs_triton
@pytest.mark.parametrize("method", ["minmax", "mean"])
@pytest.mark.parametrize("t,hq,hkv,d,n,bs", [(1, 4, 2, 60, 200, 16), (7, 6, 3, 32, 130, 32)])
def test_block_scores(method, t, hq, hkv, d, n, bs):
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    q, k, _ = qkv(t, hq, hkv, d, n, torch.float32, seed=n + t)
    kmin, kmax, kmean = naive_block_descriptors(k, bs)
    ref = naive_block_scores(q, kmin, kmax, kmean, method)
    out = fused_block_scores(q, kmin, kmax, kmean, method)
    assert_close(out, ref, 2e-3)


@needs_triton
def test_block_scores_candidate_mask():
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    q, k, _ = qkv(1, 4, 2, 32, 128, torch.float32, seed=2)
    kmin, kmax, kmean = naive_block_descriptors(k, 16)
    cand = (1, torch.tensor([5], device=DEVICE))
    ref = naive_block_scores(q, kmin, kmax, kmean, candidates=cand)
    got = fused_block_scores(q, kmin, kmax, kmean, candidates=cand)
    assert torch.isinf(got[:, [0, 5, 6, 7]]).all() and torch.isinf(ref[:, [0, 5, 6, 7]]).all()
    assert_close(got[:, 1:5], ref[:, 1:5], 2e-3)


@needs_triton
@pytest.mark.parametrize("method", ["minmax", "mean"])
@pytest.mark.parametrize("t,chunk", [(8, 4), (7, 7), (5, 2)])
def test_block_scores_unmasked_row_tiles(method, t, chunk):
    """Whole row tiles (no mask) then a ragged one: rows = chunk * group over 16-row tiles."""
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    q, k, _ = qkv(t, 8, 2, 32, 100, torch.float32, seed=t * 10 + chunk)
    q[::2] *= -3.0  # all-negative-ish rows must not lose to padding
    kmin, kmax, kmean = naive_block_descriptors(k, 16)
    out = fused_block_scores(q, kmin, kmax, kmean, method, chunk=chunk, tile=(16, 32))
    assert_close(out, naive_block_scores(q, kmin, kmax, kmean, method, chunk=chunk), 2e-3)
    for c in range(out.shape[0]):  # and each chunk alone, as the reference has always been called
        assert_close(out[c], naive_block_scores(q[c * chunk:(c + 1) * chunk], kmin, kmax, kmean, method), 2e-3)


@needs_triton
@pytest.mark.parametrize("q0,t,chunk", [(40, 48, 16), (300, 40, 16), (5000, 40, 16)])
def test_block_scores_chunk_candidates(q0, t, chunk):
    """Prefill routing's candidate mask computed in the kernel, per routing chunk from q0 and
    the window: the reference's scores, -inf at the same places."""
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    hq, hkv, d, bs, window = 4, 2, 16, 16, 32
    q, keys, _ = qkv(t, hq, hkv, d, q0 + t, seed=q0 + t)
    desc = naive_block_descriptors(keys, bs)
    args = dict(chunk=chunk, chunk_candidates=(1, q0, window, bs))
    got, ref = fused_block_scores(q, *desc, "minmax", **args), naive_block_scores(q, *desc, "minmax", **args)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref))
    assert_close(got[torch.isfinite(ref)], ref[torch.isfinite(ref)], 2e-3)


@needs_triton
@pytest.mark.parametrize("method", ["minmax", "mean"])
@pytest.mark.parametrize("d,group", REAL_SHAPES)
def test_block_scores_real_shapes(d, group, method):
    """Blocks of 64 keys, head dims 64 / 128, GQA groups 1-8: a decode step (candidates from a
    device tensor) and a prefill chunk of three routing chunks (candidates per chunk)."""
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    hkv, bs, window, n = 2, 64, 128, 1024
    q, k, _ = qkv(40, group * hkv, hkv, d, n, seed=d + group)
    desc = naive_block_descriptors(k, bs)
    dec = dict(candidates=(1, torch.tensor([12], device=DEVICE)))
    got, ref = fused_block_scores(q[:1], *desc, method, **dec), naive_block_scores(q[:1], *desc, method, **dec)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref))
    assert_close(got[:, 1:12], ref[:, 1:12], 2e-3)
    pre = dict(chunk=16, chunk_candidates=(1, n - 40, window, bs))
    got, ref = fused_block_scores(q, *desc, method, **pre), naive_block_scores(q, *desc, method, **pre)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref))
    assert_close(got[torch.isfinite(ref)], ref[torch.isfinite(ref)], 2e-3)
