"""The KV state of MLA models (GLM-4.7-Flash, GLM-5): the compressed latent, not per-head K/V.

Multi-head latent attention caches, per token and layer, one vector: the normalised latent
c [kv_lora_rank] and the shared RoPE key k_rot [qk_rope_head_dim] — 576 numbers for GLM-5's
64 heads instead of 64 x (256 + 256). The model absorbs the up-projections into the query
(q_nope @ W_UK) and the output (o_lat @ W_UV^T), so attention runs directly on the latent as
one-KV-head attention whose values are the first kv_lora_rank dims of the keys
(engine/models/mla.py).

DSA (GLM-5): each "full" layer also stores its indexer keys [index_head_dim]; `select` scores
every stored token for each query with the lightning indexer and returns the top-k token
indices, which the "full" layer and the "shared" layers after it attend to (IndexShare).

Positions are true positions (no remapping): RoPE is applied once, when a token is stored.
Buffers grow by doubling; `truncate` forgets a suffix (to reuse a cached prefix).

Shapes (batch 1): attend q [T, H, R + rope] (rope part before RoPE), latent [T, R + rope]
(rope part before RoPE) -> [T, H, R]; select q [T, Hi, Di], k [T, Di], weights [T, Hi] ->
indices [T, min(topk, S)] int64, -1 where a query has fewer earlier tokens than topk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .rope import Rope


class MLAKVState:
    def __init__(self, config: ModelConfig, rope: Rope | None = None, *, capacity: int = 1024,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        assert config.mla is not None, "MLAKVState needs an MLA model"
        self.config = config
        self.rope = rope if rope is not None else Rope(config)
        self.r = config.mla.kv_lora_rank
        self.num_tokens = 0
        self.dtype, self.device = dtype, torch.device(device)
        width = self.r + config.mla.qk_rope_head_dim
        self.latent = torch.empty(config.n_layers, capacity, width, dtype=dtype, device=self.device)
        self.index_keys: dict[int, torch.Tensor] = {}
        if config.dsa is not None:
            for layer, kind in enumerate(config.dsa.indexer_types):
                if kind == "full":
                    self.index_keys[layer] = torch.empty(capacity, config.dsa.head_dim, dtype=dtype,
                                                         device=self.device)

    @property
    def capacity(self) -> int:
        return self.latent.shape[1]

    def _reserve(self, n: int) -> None:
        if n <= self.capacity:
            return
        cap = max(n, 2 * self.capacity)
        grown = self.latent.new_empty(self.latent.shape[0], cap, self.latent.shape[2])
        grown[:, : self.num_tokens] = self.latent[:, : self.num_tokens]
        self.latent = grown
        for layer, keys in self.index_keys.items():
            g = keys.new_empty(cap, keys.shape[1])
            g[: self.num_tokens] = keys[: self.num_tokens]
            self.index_keys[layer] = g

    def _rope_tail(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on the last qk_rope_head_dim dims of x [T, H, R + rope]."""
        head = x[..., : self.r]
        return torch.cat((head, self.rope._apply_partial(x[..., self.r:], positions)), dim=-1)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
               positions: torch.Tensor, *, scale: float,
               indices: torch.Tensor | None = None) -> torch.Tensor:
        """Store this chunk's latents and attend to everything stored (causally), or only to
        `indices` [T, k] (-1 = nothing) when DSA selected tokens. v is unused: the values are
        the latent itself."""
        t = q.shape[0]
        start, end = self.num_tokens, self.num_tokens + t
        self._reserve(end)
        self.latent[layer, start:end] = self._rope_tail(k[:, None], positions)[:, 0].to(self.dtype)
        q = self._rope_tail(q, positions)
        keys = self.latent[layer, :end].to(q.dtype)
        mask = None
        if indices is not None:
            mask = token_mask(indices, end)
        elif t > 1:
            rows = torch.arange(start, end, device=q.device)[:, None]
            mask = torch.arange(end, device=q.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None, None], keys[None, None, :, : self.r],
            attn_mask=mask, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)

    def select(self, layer: int, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor,
               positions: torch.Tensor, *, scale: float) -> torch.Tensor | None:
        """Store this chunk's indexer keys for `layer` and return each query's top-k tokens, or
        None when no query has more earlier tokens than topk (then every token is kept)."""
        t = q.shape[0]
        start, end = self.num_tokens, self.num_tokens + t
        self._reserve(end)
        self.index_keys[layer][start:end] = self.rope._apply_partial(k[:, None], positions)[:, 0].to(self.dtype)
        topk = self.config.dsa.topk
        if end <= topk:
            return None
        q = self.rope._apply_partial(q, positions)
        return indexer_topk(q, self.index_keys[layer][:end].to(q.dtype), weights, start,
                            scale=scale, topk=topk)

    def commit(self, n: int) -> None:
        self.num_tokens += n

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot truncate a state of {self.num_tokens} tokens to {n}")
        self.num_tokens = n


def token_mask(indices: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Boolean [T, n_keys]: True at each query's selected tokens (indices [T, k], -1 = none)."""
    mask = torch.zeros(indices.shape[0], n_keys + 1, dtype=torch.bool, device=indices.device)
    mask.scatter_(1, torch.where(indices < 0, n_keys, indices), True)
    return mask[:, :n_keys]


def indexer_topk(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, start: int, *,
                 scale: float, topk: int) -> torch.Tensor:
    """The lightning indexer (PyTorch reference; kernels/dsa_index holds the Triton one).

    q [T, Hi, Di] (roped) of queries at positions start..start+T-1, keys [S, Di] (roped),
    weights [T, Hi] -> indices [T, min(topk, S)] of the highest sum_h w[t,h] relu(q[t,h].k[s]
    * scale) over s <= start + t; -1 where fewer tokens are visible."""
    t, s = q.shape[0], keys.shape[0]
    scores = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float()) * scale)
    index = torch.einsum("th,ths->ts", weights.float(), scores)
    rows = torch.arange(start, start + t, device=q.device)[:, None]
    visible = torch.arange(s, device=q.device)[None, :] <= rows
    index = index.masked_fill(~visible, float("-inf"))
    values, idx = index.topk(min(topk, s), dim=-1)
    return torch.where(torch.isinf(values), -1, idx)
