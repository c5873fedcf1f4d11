"""RMSNorm: `fused_rms_norm` against `naive_rms_norm` (kernels/norm)."""

from __future__ import annotations

import pytest
import torch

from kernel_check import DEVICE, DTYPES, TOL, assert_close, needs_triton, poisoned

pytestmark = needs_triton


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 60), (63, 60), (5, 3, 128), (7, 4096)])
def test_rms_norm(shape, dtype):
    from docqa.kernels.norm import fused_rms_norm, naive_rms_norm

    g = torch.Generator().manual_seed(hash(shape) % 1000)
    x = (torch.randn(shape, generator=g) * 3).to(DEVICE, dtype)
    w = torch.randn(shape[-1], generator=g).to(DEVICE, dtype)
    out = fused_rms_norm(x, w, 1e-5, out=poisoned(x))
    assert_close(out, naive_rms_norm(x, w, 1e-5), TOL[dtype])


def test_rms_norm_rejects_bad_weight():
    from docqa.kernels.norm import fused_rms_norm

    with pytest.raises(ValueError):
        fused_rms_norm(torch.zeros(2, 8, device=DEVICE), torch.zeros(7, device=DEVICE))
