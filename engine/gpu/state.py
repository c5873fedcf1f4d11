"""A KVState (engine/attention.py) whose attention runs in the Triton kernels.

Drop-in for `SparseKVState` when the model runs on CUDA (or anywhere under
TRITON_INTERPRET=1): same settings, same routing rule (router.py: candidates are the blocks
holding a key in [sink_tokens, c_end - window + 1), top_k of them per kv head, shared by a
GQA group and by the queries of one routing chunk: `route_chunk` queries, the call's last
`route_tail` on their own), same exact union of sinks, routed blocks and window.

Keys are stored rotated at their true positions, so only the `true` position scheme is
served here; `packed` / `inflm` rotate routed keys at remapped positions at attention time,
which needs RoPE inside the attention kernel (not written yet): those settings raise.
"""

from __future__ import annotations

import torch

from ...kernels.attention.naive import naive_block_descriptors
from ...kernels.attention.triton_sparse import (
    fused_attention,
    fused_block_scores,
    fused_sparse_attention,
    fused_topk_blocks,
)
from ...kernels.rope.triton_rope import fused_rope
from ..config import ModelConfig
from ..rope import Rope
from ..router import routing_chunks
from ..settings import EngineSettings

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TritonKVState:
    """Per-layer time-major K/V [capacity, Hkv, D] on one device, descriptors per block."""

    def __init__(self, config: ModelConfig, settings: EngineSettings | None = None, rope: Rope | None = None,
                 *, capacity: int = 4096, device: torch.device | str = "cuda"):
        self.config = config
        self.settings = s = settings or EngineSettings()
        if s.attention == "sparse" and s.positions != "true":
            raise ValueError(f"the Triton KV state serves positions='true' only, not {s.positions!r}")
        if s.block_size & (s.block_size - 1) or s.block_size < 16:
            raise ValueError("the Triton kernels need block_size a power of two >= 16")
        self.rope = rope if rope is not None else Rope(config)
        self.device = torch.device(device)
        self.dtype = _DTYPES[s.kv_dtype]
        self.num_tokens = 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        c, b = self.config, self.settings.block_size
        capacity = -(-capacity // b) * b
        shape = (c.n_layers, capacity, c.n_kv_heads, c.head_dim)
        old = getattr(self, "k", None)
        self.k = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.v = torch.empty(shape, dtype=self.dtype, device=self.device)
        nb = capacity // b
        desc = (c.n_layers, nb, c.n_kv_heads, c.head_dim)
        self.kmin, self.kmax, self.kmean = (torch.empty(desc, dtype=torch.float32, device=self.device)
                                            for _ in range(3))
        if old is not None:  # grow: keep what the old buffers hold (all layers, written or not)
            n = old.shape[1]
            self.k[:, :n], self.v[:, :n] = old, self._old_v
            for name in ("kmin", "kmax", "kmean"):
                getattr(self, name)[:, : self._old_desc[name].shape[1]] = self._old_desc[name]

    def _reserve(self, n: int) -> None:
        if n <= self.k.shape[1]:
            return
        self._old_v = self.v
        self._old_desc = {name: getattr(self, name) for name in ("kmin", "kmax", "kmean")}
        self._alloc(max(n, 2 * self.k.shape[1]))
        del self._old_v, self._old_desc

    # --- KVState -------------------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        s = self.settings
        t = q.shape[0]
        c0 = self.num_tokens
        n = c0 + t
        self._reserve(n)
        cos, sin = self.rope.cos_sin(positions)
        q = fused_rope(q.contiguous(), cos, sin)
        k = fused_rope(k.contiguous(), cos, sin)
        self.k[layer, c0:n] = k
        self.v[layer, c0:n] = v
        b = s.block_size
        first_b = c0 // b
        kmin, kmax, kmean = naive_block_descriptors(self.k[layer, first_b * b: n], b)
        nbt = kmin.shape[0]
        self.kmin[layer, first_b: first_b + nbt] = kmin
        self.kmax[layer, first_b: first_b + nbt] = kmax
        self.kmean[layer, first_b: first_b + nbt] = kmean
        keys, vals = self.k[layer, :n], self.v[layer, :n]
        qq = q.to(keys.dtype)
        if s.attention == "dense" or n <= s.dense_below:
            out, _ = fused_attention(qq, keys, vals, c0)
            return out.to(q.dtype)
        nb = -(-n // b)
        desc = (self.kmin[layer, :nb], self.kmax[layer, :nb], self.kmean[layer, :nb])
        spans = routing_chunks(t, s)  # the reference state's routing chunks, tail included
        head = t - s.route_tail if 0 < s.route_tail < t else t
        parts = [fused_block_scores(qq[:head], *desc, s.block_score, chunk=s.route_chunk)]
        if head < t:
            parts.append(fused_block_scores(qq[head:], *desc, s.block_score, chunk=t - head))
        scores = torch.cat(parts)
        last = torch.tensor([c0 + e - 1 for _, e in spans], device=q.device)
        outside = last - s.window + 1
        end = torch.where(outside > s.sink_tokens, (outside + b - 1) // b, 0)[:, None, None]
        idx = fused_topk_blocks(scores, s.top_k, s.sink_tokens // b, end)
        out = torch.empty_like(q)
        for ci, (a, e) in enumerate(spans):  # usually one or two: the prefill chunk and its tail
            fused_sparse_attention(qq[a:e], keys, vals, c0 + a, idx[ci], b, s.sink_tokens, s.window, out=out[a:e])
        return out

    def commit(self, n: int) -> None:
        self.num_tokens += n

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot truncate {self.num_tokens} tokens to {n}")
        # the next write recomputes the descriptors of the block it lands in, from its start
        self.num_tokens = n
