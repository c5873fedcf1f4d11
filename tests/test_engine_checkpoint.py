"""Checkpoint loading: GGUF files written here with gguf's GGUFWriter, our GGUF reader against
gguf's own GGUFReader, and K-quant dequantisation against transformers' independent dequantiser."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from docqa.engine.checkpoint import open_checkpoint, unpermute_rope_rows
from docqa.engine.config import CheckpointError
from docqa.engine.gguf_loader import GGUFFile

N_LAYERS, HIDDEN, N_HEADS, N_KV, FFN, VOCAB = 2, 64, 4, 2, 128, 96
HEAD_DIM = HIDDEN // N_HEADS


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to llama Q/K rows (rotate_half -> interleaved)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)),
         "model.norm.weight": rng.standard_normal(HIDDEN),
         "lm_head.weight": rng.standard_normal((VOCAB, HIDDEN))}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = rng.standard_normal(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = rng.standard_normal(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = rng.standard_normal((N_HEADS * HEAD_DIM, HIDDEN))
        w[p + "self_attn.k_proj.weight"] = rng.standard_normal((N_KV * HEAD_DIM, HIDDEN))
        w[p + "self_attn.v_proj.weight"] = rng.standard_normal((N_KV * HEAD_DIM, HIDDEN))
        w[p + "self_attn.o_proj.weight"] = rng.standard_normal((HIDDEN, N_HEADS * HEAD_DIM))
        w[p + "mlp.gate_proj.weight"] = rng.standard_normal((FFN, HIDDEN))
        w[p + "mlp.up_proj.weight"] = rng.standard_normal((FFN, HIDDEN))
        w[p + "mlp.down_proj.weight"] = rng.standard_normal((HIDDEN, FFN))
    return {k: v.astype(np.float32) for k, v in w.items()}


HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{HF_TO_GGUF[rest]}"


def write_llama_gguf(path, weights, qtype_of) -> dict[str, np.ndarray]:
    """Write a llama-arch GGUF the way llama.cpp would; return what each HF tensor should load as."""
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(N_LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    expected = {}
    for name, arr in weights.items():
        heads = N_HEADS if "q_proj" in name else N_KV if "k_proj" in name else None
        stored = llama_cpp_permute(arr, heads) if heads else arr
        qtype = qtype_of(name) if arr.ndim == 2 else Q.F32
        if qtype == Q.F32:
            data, back = stored, stored
        elif qtype == Q.F16:
            data = stored.astype(np.float16)
            back = data.astype(np.float32)
        else:
            data = quantize(stored, qtype)
            back = dequantize(data, qtype)
        w.add_tensor(gguf_name(name), data, raw_dtype=qtype)
        expected[name] = unpermute_rope_rows(back, heads) if heads else back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_gguf_roundtrip(tmp_path, qtype):
    weights = hf_weights()
    path = tmp_path / "tiny.gguf"
    expected = write_llama_gguf(path, weights, lambda name: qtype)
    ckpt = open_checkpoint(path)
    cfg = ckpt.config
    assert (cfg.arch, cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == \
        ("llama", N_LAYERS, HIDDEN, N_HEADS, N_KV, HEAD_DIM)
    assert (cfg.intermediate, cfg.vocab, cfg.max_position, cfg.tie_embeddings) == (FFN, VOCAB, 256, False)
    got = ckpt.tensors()
    assert set(got) == set(weights)
    # counted from the headers alone (how Engine.load sizes a state it fills while loading)
    assert ckpt.parameter_count() == sum(w.size for w in weights.values())
    for name, want in expected.items():
        assert got[name].dtype == torch.float32
        np.testing.assert_array_equal(got[name].numpy(), want, err_msg=name)
    # Lossless types must give back the HF layout exactly: proof the un-permutation is right.
    if qtype == Q.F32:
        for name in weights:
            np.testing.assert_array_equal(got[name].numpy(), weights[name], err_msg=name)
    else:
        q = got["model.layers.1.self_attn.q_proj.weight"].numpy()
        ref = weights["model.layers.1.self_attn.q_proj.weight"]
        assert np.abs(q - ref).mean() < 0.3 * np.abs(ref).mean()


def test_reader_agrees_with_gguf_reader(tmp_path):
    path = tmp_path / "mixed.gguf"
    write_llama_gguf(path, hf_weights(1),
                     lambda n: Q.Q8_0 if "mlp" in n else Q.Q4_1 if "attn" in n else Q.F16)
    ours, ref = GGUFFile(path), GGUFReader(str(path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        assert ours.metadata[key] == pytest.approx(want) if isinstance(want, float) else \
            ours.metadata[key] == want, key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type
        assert mine.shape == tuple(int(d) for d in reversed(t.shape))
        np.testing.assert_array_equal(mine.raw, np.asarray(t.data).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_1])
def test_dequantize_matches_transformers(qtype):
    """gguf's writer cannot make K-quants, so feed random blocks (with sane fp16 scales) to both
    gguf.quants.dequantize (what we use) and transformers' own torch dequantiser."""
    from gguf import GGML_QUANT_SIZES
    from transformers.integrations.gguf.dequant import dequantize as hf_dequantize

    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, size=(8, 4 * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    # fp16 scale fields: d (and dmin) at the block start for Q4_K/Q5_K/Q8_0/Q4_1, d at the end for Q6_K.
    scale_at = [size - 2] if qtype == Q.Q6_K else [0, 2] if qtype in (Q.Q4_K, Q.Q5_K, Q.Q4_1) else [0]
    for at in scale_at:
        blocks[:, at:at + 2] = rng.uniform(-0.1, 0.1, size=(blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    ours = open_dequant(raw, qtype)
    ref = hf_dequantize(torch.from_numpy(raw.reshape(-1)), int(qtype)).numpy().reshape(ours.shape)
    assert np.isfinite(ours).all() and np.abs(ours).max() > 0
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


def open_dequant(raw, qtype):
    from docqa.engine.gguf_loader import GGUFTensor
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    shape = (raw.shape[0], raw.shape[1] // size * block)
    return GGUFTensor("t", shape, qtype, raw.reshape(-1)).to_numpy()


def test_bad_files(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(CheckpointError, match="not a valid GGUF"):
        open_checkpoint(junk)
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "missing.gguf")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        open_checkpoint(tmp_path / "empty_dir")
    good = tmp_path / "good.gguf"
    write_llama_gguf(good, hf_weights(), lambda n: Q.F16)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:-1000])
    with pytest.raises(CheckpointError):
        open_checkpoint(truncated)
