"""Block-scaled FP8 weight kernels (kernels/linear/triton_fp8.py, kernels/moe/triton_moe_fp8.py)
against the dequantised reference: the same products with W = W8 * scale expanded to fp32 by
engine/models/fp8.py `dequantize_blocks` (the CPU path's loader), and, for the FP8-activation
GEMM, DeepSeek-V3's scheme written in PyTorch (activations quantised per row and block).

The Triton interpreter loads, converts and multiplies float8_e4m3fn (TRITON_INTERPRET=1, triton
3.9), so every case runs on the CPU under it, and on a GPU when there is one; only its fp32 ->
e4m3 rounding is off (see `e4m3_exact_activations`)."""

from __future__ import annotations

import pytest
import torch
from kernel_check import DEVICE, assert_close, needs_triton

from docqa.engine.models.fp8 import dequantize_blocks
from docqa.kernels.gpu import interpreting
from docqa.kernels.linear.naive_fp8 import (
    FP8,
    Fp8Weight,
    cat_rows,
    naive_fp8_gemv,
    naive_fp8_matmul,
    quantize_rows,
)
from docqa.kernels.moe.naive import naive_moe_down, naive_moe_gate_up

from test_glm_fp8 import quantize_blocks  # the test-side quantiser

pytestmark = pytest.mark.usefixtures("few_moe_configs")  # tests/conftest.py
E4M3_ERR = 0.06  # e4m3 has 3 mantissa bits: ~2^-4 relative per element


def random_fp8(rows: int, cols: int, block: tuple[int, int], seed: int):
    """(Fp8Weight, the dequantised fp32 W, the unquantised W), rows of very different scales."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g).mul(4).exp()
    w8, scale = quantize_blocks(w, block)
    return Fp8Weight.from_blocks(w8, scale, block), dequantize_blocks(w8, scale, block), w


def to_dev(w: Fp8Weight) -> Fp8Weight:
    return Fp8Weight(w.w.to(DEVICE), w.scale.to(DEVICE), w.bk)


def test_layout_and_references_match_dequantize_blocks():
    """The row-expanded layout, its concatenation (row counts off the block grid, as GLM-5's
    576-row kv_a_proj) and both matmul references against `dequantize_blocks` (CPU only)."""
    a, deq_a, _ = random_fp8(40, 70, (16, 32), 1)
    b, deq_b, _ = random_fp8(24, 70, (16, 32), 2)
    assert torch.equal(a.dequantize(), deq_a)
    fused = cat_rows([a, b])
    assert torch.equal(fused.dequantize(), torch.cat([deq_a, deq_b]))
    x = torch.randn(5, 70, generator=torch.Generator().manual_seed(3))
    assert_close(naive_fp8_matmul(x, fused), x @ torch.cat([deq_a, deq_b]).t(), 1e-6)
    # DeepSeek's activation quantisation: every block's values are e4m3 times one scale
    q, s = quantize_rows(x, 32)
    assert q.dtype == FP8 and s.shape == (5, 3)
    assert_close(q.float() * s.repeat_interleave(32, 1)[:, :70], x, E4M3_ERR)
    assert_close(naive_fp8_matmul(x, fused, act_fp8=True), x @ fused.dequantize().t(), E4M3_ERR)
    with pytest.raises(ValueError, match="do not fit"):
        Fp8Weight.from_blocks(a.w, torch.ones(1, 1), (16, 32))


@needs_triton
@pytest.mark.parametrize("rows, cols, block", [(96, 64, (32, 32)), (50, 200, (16, 64)), (160, 320, (128, 128))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_gemv_matches_dequantised_reference(rows, cols, block, dtype):
    from docqa.kernels.linear.triton_fp8 import fp8_gemv

    w, deq, orig = random_fp8(rows, cols, block, rows + cols)
    wd = to_dev(w)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, cols, generator=g)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    got = fp8_gemv(x.to(DEVICE, dtype), wd).cpu()
    assert_close(got, (x.to(dtype).float() @ deq.t()).to(dtype), tol)
    assert_close(got.float(), x @ orig.t(), E4M3_ERR + tol, "against the unquantised weights")
    # the fused prologue / epilogue, as naive_gemv's (a small norm weight keeps SiLU off its tails)
    norm = (torch.rand(cols, generator=g) + 0.5) * 0.02
    res = torch.randn(3, rows // 2, generator=g)
    got = fp8_gemv(x.to(DEVICE, dtype), wd, norm_weight=norm.to(DEVICE, dtype), eps=1e-5, swiglu=True,
                   residual=res.to(DEVICE, dtype))
    want = naive_fp8_gemv(x.to(dtype), w, norm_weight=norm.to(dtype), eps=1e-5, swiglu=True, residual=res.to(dtype))
    assert_close(got.cpu(), want, tol)


@needs_triton
@pytest.mark.parametrize("m, rows, cols, block", [(37, 96, 64, (32, 32)), (70, 50, 200, (16, 64)),
                                                  (130, 160, 320, (128, 128))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_matmul_matches_dequantised_reference(m, rows, cols, block, dtype):
    """Without act_fp8: the e4m3 weight converted in the kernel to the activations' dtype (fp32:
    an exact IEEE dot; bf16: a bf16 tensor-core dot, e4m3 values being exact in bf16)."""
    from docqa.kernels.linear.triton_fp8 import fp8_matmul

    if dtype == torch.bfloat16 and interpreting():
        pytest.skip("the interpreter's bf16 tl.dot is wrong (triton 3.9: a plain bf16 x bf16 dot is off by 1e10)")
    w, deq, _ = random_fp8(rows, cols, block, m)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)).to(dtype)
    got = fp8_matmul(x.to(DEVICE), to_dev(w), act_fp8=False).cpu()
    assert_close(got, (x.float() @ deq.t()).to(dtype), 1e-5 if dtype == torch.float32 else 1e-2)


def e4m3_exact_activations(m: int, k: int, bk: int, seed: int) -> torch.Tensor:
    """Activations that quantise with no rounding: e4m3 values times a power of two per row and
    block, each block holding +-448 (so its scale is that power of two). The interpreter rounds
    fp32 -> e4m3 wrongly where the rounding carries into the exponent (125.7 -> 64, triton 3.9),
    so it is checked on these; the GPU also runs random activations."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(m, k, generator=g) * 100).clamp(-440, 440).to(FP8).float()
    q[:, ::bk] = 448.0
    pow2 = torch.randint(-6, 3, (m, -(-k // bk)), generator=g).float().exp2()
    return q * pow2.repeat_interleave(bk, 1)[:, :k]


# e4m3 x e4m3 products are exact, but Hopper's FP8 tensor-core dot adds them with about 14
# mantissa bits (DeepSeek-V3's report, 3.3.2: why scales are applied per 128-wide block in fp32):
# 4.4e-4 and 1.2e-4 relative on the H200. The interpreter adds them in fp32.
FP8_DOT_TOL = 1e-5 if interpreting() else 2e-3


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dot_with_quantised_activations(dtype):
    """act_fp8 (the prefill default for bf16): e4m3 x e4m3 per block with both scales, against
    DeepSeek's scheme in PyTorch, and within e4m3's error of the dequantised-weight product."""
    from docqa.kernels.linear.triton_fp8 import fp8_matmul

    block = (128, 128) if not interpreting() else (32, 32)
    w, deq, _ = random_fp8(192, 320, block, 4)
    x = e4m3_exact_activations(40 if interpreting() else 100, 320, block[1], 4).to(dtype)
    want = naive_fp8_matmul(x, w, act_fp8=True)
    assert torch.equal(want, naive_fp8_matmul(x, w).to(dtype))  # nothing was rounded
    got = fp8_matmul(x.to(DEVICE), to_dev(w), act_fp8=True).cpu()
    assert_close(got, want, FP8_DOT_TOL if dtype == torch.float32 else 1e-2)
    if interpreting():
        return
    # random activations: a value on a rounding boundary may round the other way (fast division)
    x = torch.randn(100, 320, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = fp8_matmul(x.to(DEVICE), to_dev(w), act_fp8=True).cpu()
    assert_close(got, naive_fp8_matmul(x, w, act_fp8=True), 2e-3 if dtype == torch.float32 else 1.2e-2)
    assert_close(got.float(), x.float() @ deq.t(), E4M3_ERR)


@needs_triton
@pytest.mark.parametrize("act_fp8", [False, True])
def test_fp8_grouped_matmul_matches_per_expert_reference(act_fp8):
    """Rows grouped by expert (experts with no rows, one with more than a tile) against each
    expert's dequantised product."""
    from docqa.kernels.linear.triton_fp8 import GROUP_BLOCK_M, fp8_grouped_matmul

    block = (128, 128) if act_fp8 and not interpreting() else (32, 32)
    e, n, k = 5, 72, 160
    parts = [random_fp8(n, k, block, 10 + j) for j in range(e)]
    w = Fp8Weight(torch.stack([p[0].w for p in parts]), torch.stack([p[0].scale for p in parts]), parts[0][0].bk)
    sizes = [3, 0, GROUP_BLOCK_M + 5, 0, 9]
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    a = e4m3_exact_activations(sum(sizes), k, block[1], 5)
    got = fp8_grouped_matmul(a.to(DEVICE), to_dev(w), ends.to(DEVICE), act_fp8=act_fp8).cpu()
    start, want = 0, []
    for j, size in enumerate(sizes):
        ref = Fp8Weight(w.w[j], w.scale[j], w.bk)
        want.append(naive_fp8_matmul(a[start:start + size], ref, act_fp8=act_fp8))
        start += size
    assert_close(got, torch.cat(want), FP8_DOT_TOL if act_fp8 else 1e-5)


@needs_triton
def test_fp8_moe_gemvs_match_dequantised_reference():
    from docqa.kernels.moe.triton_moe_fp8 import fp8_moe_down, fp8_moe_gate_up

    block = (16, 32)
    e, h, i = 6, 72, 40
    w13 = [random_fp8(2 * i, h, block, 20 + j)[0] for j in range(e)]
    w2 = [random_fp8(h, i, block, 40 + j)[0] for j in range(e)]
    w13 = Fp8Weight(torch.stack([p.w for p in w13]), torch.stack([p.scale for p in w13]), 32)
    w2 = Fp8Weight(torch.stack([p.w for p in w2]), torch.stack([p.scale for p in w2]), 32)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, h, generator=g) * 0.1  # SiLU off its tails
    ids = torch.tensor([5, 1, 3, 0])
    wts = torch.rand(4, generator=g)
    res = torch.randn(1, h, generator=g)
    act = fp8_moe_gate_up(x.to(DEVICE), to_dev(w13), ids.to(DEVICE)).cpu()
    assert_close(act, naive_moe_gate_up(x, w13.dequantize(), ids), 1e-5)
    got = fp8_moe_down(act.to(DEVICE), to_dev(w2), ids.to(DEVICE), wts.to(DEVICE), res.to(DEVICE)).cpu()
    assert_close(got, naive_moe_down(act, w2.dequantize(), ids, wts, res), 1e-5)
