"""The dense KV state: every layer keeps all past keys/values in one contiguous buffer.

Used for short contexts and as the reference the sparse state is checked against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.linear.gguf_cpu import attend_f16, library
from .config import ModelConfig
from .rope import Rope


# PyTorch's CPU flash kernel also returns the log-sum-exp, which lets a chunk after the first
# be attended as two mask-free calls (the prefix in full, the chunk causally) merged exactly;
# an explicit offset mask instead sends SDPA to its math path, which materialises every score.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _offset_causal_cpu(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                       q_per_kv: int) -> torch.Tensor:
    """q [Hq, T, D] at absolute positions start.., keys/values [Hkv, start+T, D] -> [Hq, T, D]."""
    k = keys.repeat_interleave(q_per_kv, 0)[None]
    v = values.repeat_interleave(q_per_kv, 0)[None]
    o1, lse1 = _FLASH_CPU(q[None], k[:, :, :start], v[:, :, :start], 0.0, False)
    o2, lse2 = _FLASH_CPU(q[None], k[:, :, start:], v[:, :, start:], 0.0, True)
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m)[..., None], torch.exp(lse2 - m)[..., None]
    return ((o1 * w1 + o2 * w2) / (w1 + w2))[0].to(q.dtype)


class DenseKVState:
    """KVState (see attention.py) over per-layer buffers k/v [Hkv, capacity, D].

    Capacity grows by doubling, so a long prefill reallocates O(log n) times; pass `capacity`
    when the final length is known to avoid that.
    """

    def __init__(self, config: ModelConfig, rope: Rope | None = None, *, capacity: int = 1024,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.config = config
        self.rope = rope if rope is not None else Rope(config)
        self.num_tokens = 0
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (config.n_layers, config.n_kv_heads, capacity, config.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=self.device)
        self.v = torch.empty(shape, dtype=dtype, device=self.device)
        # An fp16 cache on the CPU (Engine.kv_dtype with GGUF weights): a decode step's RoPE, cache
        # write and attention in one call of the compiled kernel, which reads the fp16 rows as they
        # are (torch's attention would convert them first), or the whole step in one call
        # (gguf_weights.DecodeStep). Full-width rotate-half RoPE only.
        self.compiled = dtype == torch.float16 and self.device.type == "cpu" and self.rope.plain \
            and config.head_dim % 32 == 0 and config.head_dim <= 256 and library() is not None

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, n: int) -> None:
        """Room for n tokens in all."""
        if n <= self.capacity:
            return
        new_cap = max(n, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = torch.empty(old.shape[:2] + (new_cap, old.shape[3]), dtype=old.dtype, device=old.device)
            grown[:, :, : self.num_tokens] = old[:, :, : self.num_tokens]
            setattr(self, name, grown)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        t = q.shape[0]
        start = self.num_tokens
        end = start + t
        self.reserve(end)
        if t == 1 and self.compiled:
            cos, sin = self.rope.cos_sin(positions)
            return attend_f16(q[0], k[0], v[0], self.k[layer], self.v[layer], start, cos, sin)[None]
        q = self.rope.apply(q, positions)
        k = self.rope.apply(k, positions)
        self.k[layer, :, start:end] = k.transpose(0, 1).to(self.dtype)
        self.v[layer, :, start:end] = v.transpose(0, 1).to(self.dtype)
        keys = self.k[layer, :, :end]
        values = self.v[layer, :, :end]
        if q.dtype != self.dtype:
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        qh = q.transpose(0, 1)  # [Hq, T, D]
        if t == 1:
            # One query sees everything: fold the query heads of a group into the "time" axis so
            # keys/values are read once per KV head instead of being repeated per query head.
            # 4-D (a batch of one) so SDPA takes its flash kernel; 3-D inputs send the CPU build
            # to the "math" path, which cost ~20% of a decode step (bench/results/cpu_engine.md).
            g = self.config.q_per_kv
            out = F.scaled_dot_product_attention(
                qh.reshape(1, self.config.n_kv_heads, g, -1), keys[None], values[None])
            return out.reshape(self.config.n_heads, 1, -1).transpose(0, 1)
        if start == 0:
            # 4-D, as above: 3-D inputs take SDPA's math path, which materialises T x T scores
            # (2048-token chunks prefilled at half the speed of 1024-token ones).
            out = F.scaled_dot_product_attention(qh[None], keys[None], values[None], is_causal=True,
                                                 enable_gqa=True)[0]
        elif q.device.type == "cpu" and _FLASH_CPU is not None:
            out = _offset_causal_cpu(qh, keys, values, start, self.config.q_per_kv)
        else:
            # Causal with an offset: query i (absolute start+i) sees keys 0..start+i.
            rows = torch.arange(start, end, device=q.device)[:, None]
            cols = torch.arange(end, device=q.device)[None, :]
            out = F.scaled_dot_product_attention(qh, keys, values, attn_mask=cols <= rows,
                                                 enable_gqa=True)
        return out.transpose(0, 1)

    def commit(self, n: int) -> None:
        self.num_tokens += n

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot truncate a state of {self.num_tokens} tokens to {n}")
        self.num_tokens = n
