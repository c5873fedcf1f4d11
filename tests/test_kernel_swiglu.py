"""SwiGLU: `fused_swiglu` against `naive_swiglu` (kernels/swiglu)."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, DTYPES, TOL, assert_close, needs_triton, poisoned

pytestmark = needs_triton


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 60), (63, 60), (3, 5000)])
def test_swiglu(shape, dtype):
    from docqa.kernels.swiglu import fused_swiglu, naive_swiglu

    g = torch.Generator().manual_seed(shape[-1])
    gu = (torch.randn(shape[0], 2 * shape[1], generator=g) * 4).to(DEVICE, dtype)
    gate, up = gu[:, : shape[1]], gu[:, shape[1]:]  # strided halves of one projection
    out = fused_swiglu(gate, up, out=poisoned(gate.contiguous()))
    assert_close(out, naive_swiglu(gate, up), TOL[dtype])
