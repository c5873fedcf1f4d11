"""Gemma 3 text decoder (from its GGUF file, e.g. Gemma 3 270M Q4_K_M).

Differences from the Llama family: the embedding is scaled by sqrt(hidden); every block has a
norm before and after attention and before and after the MLP; q and k are RMS-normalised per
head; the MLP is GELU(tanh)-gated; five layers in six attend to a sliding window of the last
`sliding_window` tokens with RoPE base 10000, the sixth to everything with the file's base.
llama.cpp stores Gemma's RMSNorm weights as 1 + w, so plain RMSNorm applies them.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..rope import Rope
from .llama import Linear, LlamaModel, RMSNorm


def is_global(config: ModelConfig, layer: int) -> bool:
    return (layer + 1) % config.global_every == 0


class Gemma3KVState:
    """KVState (attention.py) for Gemma 3: dense per-layer K/V, each layer with its RoPE base
    and, for sliding layers, the window mask (query i sees keys j with i - window < j <= i)."""

    def __init__(self, config: ModelConfig, *, capacity: int = 1024, dtype=torch.float32,
                 device: torch.device | str = "cpu"):
        self.config = config
        self.num_tokens = 0
        self.global_rope = Rope(config)
        self.local_rope = Rope(dataclasses.replace(config, rope_theta=config.rope_local_theta))
        shape = (config.n_layers, config.n_kv_heads, capacity, config.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    def _reserve(self, n: int) -> None:
        if n <= self.k.shape[2]:
            return
        cap = max(n, 2 * self.k.shape[2])
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = old.new_empty(old.shape[:2] + (cap, old.shape[3]))
            grown[:, :, : self.num_tokens] = old[:, :, : self.num_tokens]
            setattr(self, name, grown)

    def attend(self, layer: int, q, k, v, positions):
        t = q.shape[0]
        start, end = self.num_tokens, self.num_tokens + t
        self._reserve(end)
        rope = self.global_rope if is_global(self.config, layer) else self.local_rope
        q, k = rope.apply(q, positions), rope.apply(k, positions)
        self.k[layer, :, start:end] = k.transpose(0, 1)
        self.v[layer, :, start:end] = v.transpose(0, 1)
        rows = torch.arange(start, end, device=q.device)[:, None]
        cols = torch.arange(end, device=q.device)[None, :]
        mask = cols <= rows
        if not is_global(self.config, layer):
            mask &= cols > rows - self.config.sliding_window
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], self.k[layer, :, :end][None].to(q.dtype),
            self.v[layer, :, :end][None].to(q.dtype), attn_mask=mask, enable_gqa=True)
        return out[0].transpose(0, 1)

    def commit(self, n: int) -> None:
        self.num_tokens += n

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot truncate a state of {self.num_tokens} tokens to {n}")
        self.num_tokens = n


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.h, self.hkv, self.d = config.n_heads, config.n_kv_heads, config.head_dim
        self.q_proj = Linear(config.hidden, self.h * self.d)
        self.k_proj = Linear(config.hidden, self.hkv * self.d)
        self.v_proj = Linear(config.hidden, self.hkv * self.d)
        self.o_proj = Linear(self.h * self.d, config.hidden)
        self.q_norm = RMSNorm(self.d, config.rms_eps)
        self.k_norm = RMSNorm(self.d, config.rms_eps)

    def forward(self, x, state, positions):
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.h, self.d))
        k = self.k_norm(self.k_proj(x).view(t, self.hkv, self.d))
        v = self.v_proj(x).view(t, self.hkv, self.d)
        return self.o_proj(state.attend(self.layer, q, k, v, positions).reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(config.hidden, config.intermediate)
        self.up_proj = Linear(config.hidden, config.intermediate)
        self.down_proj = Linear(config.intermediate, config.hidden)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        eps = config.rms_eps
        self.input_layernorm = RMSNorm(config.hidden, eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden, eps)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = RMSNorm(config.hidden, eps)

    def forward(self, x, state, positions):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), state, positions))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    """Parameter names follow Hugging Face's without the `model.` prefix."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding.from_pretrained(torch.empty(0, config.hidden))
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.lm_head = Linear(config.hidden, config.vocab)
        self.decode_weights = {"mode": "fp32", "bytes": 0}

    def new_state(self, capacity: int = 1024, *, dtype=torch.float32, device="cpu"):
        return Gemma3KVState(self.config, capacity=capacity, dtype=dtype, device=device)

    @torch.inference_mode()
    def forward(self, input_ids, state, *, last_only=False, chunk_size=1024, argmax_only=False,
                on_chunk=None):
        """As `LlamaModel.forward`."""
        input_ids = input_ids.reshape(-1)
        n = input_ids.shape[0]
        outs = []
        for start in range(0, n, chunk_size):
            ids = input_ids[start:start + chunk_size]
            positions = torch.arange(state.num_tokens, state.num_tokens + ids.shape[0], device=ids.device)
            x = self.embed_tokens(ids) * torch.tensor(self.config.hidden ** 0.5, dtype=self.embed_tokens.weight.dtype)
            for block in self.layers:
                x = block(x, state, positions)
            state.commit(ids.shape[0])
            if on_chunk is not None:
                on_chunk(min(start + chunk_size, n), n)
            if last_only and start + chunk_size < n:
                continue
            x = self.norm(x[-1:] if last_only else x)
            outs.append(self.lm_head(x))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def load_weights(self, weights, dtype=torch.float32):
        LlamaModel.load_weights(self, weights, dtype=dtype)
