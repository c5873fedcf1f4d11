"""The sparse KV state: sinks + local window + top-k routed blocks, exact softmax over their union.

For a chunk of queries c0..c_end (prefill chunk or one decode token), per layer:

1. store the chunk's raw (pre-RoPE) k/v and refresh the descriptors of the blocks it touched;
2. route (router.py): score candidate blocks by their descriptors, keep top_k per kv head,
   one decision per `route_chunk` queries, and one for the call's last `route_tail` queries
   (`routing_chunks`);
3. attend in two disjoint parts and merge them by log-sum-exp:
   - *distant*: keys before R = c0 - window + 1 (outside every query's window): the sinks and
     the selected blocks' keys, gathered per kv head and rotated at the positions the scheme
     gives them (EngineSettings.positions);
   - *region*: keys R..c_end at true relative positions, masked per query to its own window
     plus the selected blocks that reach into the region.

When every candidate block is selected the key sets are exactly the causal prefix and the
positions are the true ones (for every scheme), so the output equals dense attention; the
state counts the chunks where that did not hold in `uncovered_chunks`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..kernels.attention import (
    merge_attention,
    naive_attention,
    naive_block_descriptors,
    naive_masked_attention,
)
from .config import ModelConfig
from .kv_cache import DTYPES, SegmentedKVCache, SegmentedState
from .rope import Rope
from .router import Route, route, routing_chunks
from .settings import EngineSettings


class SparseKVState(SegmentedState):
    """KVState (see attention.py) over a SegmentedKVCache."""

    def __init__(
        self,
        config: ModelConfig,
        settings: EngineSettings | None = None,
        rope: Rope | None = None,
        *,
        device: torch.device | str = "cpu",
        spill_dir: str | Path | None = None,
        host_segments: int = 0,
    ):
        self.config = config
        self.settings = settings or EngineSettings()
        self.routed = self.settings.attention != "dense"  # see KVStateBase.routed (engine/gpu/state.py)
        self.rope = rope if rope is not None else Rope(config)
        s = self.settings
        self.cache = SegmentedKVCache(
            config.n_layers, config.n_kv_heads, config.head_dim,
            segment_size=s.segment_size, block_size=s.block_size, dtype=DTYPES[s.kv_dtype],
            device=device, live_segments=s.live_segments, host_segments=host_segments,
            spill_dir=spill_dir,
        )
        self.layout = "unrotated"  # keys stored before RoPE (positions are applied when read)
        self.routed_chunks = 0  # chunk-layers that went through routing
        self.uncovered_chunks = 0  # ... of which some candidate block was left out
        self.last_route: Route | None = None

    @property
    def num_tokens(self) -> int:
        return self.cache.num_tokens

    @property
    def exact(self) -> bool:
        """No query so far attended to fewer keys than dense attention would."""
        return self.uncovered_chunks == 0

    # --- KVState -------------------------------------------------------------------------------

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Queries are taken to sit at indices num_tokens.. of the sequence (their positions)."""
        t = q.shape[0]
        c0 = self.cache.num_tokens
        n = c0 + t
        self.cache.write(layer, c0, k, v)
        self._refresh_descriptors(layer, c0, n)
        s = self.settings
        if s.attention == "dense" or n <= s.dense_below:
            out = self._dense(layer, q, n)
        else:  # keys of the whole chunk are stored: each routing chunk sees its causal prefix
            out = torch.cat([self._sparse(layer, q[a:b], c0 + a, c0 + b)
                             for a, b in routing_chunks(t, s)])
        return out.to(q.dtype)

    def commit(self, n: int) -> None:
        self.cache.commit(n)

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)

    # --- internals -------------------------------------------------------------------------------

    def _positions(self, a: int, b: int) -> torch.Tensor:
        return torch.arange(a, b, device=self.cache.device)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.rope.apply(x.float(), positions)

    def _refresh_descriptors(self, layer: int, c0: int, n: int) -> None:
        b = self.settings.block_size
        first = c0 // b
        keys, _ = self.cache.range(layer, first * b, n)
        if self.settings.positions == "true":  # routing compares rotated queries and keys
            keys = self._rotate(keys, self._positions(first * b, n))
        self.cache.write_descriptors(layer, first, *naive_block_descriptors(keys, b))

    def _dense(self, layer: int, q: torch.Tensor, n: int) -> torch.Tensor:
        t = q.shape[0]
        k, v = self.cache.range(layer, 0, n)
        pos = self._positions(0, n)
        out, _ = naive_attention(self._rotate(q, pos[n - t:]), self._rotate(k, pos), v, n - t)
        return out

    def _sparse(self, layer: int, q: torch.Tensor, c0: int, n: int) -> torch.Tensor:
        s, cfg = self.settings, self.config
        t, c_end = q.shape[0], n - 1
        g = cfg.n_heads // cfg.n_kv_heads
        q_idx = self._positions(c0, n)

        if s.positions == "true":
            q_route = self._rotate(q, q_idx)
        else:  # descriptors are of raw keys: score as if every block sat `window` tokens back
            q_route = self._rotate(q, torch.full((t,), s.window, device=q_idx.device))
        r = self._route(layer, q_route, c_end)
        self.last_route = r
        self.routed_chunks += 1
        self.uncovered_chunks += not r.covered

        region = max(0, c0 - s.window + 1)  # R: keys before it are outside every window
        out_b, lse_b = self._region_part(layer, q, q_idx, region, n, r.block_idx)
        if region == 0:
            return out_b
        out_a, lse_a = self._distant_part(layer, q, q_idx, region, r, g)
        out, _ = merge_attention(out_a, lse_a, out_b, lse_b)
        return out

    def _route(self, layer: int, q_route: torch.Tensor, c_end: int) -> Route:
        """The routing decision; its own method so diagnostics can substitute a known one."""
        nb = -(-(c_end + 1) // self.settings.block_size)
        return route(q_route, *self.cache.descriptors(layer, nb), c_end, self.settings)

    def _region_part(self, layer, q, q_idx, region, n, block_idx):
        s = self.settings
        k, v = self.cache.range(layer, region, n)
        j = self._positions(region, n)
        i = q_idx[:, None]
        hkv = self.config.n_kv_heads
        chosen = torch.zeros(hkv, -(-n // s.block_size), dtype=torch.bool, device=j.device)
        chosen.scatter_(1, block_idx, True)
        visible = (j[None] > i - s.window) | (j[None] < s.sink_tokens)  # [T, M]
        mask = (j[None] <= i) & (visible[None] | chosen[:, j // s.block_size][:, None, :])
        if s.positions == "true":
            qr, kr = self._rotate(q, q_idx), self._rotate(k, j)
        else:  # only distances matter: small positions keep fp32 angles exact
            qr, kr = self._rotate(q, q_idx - region), self._rotate(k, j - region)
        return naive_masked_attention(qr, kr.transpose(0, 1), v.transpose(0, 1).float(), mask)

    def _distant_part(self, layer, q, q_idx, region, r: Route, g: int):
        s, hkv = self.settings, self.config.n_kv_heads
        dev = q_idx.device
        n_sinks = min(s.sink_tokens, region)
        sinks = torch.arange(n_sinks, device=dev).expand(hkv, n_sinks)
        tok = (r.block_idx[:, :, None] * s.block_size + torch.arange(s.block_size, device=dev)).flatten(1)
        routed = (tok >= s.sink_tokens) & (tok < region)
        idx = torch.cat([sinks, tok.clamp_max(region - 1)], dim=1)  # [Hkv, M]
        valid = torch.cat([torch.ones_like(sinks, dtype=torch.bool), routed], dim=1)
        k, v = self.cache.gather(layer, idx)

        k_pos, q_pos = self._distant_positions(idx, routed, n_sinks, region, q_idx, r.covered)
        kr = torch.stack([self._rotate(k[h][:, None], k_pos[h])[:, 0] for h in range(hkv)])
        qr = torch.cat([self._rotate(q[:, h * g:(h + 1) * g], q_pos[h]) for h in range(hkv)], dim=1)
        mask = valid[:, None, :].expand(hkv, q.shape[0], idx.shape[1])
        return naive_masked_attention(qr, kr, v.float(), mask)

    def _distant_positions(self, idx, routed, n_sinks, region, q_idx, covered):
        """Key positions [Hkv, M] and query positions [Hkv, T] for the distant part.

        The region part rotates its keys at (true) relative positions, so the distant part
        only has to agree with it on the query: both are exact up to a shift of all positions.
        """
        s = self.settings
        hkv = idx.shape[0]
        scheme = s.positions
        if scheme == "inflm" and covered:
            scheme = "packed"  # nothing is missing: true distances are in range by construction
        if scheme == "true":
            return idx, q_idx.expand(hkv, -1)
        sink_pos = idx[:, :n_sinks]
        if scheme == "packed":
            rank = routed.long().cumsum(1) - 1
            routed_pos = n_sinks + rank
            start = n_sinks + routed.sum(1, keepdim=True)  # where R lands in the packed sequence
        else:  # inflm: every routed key just outside the window of the chunk's first query
            start = torch.full((hkv, 1), n_sinks + s.top_k * s.block_size, device=idx.device)
            routed_pos = (start - 1).expand_as(routed)
        k_pos = torch.cat([sink_pos, routed_pos], dim=1)
        q_pos = start + (q_idx - region)[None]
        return k_pos, q_pos
