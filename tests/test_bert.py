"""Our BERT encoders against Hugging Face transformers' BertModel on the same weights: the
torch batch encoder (fp32, and bf16 as it runs on CPUs that have it) and the numpy question
encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from docqa.engine.models.bert import BertEncoder, minilm_folder
from docqa.engine.models.bert_numpy import NumpyBert

transformers = pytest.importorskip("transformers", reason="reference extra not installed")

TEXTS = [
    "Either party may terminate this Agreement upon ninety (90) days' prior written notice.",
    "This Agreement shall be governed by the laws of the State of New York.",
    "ok",
    "Licensee shall maintain commercial general liability insurance. " * 30,  # cut at max_length
    "Die Vertragsparteien vereinbaren Schriftform; 第一百四十三条 具备下列条件的民事法律行为有效。",
]


@pytest.fixture(scope="module")
def reference():
    folder = str(minilm_folder())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    return tok, model


def hf_embed(reference, texts, max_length):
    tok, model = reference
    b = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        h = model(**b).last_hidden_state
    m = b["attention_mask"].unsqueeze(-1).float()
    pooled = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    return h, b, pooled.numpy()


@pytest.mark.reference
@pytest.mark.parametrize("max_length,batch_size", [(128, 32), (64, 2), (256, 3)])
def test_embeddings_match_transformers(reference, max_length, batch_size):
    enc = BertEncoder(minilm_folder(), max_length=max_length, batch_size=batch_size, dtype=torch.float32)
    ours = enc.encode(TEXTS)
    _, _, ref = hf_embed(reference, TEXTS, max_length)
    assert ours.shape == ref.shape == (len(TEXTS), 384)
    assert not np.isnan(ours).any()
    assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.reference
@pytest.mark.parametrize("max_length", [128, 64])
def test_numpy_question_encoder_matches_transformers(reference, max_length):
    ours = NumpyBert(minilm_folder(), max_length=max_length).encode(TEXTS)
    _, _, ref = hf_embed(reference, TEXTS, max_length)
    assert ours.shape == ref.shape and not np.isnan(ours).any()
    assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.reference
def test_bf16_embeddings_are_close(reference):
    """bf16 (the default where the CPU has it) rounds weights and activations: each vector
    stays within a cosine of 0.999 of the fp32 reference, close enough not to move a ranking
    except between near ties."""
    ours = BertEncoder(minilm_folder(), dtype=torch.bfloat16).encode(TEXTS)
    _, _, ref = hf_embed(reference, TEXTS, 128)
    assert ours.dtype == np.float32 and not np.isnan(ours).any()
    assert (ours * ref).sum(1).min() > 0.999


@pytest.mark.reference
def test_hidden_states_match_transformers(reference):
    enc = BertEncoder(minilm_folder(), max_length=128, dtype=torch.float32)
    h_ref, b, _ = hf_embed(reference, TEXTS, 128)
    with torch.inference_mode():
        h = enc.model(b["input_ids"], b["attention_mask"])
    valid = b["attention_mask"].bool()
    # Padding rows differ by construction (nothing attends from them); only real tokens count.
    assert torch.allclose(h[valid], h_ref[valid], atol=1e-4, rtol=1e-4)


def test_tokenizer_ids_match_transformers(reference):
    enc = BertEncoder(minilm_folder(), max_length=128)
    tok, _ = reference
    for text in TEXTS:
        assert enc.tokenize([text])[0] == tok(text, truncation=True, max_length=128)["input_ids"]


def test_empty_input():
    enc = BertEncoder(minilm_folder())
    assert enc.encode([]).shape == (0, 384)
    assert NumpyBert(minilm_folder()).encode([]).shape == (0, 384)


def test_the_question_encoder_does_not_import_torch():
    """An evidence-only `ask` embeds its question without torch (bench/results/startup.md)."""
    import subprocess
    import sys

    code = ("import sys; from docqa.engine.models.bert_numpy import load_question_encoder; "
            "v = load_question_encoder().encode(['which law governs?']); "
            "assert v.shape == (1, 384); assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
