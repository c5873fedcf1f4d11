"""Token-sparse MLA attention kernel (kernels/mla_sparse) against its PyTorch reference, and the
reference against dense causal attention when every earlier token is selected.

On CPU under TRITON_INTERPRET=1 on tiny shapes; on CUDA the same cases run on the GPU."""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

pytestmark = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                reason="needs triton and either CUDA or TRITON_INTERPRET=1")

DEVICE = "cuda" if has_cuda() and not interpreting() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def _selection(t, s, k, start, g):
    """Each query's k random earlier-or-same tokens (fewer when it has fewer), -1 padded."""
    rows = []
    for i in range(t):
        visible = start + i + 1
        pick = torch.randperm(visible, generator=g)[:k].tolist()
        rows.append(pick + [-1] * (k - len(pick)))
    return torch.tensor(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, h, r, p, s, k, start", [
    (1, 4, 32, 16, 200, 24, 199),  # decode
    (6, 20, 40, 8, 90, 17, 84),  # chunked prefill: heads past one block, R and P not powers of 2
    (5, 3, 64, 16, 40, 64, 0),  # first chunk: rows with fewer tokens than k (-1 padding)
])
def test_mla_sparse_attention(t, h, r, p, s, k, start, dtype):
    from docqa.kernels.mla_sparse import fused_mla_sparse_attention, naive_mla_sparse_attention

    g = torch.Generator().manual_seed(t * 100 + h)
    q = torch.randn(t, h, r + p, generator=g).to(dtype)
    lat = torch.randn(s, r + p, generator=g).to(dtype)
    idx = _selection(t, s, k, start, g)
    want = naive_mla_sparse_attention(q.float(), lat.float(), idx, r, (r + p) ** -0.5)
    got = fused_mla_sparse_attention(q.to(DEVICE), lat.to(DEVICE), idx.to(DEVICE), r,
                                     (r + p) ** -0.5).cpu()
    assert got.dtype == dtype
    assert rel_err(got.float(), want) < TOL[dtype]


def test_reference_equals_dense_when_everything_is_selected():
    """All earlier tokens selected (in scrambled order): the causal dense result."""
    from docqa.kernels.mla_sparse import naive_mla_sparse_attention

    g = torch.Generator().manual_seed(0)
    t, h, r, p, start = 7, 4, 24, 8, 20
    q, lat = torch.randn(t, h, r + p, generator=g), torch.randn(start + t, r + p, generator=g)
    idx = torch.stack([torch.cat((torch.randperm(start + i + 1, generator=g),
                                  torch.full((t - 1 - i,), -1))) for i in range(t)])
    got = naive_mla_sparse_attention(q, lat, idx, r, 0.3)
    scores = torch.einsum("thd,sd->hts", q, lat) * 0.3
    causal = torch.arange(start + t)[None, :] <= torch.arange(start, start + t)[:, None]
    dense = torch.einsum("hts,sr->thr", scores.masked_fill(~causal, float("-inf")).softmax(-1),
                         lat[:, :r])
    assert rel_err(got, dense) < 1e-6


def test_row_with_nothing_selected_is_zero():
    from docqa.kernels.mla_sparse import fused_mla_sparse_attention

    q, lat = torch.randn(2, 4, 48), torch.randn(10, 48)
    idx = torch.tensor([[3, 5, -1], [-1, -1, -1]])
    got = fused_mla_sparse_attention(q.to(DEVICE), lat.to(DEVICE), idx.to(DEVICE), 32, 0.2).cpu()
    assert torch.equal(got[1], torch.zeros(4, 32)) and got[0].abs().sum() > 0
