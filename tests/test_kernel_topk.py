"""Top-k of block scores: the references by hand, and `fused_topk_blocks`,
`fused_topk_blocks_unsorted`, `fused_decode_topk` against theirs (kernels/attention)."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, needs_triton

from docqa.kernels.attention import (
    naive_block_descriptors,
    naive_block_scores,
    naive_decode_topk,
    naive_topk_blocks,
    naive_topk_blocks_unsorted,
)


def test_topk_excludes_sink_and_window_blocks():
    scores = torch.tensor([[9.0, 1, 5, 3, 8, 7, 9], [0.0, 4, 1, 6, 2, 0, 9]])
    idx = naive_topk_blocks(scores, 2, first=1, end=5)
    assert idx.tolist() == [[2, 4], [1, 3]]
    assert naive_topk_blocks(scores, 10, first=1, end=5).tolist() == [[1, 2, 3, 4]] * 2
    assert naive_topk_blocks(scores, 3, first=4, end=4).shape == (2, 0)


def test_unsorted_and_decode_references_by_hand():
    scores = torch.tensor([[9.0, 1, 5, 3, 8, 7, 9], [0.0, 4, 1, 6, 2, 0, 9]])
    got = naive_topk_blocks_unsorted(scores, 3, 1, torch.tensor([[5], [3]]))  # per-row candidate ends
    assert [sorted(r) for r in got.tolist()] == [[2, 3, 4], [-1, 1, 2]]
    s = scores.clone()
    s[1, 3:] = float("-inf")  # three candidates in row 1
    assert [sorted(r) for r in naive_decode_topk(s, 4).tolist()][0] == [0, 4, 5, 6]
    out = torch.empty(2, 4, dtype=torch.long)
    dropped = naive_decode_topk(s, 4, out, drop_noncandidates=True)
    assert dropped is out and sorted(out[1].tolist()) == [-1, 0, 1, 2]


@needs_triton
def test_topk_blocks_matches_reference_and_pads():
    from docqa.kernels.attention.triton_topk import fused_topk_blocks

    scores = torch.randn(3, 20, device=DEVICE)
    ref = naive_topk_blocks(scores, 4, 1, 15)
    got = fused_topk_blocks(scores, 4, 1, torch.tensor(15, device=DEVICE))
    assert torch.equal(got, ref)
    few = fused_topk_blocks(scores, 4, 2, 4)
    assert torch.equal(few[:, :2], naive_topk_blocks(scores, 4, 2, 4)) and (few[:, 2:] == -1).all()


@needs_triton
@pytest.mark.parametrize("nb", [16, 100, 1024, 2500])
def test_decode_topk_matches_reference(nb):
    from docqa.kernels.attention.triton_topk import fused_decode_topk

    g = torch.Generator().manual_seed(nb)
    scores = torch.randn(3, nb, generator=g).to(DEVICE)
    scores[1, nb // 2:] = float("-inf")  # non-candidates: picked only when too few candidates
    got = fused_decode_topk(scores, 16)
    want = naive_decode_topk(scores, 16)
    for row in range(3):
        picked = got[row].tolist()
        assert len(set(picked)) == 16 and 0 <= min(picked) and max(picked) < nb  # distinct, in range
        best = [i for i in want[row].tolist() if torch.isfinite(scores[row, i])]
        assert set(best) <= set(picked)  # every finite winner of the reference is picked


@needs_triton
def test_decode_topk_small_tiles_many_blocks():
    """Past 1024 blocks the first pass uses tiles of 256..1024 (>= 2 tiles): same winners."""
    from docqa.kernels.attention.triton_topk import fused_decode_topk

    for nb in (1025, 2048, 4100):
        scores = torch.randn(2, nb, generator=torch.Generator().manual_seed(nb)).to(DEVICE)
        scores[1, :nb - 5] = float("-inf")  # 5 candidates only: the rest filled from non-candidates
        got = fused_decode_topk(scores, 16)
        assert set(got[0].tolist()) == set(naive_decode_topk(scores, 16)[0].tolist())
        assert set(range(nb - 5, nb)) <= set(got[1].tolist()) and len(set(got[1].tolist())) == 16


@needs_triton
@pytest.mark.parametrize("nb,end", [(20, 15), (20, 3), (1500, 1400)])
def test_topk_blocks_unsorted_same_sets_as_reference(nb, end):
    """Prefill routing's unsorted top-k: per routing chunk and head the same ids as the
    references (chunk-wise candidate ends), -1 for the slots no candidate fills."""
    from docqa.kernels.attention.triton_topk import fused_topk_blocks_unsorted

    scores = torch.randn(2, 3, nb, generator=torch.Generator().manual_seed(nb + end)).to(DEVICE)
    ends = torch.tensor([end, end - 2], device=DEVICE)[:, None, None]
    got = fused_topk_blocks_unsorted(scores, 8, 1, ends)
    same_sig = naive_topk_blocks_unsorted(scores, 8, 1, ends)
    assert got.shape == same_sig.shape == (2, 3, 8)
    for c in range(2):
        ref = naive_topk_blocks(scores[c], 8, 1, int(ends[c]))
        for h in range(3):
            want = [i for i in ref[h].tolist() if i >= 0]
            have = got[c, h].tolist()
            assert sorted(i for i in have if i >= 0) == sorted(want)
            assert have.count(-1) == 8 - len(want)
            assert sorted(have) == sorted(same_sig[c, h].tolist())


@needs_triton
@pytest.mark.parametrize("q0,t,chunk,nb_extra", [(40, 48, 16, 0), (300, 40, 16, 3), (5000, 40, 16, 0)])
def test_prefill_routing_folded_into_score_and_topk_kernels(q0, t, chunk, nb_extra):
    """Prefill routing with the candidate mask computed in the block-score kernel (per routing
    chunk, from q0 and the window) and -1 for non-candidate picks from the top-k kernels gives
    the id sets of the reference routing (scores, then top-k among each chunk's candidates)."""
    from docqa.kernels.attention.triton_block_scores import fused_block_scores
    from docqa.kernels.attention.triton_topk import fused_decode_topk, fused_topk_blocks_unsorted

    hq, hkv, d, bs, window, top_k = 4, 2, 16, 16, 32, 6
    n = q0 + t + nb_extra * bs
    g = torch.Generator().manual_seed(q0 + t)
    keys = torch.randn(n, hkv, d, generator=g).to(DEVICE)
    q = torch.randn(t, hq, d, generator=g).to(DEVICE)
    kmin, kmax, kmean = naive_block_descriptors(keys, bs)
    nb = kmin.shape[0]
    first = 1
    plain = naive_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk)
    folded = fused_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk,
                                chunk_candidates=(first, q0, window, bs))
    c = plain.shape[0]
    last = torch.clamp(torch.arange(1, c + 1) * chunk, max=t) - 1 + q0
    end = ((last - window + bs) // bs).clamp_min(0)
    ref = naive_topk_blocks_unsorted(plain, top_k, first, end.to(DEVICE)[:, None, None])
    got = fused_decode_topk(folded.view(-1, nb), top_k, drop_noncandidates=True).view(c, hkv, top_k)
    unsorted = fused_topk_blocks_unsorted(fused_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk), top_k,
                                          first, end.to(DEVICE)[:, None, None])
    for ci in range(c):
        for h in range(hkv):
            assert sorted(got[ci, h].tolist()) == sorted(unsorted[ci, h].tolist())
            if DEVICE == "cpu":  # the GPU's tf32 scores may swap near-equal blocks at the k-th place
                assert sorted(got[ci, h].tolist()) == sorted(ref[ci, h].tolist())
    assert (got == -1).any() or q0 > 200  # the short context leaves slots no candidate fills
