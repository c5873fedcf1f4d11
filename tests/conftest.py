"""Fixtures shared by the GPU kernel test files."""

from __future__ import annotations

import pytest

from docqa.kernels.gpu import has_triton, interpreting


@pytest.fixture
def few_gemv_configs(monkeypatch):
    """Correctness, not speed, is checked here: autotuning the GEMVs over every config for each
    test shape compiled ~40 variants per shape and made the GPU run of these files take ~8 min
    (2026-11-30). Two configs still cover the one- and multi-iteration K loops."""
    if not has_triton() or interpreting():
        return
    from docqa.kernels.linear import triton_gemv

    for kernel in (triton_gemv._gemv_kernel, triton_gemv._qkv_gemv_kernel):
        monkeypatch.setattr(kernel, "configs", [c for c in kernel.configs
                                                if (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) in ((4, 1024), (16, 256))
                                                and c.num_stages == 2])
