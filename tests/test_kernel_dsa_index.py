"""DSA indexer kernels (kernels/dsa_index) against their PyTorch references, on awkward shapes.

On CPU under TRITON_INTERPRET=1 (scripts/test.sh sets it) on tiny shapes; on CUDA the same
cases run on the GPU. Outputs are poisoned with NaN first where the kernel writes into them."""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

pytestmark = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                reason="needs triton and either CUDA or TRITON_INTERPRET=1")

DEVICE = "cuda" if has_cuda() and not interpreting() else "cpu"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("t, h, d, s, start", [
    (5, 3, 24, 70, 65),  # a prefill chunk after a stored prefix, odd head count and width
    (1, 4, 32, 200, 199),  # decode
    (7, 16, 64, 130, 123),
    (9, 2, 16, 9, 0),  # the first chunk: everything after each query masked
])
def test_index_scores(t, h, d, s, start):
    from docqa.kernels.dsa_index import fused_index_scores, naive_index_scores

    g = torch.Generator().manual_seed(t * 1000 + s)
    q, k = torch.randn(t, h, d, generator=g), torch.randn(s, d, generator=g)
    w = torch.randn(t, h, generator=g)
    want = naive_index_scores(q, k, w, start, d ** -0.5)
    got = fused_index_scores(q.to(DEVICE), k.to(DEVICE), w.to(DEVICE), start, d ** -0.5).cpu()
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # the causal mask, exactly
    finite = torch.isfinite(want)
    assert rel_err(got[finite], want[finite]) < 1e-5


@pytest.mark.parametrize("t, s, k", [(3, 50, 8), (4, 3000, 64), (2, 40, 40), (5, 100, 2048)])
def test_index_topk_sets(t, s, k):
    from docqa.kernels.dsa_index import fused_index_topk, naive_index_topk

    g = torch.Generator().manual_seed(s + k)
    scores = torch.randn(t, s, generator=g)
    scores[1, s // 3:] = float("-inf")  # a row with few finite scores (an early query)
    if t > 2:
        scores[2] = -scores[2].abs()  # negative scores only: the int32 order must hold there
    got = fused_index_topk(scores.to(DEVICE), k).cpu()
    want = naive_index_topk(scores, k)
    assert got.shape == want.shape == (t, min(k, s))
    for row in range(t):
        mine = got[row].tolist()
        assert {i for i in mine if i >= 0} == {i for i in want[row].tolist() if i >= 0}, row
        assert mine.count(-1) == want[row].tolist().count(-1)
        real = [i for i in mine if i >= 0]
        assert real == sorted(real)  # ascending token order, each once


def test_index_topk_ties_fill_exactly_k():
    """Ties at the k-th value (relu makes exact zeros common): exactly k distinct indices, all
    strictly-better entries among them, the rest ties."""
    from docqa.kernels.dsa_index import fused_index_topk

    scores = torch.zeros(2, 300)
    scores[0, ::10] = torch.arange(30, dtype=torch.float32) + 1  # 30 positive, 270 zeros
    scores[1, 250:] = float("-inf")
    got = fused_index_topk(scores.to(DEVICE), 40).cpu()
    row = got[0].tolist()
    assert len(set(row)) == 40 and min(row) >= 0
    assert set(range(0, 300, 10)) <= set(row)
    assert all(scores[0, i] == 0 for i in set(row) - set(range(0, 300, 10)))
    assert len(set(got[1].tolist())) == 40 and max(got[1].tolist()) < 250
