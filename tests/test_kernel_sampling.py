"""Greedy sampling: `fused_argmax` against `naive_argmax` (kernels/sampling)."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, needs_triton


def test_naive_argmax_takes_the_first_of_tied_maxima():
    from docqa.kernels.sampling import naive_argmax

    x = torch.tensor([[1.0, 5.0, -2.0, 5.0]])
    out = torch.full((1,), -7, dtype=torch.long)
    assert naive_argmax(x, out=out) is out and out.tolist() == [1]


@needs_triton
@pytest.mark.parametrize("n", [7, 4096, 10000])
def test_argmax_matches_reference(n):
    from docqa.kernels.sampling import naive_argmax
    from docqa.kernels.sampling.triton_argmax import fused_argmax

    x = torch.randn(1, n, generator=torch.Generator().manual_seed(n)).to(DEVICE, torch.bfloat16)
    x[0, n // 3] = x[0, -1] = 50.0  # a tie: the first index wins, as in torch.argmax
    out = torch.full((1,), -7, dtype=torch.long, device=DEVICE)
    assert fused_argmax(x, out=out) is out
    assert out.tolist() == naive_argmax(x).tolist() == [n // 3]
