"""A small BERT encoder for sentence embeddings (all-MiniLM-L6-v2 and its kin), on CPU.

Reads a sentence-transformers folder (`config.json`, `model.safetensors`, `tokenizer.json`,
`1_Pooling/config.json`) with safetensors and tokenizers only. `BertEncoder.encode(texts)`
returns mean-pooled, L2-normalised vectors [N, H], as sentence-transformers does; passages
are batched by length so that little time is spent on padding. This is the batch encoder
(passages at ingest); `bert_numpy.NumpyBert` embeds a question without importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .bert_numpy import MAX_LENGTH, MINILM_NAME, BertConfig, check_pooling, load_tokenizer, minilm_folder


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX): there bf16 encodes
    faster than fp32 with vectors equal to within rounding (bench/results/retrieval.md);
    elsewhere it would be emulated, and slower."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


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
    (MiniLM was trained at 128; longer passages are cut, their start kept). `dtype`: the
    weights' and activations' type, None for bf16 where the CPU has it natively (`native_bf16`)
    and fp32 elsewhere; the vectors are fp32 either way. `threads`: torch's CPU threads, None
    for the engine's choice (`generate.default_threads`: the cores other work leaves idle)."""

    def __init__(self, folder: str | Path, *, max_length: int = MAX_LENGTH, batch_size: int = 32,
                 dtype: torch.dtype | None = None, threads: int | None = None):
        from ..generate import default_threads

        torch.set_num_threads(threads or default_threads())
        folder = Path(folder)
        check_pooling(folder)
        self.cfg = BertConfig.from_json(folder / "config.json")
        self.dtype = dtype or (torch.bfloat16 if native_bf16() else torch.float32)
        self.model = Bert(self.cfg)
        self.model.load_hf(load_file(str(folder / "model.safetensors")))
        self.model.to(self.dtype).eval()
        self.max_length = min(max_length, self.cfg.max_positions)
        self.name = f"{MINILM_NAME}/{self.max_length}"
        self.batch_size = batch_size
        self.tokenizer = load_tokenizer(folder, self.max_length)
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
            h = self.model(tok, mask).float()
            m = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            out[torch.tensor(batch)] = F.normalize(pooled, dim=-1)
        return out.numpy()


def load_minilm(max_length: int = MAX_LENGTH, dtype: torch.dtype | None = None) -> BertEncoder:
    return BertEncoder(minilm_folder(), max_length=max_length, dtype=dtype)


__all__ = ["Bert", "BertConfig", "BertEncoder", "load_minilm", "minilm_folder", "native_bf16"]
