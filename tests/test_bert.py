"""Our BERT encoder against Hugging Face transformers' BertModel on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from docqa.engine.models.bert import BertEncoder, minilm_folder

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
    enc = BertEncoder(minilm_folder(), max_length=max_length, batch_size=batch_size)
    ours = enc.encode(TEXTS)
    _, _, ref = hf_embed(reference, TEXTS, max_length)
    assert ours.shape == ref.shape == (len(TEXTS), 384)
    assert not np.isnan(ours).any()
    assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.reference
def test_hidden_states_match_transformers(reference):
    enc = BertEncoder(minilm_folder(), max_length=128)
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
