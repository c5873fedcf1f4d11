"""The CPU kernel on GGUF blocks (kernels/linear/gguf_cpu.py) against its dequantised twin
(naive_gguf.py: the `gguf` package's own dequantisation, fp32 products), per block type, on
awkward shapes: odd numbers of 32-blocks (a half unit at the row's end), single rows, activation
row counts off the kernel's tile of 4, and the bf16 GEMM path past DOT_MAX_ROWS."""

from __future__ import annotations

import pytest
import torch
from docqa.kernels.linear import gguf_cpu
from docqa.kernels.linear.gguf_cpu import BLOCKS, DOT_MAX_ROWS, GGUFMatrix, dequantize, gguf_mm
from docqa.kernels.linear.naive_gguf import naive_dequantize, naive_gguf_mm

pytestmark = pytest.mark.skipif(gguf_cpu.library() is None, reason=f"no CPU kernel: {gguf_cpu.unavailable()}")

# Byte offsets of each block type's fp16 fields (d, and m / dmin where there is one).
HALVES = {2: [0], 3: [0, 2], 8: [0], 12: [0, 2], 13: [0, 2], 14: [208]}
NAMES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}


def random_matrix(qtype: int, rows: int, cols: int, seed: int = 0) -> GGUFMatrix:
    """Random blocks: every code, scale byte and sign pattern is a valid block; the fp16 fields
    get finite positive values of a trained model's size (random bits would give inf/nan)."""
    g = torch.Generator().manual_seed(seed)
    per, nbytes = BLOCKS[qtype]
    b = torch.randint(0, 256, (rows, cols // per, nbytes), dtype=torch.uint8, generator=g)
    for at in HALVES[qtype]:
        half = (torch.rand(rows, cols // per, generator=g) * 0.02 + 0.001).half()
        b[..., at:at + 2] = half.view(torch.uint8).view(rows, cols // per, 2)
    return GGUFMatrix(b.reshape(rows, -1).contiguous(), qtype, cols)


def shapes(qtype: int) -> list[tuple[int, int]]:
    if qtype in (12, 13, 14):
        return [(1, 256), (37, 256), (17, 768)]
    return [(1, 32), (37, 96), (17, 288), (5, 576)]  # 96 and 288: an odd number of blocks


def quantised_like_the_kernel(x: torch.Tensor, group: int) -> torch.Tensor:
    """x with each `group` values rounded to int8 steps of amax / 127, as the kernel rounds its
    activations (fp32 ops, round half to even)."""
    g = x.unflatten(1, (-1, group))
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(g * inv).clamp(-128, 127) * (amax / 127.0)).flatten(1)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=NAMES.get)
def test_dequantize_equals_gguf(qtype):
    for rows, cols in shapes(qtype):
        w = random_matrix(qtype, rows, cols)
        want = naive_dequantize(w.blocks, qtype, cols)
        # fp32: the same values up to the kernel's fused multiply-add (scale * code + offset)
        torch.testing.assert_close(dequantize(w), want, rtol=1e-6, atol=1e-7)
        # bf16, a row range: rounded to nearest bf16
        lo = rows // 3
        got = dequantize(w, lo, rows, torch.bfloat16)
        torch.testing.assert_close(got, want[lo:].bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=NAMES.get)
def test_products_equal_the_dequantised_weights(qtype):
    group = 256 if qtype in (12, 13, 14) else 32
    g = torch.Generator().manual_seed(1)
    for rows, cols in shapes(qtype):
        w = random_matrix(qtype, rows, cols, seed=rows)
        for m in (1, 3, 5, 6):  # the dot-product path: tiles of 4 activation rows and remainders
            x = torch.randn(m, cols, generator=g)
            got = gguf_mm(x, [w])
            # Against the same product on the activations rounded as the kernel rounds them the
            # products are exact integers, so only fp32 summation order separates the two.
            want = naive_gguf_mm(quantised_like_the_kernel(x.double(), group).float(), [w])
            assert rel_err(got, want) < 1e-5, (rows, cols, m)
            # Against unrounded activations: int8 steps of amax / 127 (per 256 values for the
            # K-quants, as llama.cpp's Q8_K) leave a few % on these random weights.
            assert rel_err(got, naive_gguf_mm(x, [w])) < 0.1, (rows, cols, m)


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=NAMES.get)
def test_gemm_path_past_the_dot_rows(qtype):
    rows, cols = shapes(qtype)[-1]
    w = random_matrix(qtype, rows, cols, seed=7)
    x = torch.randn(DOT_MAX_ROWS + 3, cols, generator=torch.Generator().manual_seed(2))
    got = gguf_mm(x, [w])
    want = naive_gguf_mm(x.bfloat16().float(), [GGUFMatrix(w.blocks, qtype, cols)])
    # bf16 weights and activations, fp32 accumulation inside the GEMM, bf16 output
    assert rel_err(got, want) < 2 ** -7


def test_several_matrices_of_mixed_types_in_one_call():
    """q/k/v and gate/up run as one call; a Q4_K_M file mixes Q4_K and Q6_K within it."""
    mats = [random_matrix(12, 33, 512, seed=1), random_matrix(14, 7, 512, seed=2), random_matrix(12, 16, 512, seed=3)]
    for m in (1, 2, DOT_MAX_ROWS + 1):
        x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
        got = gguf_mm(x, mats)
        assert got.shape == (m, 56)
        torch.testing.assert_close(got, torch.cat([gguf_mm(x, [w]) for w in mats], dim=1), rtol=0, atol=0)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        GGUFMatrix(torch.zeros(4, 18, dtype=torch.uint8), 12, 32)  # Q4_K needs 256 columns a block
    with pytest.raises(ValueError):
        GGUFMatrix(torch.zeros(4, 18, dtype=torch.uint8), 1, 32)  # F16 is not a block type here
    w = random_matrix(2, 4, 64)
    with pytest.raises(ValueError):
        gguf_mm(torch.randn(1, 32), [w])


@pytest.mark.parametrize("m", [1, 3, DOT_MAX_ROWS + 2])
def test_folded_norm_and_swiglu(m):
    """GGUFProduct(norm=..., swiglu=True): RMSNorm before and SwiGLU after, as the model's
    separate ops would give them."""
    from docqa.kernels.linear.gguf_cpu import GGUFProduct

    gate, up = random_matrix(12, 24, 512, seed=4), random_matrix(14, 24, 512, seed=5)
    g = torch.Generator().manual_seed(m)
    x, norm = torch.randn(m, 512, generator=g) * 3, torch.rand(512, generator=g) + 0.5
    got = GGUFProduct([gate, up], norm=norm, eps=1e-5, swiglu=True)(x)
    y = gguf_mm(torch.nn.functional.rms_norm(x, (512,), norm, 1e-5), [gate, up])
    want = torch.nn.functional.silu(y[:, :24]) * y[:, 24:]
    assert got.shape == (m, 24)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_bias():
    from docqa.kernels.linear.gguf_cpu import GGUFProduct

    w = random_matrix(12, 20, 256, seed=6)
    bias = torch.randn(20)
    for m in (1, DOT_MAX_ROWS + 1):
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m))
        torch.testing.assert_close(GGUFProduct([w], bias=bias)(x), gguf_mm(x, [w]) + bias)


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


@pytest.mark.parametrize("hq,hkv,d,pos", [(9, 3, 64, 300), (12, 2, 128, 0), (32, 8, 128, 36), (4, 4, 96, 17)])
@pytest.mark.parametrize("turned", [True, False])
def test_decode_attention_equals_sdpa(hq, hkv, d, pos, turned):
    """attend_f16 (RoPE, fp16 cache write, attention of one query row) against torch's SDPA on the
    same fp16 rows as fp32, with the RoPE written out; the stored row against its rounding."""
    g = torch.Generator().manual_seed(pos + d)
    cap = pos + 5
    kc, vc = (torch.randn(hkv, cap, d, generator=g).half() for _ in range(2))
    q, k, v = torch.randn(hq, d, generator=g) * 2, torch.randn(hkv, d, generator=g), torch.randn(hkv, d, generator=g)
    ang = torch.rand(d // 2, generator=g) * 10
    cos, sin = torch.cat((ang, ang)).cos(), torch.cat((ang, ang)).sin()
    keys, values = kc.float(), vc.float()
    keys[:, pos] = (rotate_half_rope(k, cos, sin) if turned else k).half().float()
    values[:, pos] = v.half().float()
    qr = rotate_half_rope(q, cos, sin) if turned else q
    out = gguf_cpu.attend_f16(q, k, v, kc, vc, pos, *((cos, sin) if turned else (None, None)))
    # The stored rows: the same fp16 values up to a rounding step (fma vs separate products).
    torch.testing.assert_close(kc[:, pos].float(), keys[:, pos], atol=2e-3, rtol=1e-3)
    assert torch.equal(vc[:, pos].float(), values[:, pos])
    keys[:, pos] = kc[:, pos].float()
    ref = torch.nn.functional.scaled_dot_product_attention(
        qr.view(hkv, hq // hkv, d)[None], keys[None, :, :pos + 1], values[None, :, :pos + 1])[0].reshape(hq, d)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
