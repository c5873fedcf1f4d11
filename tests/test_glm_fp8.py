"""FP8 e4m3 block-scaled weights (the official GLM-5 / DeepSeek-V3 FP8 layout): the matmul over
the stored blocks against fp32 matmuls with the dequantised weights and with the original ones,
and a tiny GLM-4.7-Flash-shaped checkpoint written in that layout whose logits equal
transformers' on the dequantised weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from docqa.engine.models.fp8 import FP8, dequantize_blocks, fp8_linear

E4M3_MAX = 448.0


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]):
    """Test-side quantiser: per block, scale = amax / 448, W8 = round-to-e4m3(W / scale)."""
    bo, bi = block
    rows, cols = w.shape
    nr, nc = -(-rows // bo), -(-cols // bi)
    padded = torch.zeros(nr * bo, nc * bi)
    padded[:rows, :cols] = w
    blocks = padded.view(nr, bo, nc, bi)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / E4M3_MAX  # [nr, nc]
    w8 = (blocks / scale[:, None, :, None]).view(nr * bo, nc * bi)[:rows, :cols].to(FP8)
    return w8, scale


def reference_dequant(w8, scale, block):
    """Independent of the engine's: loop over blocks."""
    out = torch.empty(w8.shape)
    bo, bi = block
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi] = \
                w8[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi].float() * scale[i, j]
    return out


@pytest.mark.parametrize("rows, cols, block", [(96, 64, (32, 32)), (50, 70, (16, 32)), (256, 384, (128, 128))])
def test_fp8_matmul_matches_dequantised_reference(rows, cols, block):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g) * 3
    w8, scale = quantize_blocks(w, block)
    deq = reference_dequant(w8, scale, block)
    assert torch.equal(dequantize_blocks(w8, scale, block), deq)
    x = torch.randn(5, cols, generator=g)
    got = fp8_linear(x, w8, scale, block)
    want = x @ deq.T
    assert ((got - want).norm() / want.norm()).item() < 1e-6
    # and e4m3's own error against the unquantised weights: 3 mantissa bits, ~2^-4 relative
    assert ((got - x @ w.T).norm() / (x @ w.T).norm()).item() < 0.06


def test_misfit_scales_are_refused():
    from docqa.engine.config import CheckpointError

    w8, scale = quantize_blocks(torch.randn(64, 64), (32, 32))
    with pytest.raises(CheckpointError, match="do not fit"):
        dequantize_blocks(w8, scale[:1], (32, 32))


def test_fp8_glm_checkpoint_matches_hf_on_dequantised_weights(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")
    from test_glm import TOL, VOCAB, make_tiny_glm

    from docqa.engine.checkpoint import load_model

    block = (16, 16)
    ref = make_tiny_glm(tmp_path / "bf", "glm4_moe_lite")
    tensors = {}
    with torch.no_grad():
        for name, p in ref.state_dict().items():
            quantized = (p.dim() == 2 and name.endswith("proj.weight") and "gate.weight" not in name)
            if quantized:  # as the official checkpoints: linear layers only; norms, gate, embeddings stay
                w8, scale = quantize_blocks(p.float(), block)
                tensors[name], tensors[name + "_scale_inv"] = w8, scale
                p.copy_(reference_dequant(w8, scale, block))  # the reference runs these values
            else:
                tensors[name] = p.contiguous()
    assert sum(t.dtype == FP8 for t in tensors.values()) > 10
    out = tmp_path / "fp8"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((tmp_path / "bf" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(cfg))

    ours, ckpt = load_model(out)
    assert ckpt.config.fp8_block == block
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    assert (ours(ids, ours.new_state()) - want).abs().max().item() < TOL
