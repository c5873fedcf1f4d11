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
Storage is the engine's segmented, tiered cache; `truncate` forgets a suffix.

Shapes (batch 1): attend q [T, H, R + rope] (rope part before RoPE), latent [T, R + rope]
(rope part before RoPE) -> [T, H, R]; select q [T, Hi, Di], k [T, Di], weights [T, Hi] ->
indices [T, min(topk, S)] int64, -1 where a query has fewer earlier tokens than topk
(kernels/dsa_index: the scoring and top-k, reference and Triton).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pathlib import Path

from ..kernels.dsa_index.naive import naive_index_scores, naive_index_topk
from ..kernels.gpu import has_triton
from .config import ModelConfig
from .kv_cache import DTYPES, SegmentedKVCache, SegmentedState
from .rope import Rope
from .settings import EngineSettings


class MLAKVState(SegmentedState):
    """KVState (see attention.py) for MLA/DSA models over a SegmentedKVCache (kv_cache.py):
    the cache's "keys" are the latents [L, S, 1, R + rope], its "values" the indexer keys
    [L, S, 1, Di] (zeros in shared layers, which have no indexer). So the latents and the index
    live in the same segments, tiers and prefix-cache files as the other states' K/V: a
    PrefixCache adopts and saves `state.cache.segments` alike. Descriptors are not used (one
    block per segment keeps them negligible)."""

    def __init__(self, config: ModelConfig, rope: Rope | None = None, *,
                 settings: EngineSettings | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str = "cpu", capacity: int | None = None,
                 spill_dir: str | Path | None = None, host_segments: int = 0):
        """capacity is accepted for symmetry with DenseKVState; segments grow as needed."""
        assert config.mla is not None, "MLAKVState needs an MLA model"
        self.config = config
        self.settings = settings or EngineSettings()
        self.rope = rope if rope is not None else Rope(config)
        self.r = config.mla.kv_lora_rank
        s = self.settings
        self.cache = SegmentedKVCache(
            config.n_layers, 1, self.r + config.mla.qk_rope_head_dim,
            v_dim=config.dsa.head_dim if config.dsa is not None else 1,
            segment_size=s.segment_size, block_size=s.segment_size,
            dtype=dtype or DTYPES[s.kv_dtype], device=device, live_segments=s.live_segments,
            host_segments=host_segments, spill_dir=spill_dir)
        self._index_chunk: dict[int, torch.Tensor] = {}  # layer -> this chunk's indexer keys
        self.layout = "mla-latent"  # what a prefix-cache segment holds (engine/prefix_cache.py)

    @property
    def num_tokens(self) -> int:
        return self.cache.num_tokens

    def _rope_tail(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on the last qk_rope_head_dim dims of x [T, H, R + rope]."""
        head = x[..., : self.r]
        return torch.cat((head, self.rope._apply_partial(x[..., self.r:], positions)), dim=-1)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
               positions: torch.Tensor, *, scale: float,
               indices: torch.Tensor | None = None) -> torch.Tensor:
        """Store this chunk's latents k [T, R + rope] and attend to everything stored
        (causally), or only to `indices` [T, k] (-1 = nothing) when DSA selected tokens. v is
        unused: the values are the latent itself."""
        t = q.shape[0]
        start = self.cache.num_tokens
        end = start + t
        latent = self._rope_tail(k[:, None], positions)
        index_keys = self._index_chunk.pop(layer, None)
        if index_keys is None:
            index_keys = latent.new_zeros(t, 1, self.cache.v_dim)
        self.cache.write(layer, start, latent, index_keys)
        keys = self.cache.range(layer, 0, end)[0][:, 0].to(q.dtype)
        return latent_attention(self._rope_tail(q, positions), keys, self.r, start, scale=scale,
                                indices=indices)

    def select(self, layer: int, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor,
               positions: torch.Tensor, *, scale: float) -> torch.Tensor | None:
        """Keep this chunk's indexer keys for `layer` (stored by the `attend` that follows) and
        return each query's top-k tokens, or None when no query has more earlier tokens than
        topk (then every token is kept)."""
        start = self.cache.num_tokens
        end = start + q.shape[0]
        chunk = self.rope._apply_partial(k[:, None], positions)
        self._index_chunk[layer] = chunk
        topk = self.config.dsa.topk
        if end <= topk:
            return None
        keys = chunk[:, 0]
        if start:
            keys = torch.cat((self.cache.range(layer, 0, start)[1][:, 0].to(keys.dtype), keys))
        q = self.rope._apply_partial(q, positions)
        if q.is_cuda and has_triton():
            from ..kernels.dsa_index import fused_index_scores, fused_index_topk

            return fused_index_topk(fused_index_scores(q, keys, weights, start, scale), topk)
        return naive_index_topk(naive_index_scores(q, keys, weights, start, scale), topk)

    def commit(self, n: int) -> None:
        self.cache.commit(n)

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)


def latent_attention(q: torch.Tensor, keys: torch.Tensor, r: int, start: int, *, scale: float,
                     indices: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA attention (SDPA; on CUDA the token-sparse case runs kernels/mla_sparse).

    q [T, H, R + rope] (roped) at positions start.., keys [S, R + rope] (roped latents) ->
    [T, H, R]: softmax(q.k * scale) over the causal prefix, or over `indices` [T, k] (-1 =
    none), weighting the latents' first R dims."""
    t, s = q.shape[0], keys.shape[0]
    if indices is not None and q.is_cuda and has_triton():
        from ..kernels.mla_sparse import fused_mla_sparse_attention

        return fused_mla_sparse_attention(q, keys, indices, r, scale)
    mask = None
    if indices is not None:
        mask = token_mask(indices, s)
    elif t > 1:
        rows = torch.arange(start, start + t, device=q.device)[:, None]
        mask = torch.arange(s, device=q.device)[None, :] <= rows
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None, None],
                                         keys[None, None, :, :r], attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out[0].transpose(0, 1)


def token_mask(indices: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Boolean [T, n_keys]: True at each query's selected tokens (indices [T, k], -1 = none)."""
    mask = torch.zeros(indices.shape[0], n_keys + 1, dtype=torch.bool, device=indices.device)
    mask.scatter_(1, torch.where(indices < 0, n_keys, indices), True)
    return mask[:, :n_keys]
