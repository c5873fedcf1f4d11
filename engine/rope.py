"""Rotary position embedding, Hugging Face "rotate_half" layout.

Contract used by every KV state: `Rope(config).apply(x, positions)` with x [T, H, D] (any H),
positions LongTensor[T] (arbitrary, not necessarily contiguous, so a sparse state may remap
distant blocks) returns x rotated, same shape and dtype. Frequencies follow HF transformers'
`default`, `linear` and `llama3` rope types (and llama.cpp's per-frequency factors).

GLM checkpoints turn only the first `config.rotary_dim` dims of a head (partial RoPE), some as
interleaved pairs (x0, x1), (x2, x3), ... (`config.rope_interleaved`); the dims past
rotary_dim pass through. Interleaved pairs stay where they are: transformers' MLA variant writes
the rotated evens then the odds, a permutation applied to q and k alike, so no dot product
differs.
"""

from __future__ import annotations

import math

import torch

from .config import CheckpointError, ModelConfig


def inv_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.rotary_dim or config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if config.rope_freq_factors is not None:
        return inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32)
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise CheckpointError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3)")


class Rope:
    def __init__(self, config: ModelConfig):
        self.head_dim = config.head_dim
        self.inv_freq = inv_frequencies(config)
        self.rotary_dim = config.rotary_dim or config.head_dim
        self.interleaved = config.rope_interleaved
        self.plain = self.rotary_dim == self.head_dim and not self.interleaved
        # Every layer of one forward passes the same positions tensor: compute cos/sin once.
        self._cached_positions: torch.Tensor | None = None
        self._cached: tuple[torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32):
        """cos, sin of shape [T, 1, D] for broadcasting over heads."""
        if positions is not self._cached_positions or self._cached[0].dtype != dtype:
            if self.inv_freq.device != positions.device:  # the engine's device decides
                self.inv_freq = self.inv_freq.to(positions.device)
            freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
            sin = emb.sin().to(dtype)
            half = self.head_dim // 2
            # rotate_half(x) * sin == roll(x, half) * [-sin_lo, sin_hi]: one copy instead of two
            # slices, a negation and a cat (apply() below).
            signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
            self._cached = (emb.cos().to(dtype), sin, signed)
            self._cached_positions = positions
        return self._cached[:2]

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] rotated by `positions` [T]."""
        if not self.plain:
            return self._apply_partial(x, positions)
        cos, _ = self.cos_sin(positions, x.dtype)
        return torch.addcmul(x * cos, x.roll(self.head_dim // 2, -1), self._cached[2])

    def _apply_partial(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Partial and/or interleaved RoPE (GLM); x may be wider than head_dim (only the first
        rotary_dim dims turn)."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[:, None, None] * self.inv_freq  # [T, 1, r/2]
        cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
        r = self.rotary_dim
        rot, rest = x[..., :r], x[..., r:]
        if self.interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]
            turned = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        else:
            a, b = rot[..., : r // 2], rot[..., r // 2:]
            turned = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        return torch.cat((turned, rest), dim=-1) if rest.shape[-1] else turned
