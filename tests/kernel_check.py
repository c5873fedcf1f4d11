"""What the kernel test files (tests/test_kernel_*.py) share: where the kernels run, the dtypes
and tolerances, and one closeness check of a kernel's output against its reference.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (scripts/test.sh sets it) on small
shapes; on a CUDA machine the same cases run on the GPU. Outputs are poisoned with NaN first so
an unwritten element fails the check.
"""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

# a test (or module: `pytestmark = needs_triton`) that launches a Triton kernel
needs_triton = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                  reason="needs triton and either CUDA or TRITON_INTERPRET=1")

DEVICE = "cuda" if has_cuda() and not interpreting() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # elementwise ops and GEMVs
ATT_TOL = {torch.float32: 2e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # tf32 dots on the GPU
LSE_TOL = 1e-3

# The shapes the engine serves (issue 13): head dims 64 and 128, GQA groups 1-8 (Llama 2: 1,
# SmolLM2: 3, Llama 3 / Mistral / Qwen3: 4, Qwen2-7B: 7, 8), as (head_dim, group) pairs.
REAL_SHAPES = [(64, 1), (64, 3), (128, 4), (128, 7), (64, 8), (128, 8)]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64, after checking shapes and that out holds no NaN."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "output") -> None:
    """The one closeness check of the kernel tests: relative error within `tol`, no NaN."""
    err = rel_err(out, ref)
    assert err < tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


def poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


def qkv(t: int, hq: int, hkv: int, d: int, n: int, dtype=torch.float32, seed: int = 0):
    """Random q [t, hq, d] and k, v [n, hkv, d] on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, hq, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(n, hkv, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(n, hkv, d, generator=g).to(DEVICE, dtype)
    return q, k, v


def stale_caches(rows: int, blocks: int, hkv: int, d: int, dtype) -> tuple:
    """K/V caches of NaN (an unwritten row shows) and descriptors / key sum holding stale
    values (a block's first key must replace them): the same for every caller."""
    kc = torch.full((rows, hkv, d), float("nan"), device=DEVICE, dtype=dtype)
    desc = [torch.randn(blocks, hkv, d, generator=torch.Generator().manual_seed(9)).to(DEVICE, dtype) for _ in range(3)]
    ksum = torch.randn(hkv, d, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    return (kc, kc.clone(), *desc, ksum)
