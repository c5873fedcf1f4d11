"""A Llama-shaped decoder on one GPU over the Triton kernels: the speed path and its bench model.

Weights are plain bf16 tensors (random for benchmarks: speed does not depend on their values).
The KV cache is time-major per layer, `[capacity, Hkv, D]`, in bf16 or fp8 (e4m3), with
per-block min/max/mean key descriptors for routing. Attention is either

- `sparse`: sinks ∪ top-k routed blocks ∪ local window (kernels/attention/triton_sparse.py);
  prefill runs in chunks whose routing is shared per `route_chunk` queries (the chunk's last
  `route_tail` queries routed on their own), decode routes
  each token; or
- `dense`: PyTorch SDPA over the whole past (the reference the targets are measured against).

Decode is one CUDA graph per step: the position lives in a device tensor that the graph
advances, and the next token is the argmax written back into the input buffer, so a run of
replays is real greedy decoding with no host synchronisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...kernels.attention.triton_kvstore import NO_RING, fused_append_kv, fused_store_kv_blocks
from ...kernels.attention.triton_sparse import (
    fused_argmax,
    fused_block_scores,
    fused_decode_topk,
    fused_sparse_attention,
    fused_topk_blocks,
    fused_topk_blocks_unsorted,
    staging_rows,
)
from ...kernels.linear.triton_gemv import fused_gemv, fused_qkv_gemv
from ...kernels.norm.triton_rms_norm import fused_rms_norm
from ...kernels.rope.triton_rope import fused_rope
from ...kernels.swiglu.triton_swiglu import fused_swiglu
from ..settings import EngineSettings


@dataclass(frozen=True)
class Shape:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def __post_init__(self):
        assert self.heads % self.kv_heads == 0 and self.head_dim % 2 == 0

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def weight_bytes(self) -> int:
        per_layer = self.hidden * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden + 3 * self.hidden * self.ffn
        return 2 * (self.layers * per_layer + 2 * self.vocab * self.hidden)


LLAMA3_8B = Shape()


_DEFAULTS = EngineSettings()


@dataclass(frozen=True)
class Routing:
    """The engine's routing knobs, defaults taken from engine/settings.py's EngineSettings (so
    the bench model cannot drift from what the engine runs); the bench may override any."""

    sinks: int = _DEFAULTS.sink_tokens
    window: int = _DEFAULTS.window
    block: int = _DEFAULTS.block_size
    top_k: int = _DEFAULTS.top_k
    route_chunk: int = _DEFAULTS.route_chunk
    route_tail: int = _DEFAULTS.route_tail
    score: str = _DEFAULTS.block_score

    def __post_init__(self):
        assert self.sinks < self.block, "decode routing assumes the sinks lie inside block 0"


class Weights:
    def __init__(self, shape: Shape, device="cuda", seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def rand(*dims):
            # 1/sqrt(fan_in) keeps activations O(1) through 32 random layers
            return (torch.randn(*dims, generator=g, device=device, dtype=torch.bfloat16) / math.sqrt(dims[-1]))

        self.embed = torch.randn(s.vocab, s.hidden, generator=g, device=device, dtype=torch.bfloat16)
        self.wqkv = [rand(s.q_size + 2 * s.kv_size, s.hidden) for _ in range(s.layers)]
        self.wo = [rand(s.hidden, s.q_size) for _ in range(s.layers)]
        self.w13 = [rand(2 * s.ffn, s.hidden) for _ in range(s.layers)]
        self.w2 = [rand(s.hidden, s.ffn) for _ in range(s.layers)]
        self.ln1 = [1 + 0.1 * torch.randn(s.hidden, generator=g, device=device, dtype=torch.bfloat16) for _ in range(s.layers)]
        self.ln2 = [1 + 0.1 * torch.randn(s.hidden, generator=g, device=device, dtype=torch.bfloat16) for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=device, dtype=torch.bfloat16)
        self.lm_head = rand(s.vocab, s.hidden)


class KVCache:
    """Per-layer time-major K/V `[capacity, Hkv, D]` plus block min/max descriptors.
    (engine/gpu/tiering.py's `TieredKVCache` has the same interface for KV that spills to CPU.)"""

    ring_arg = NO_RING  # every position at its own row
    table = None  # no block table: logical block = physical block
    disk = ()  # no segment on disk
    usage = None  # no promotion counts

    def host(self, layer: int):
        return None

    def __init__(self, shape: Shape, capacity: int, dtype=torch.bfloat16, block: int = 64, layout: str = "time",
                 device="cuda"):
        self.shape, self.capacity, self.dtype, self.block, self.layout = shape, capacity, dtype, block, layout
        s = shape
        if layout == "time":
            dims = (s.layers, capacity, s.kv_heads, s.head_dim)
        else:  # "head": [L, Hkv, N, D], what SDPA wants for the dense baseline
            dims = (s.layers, s.kv_heads, capacity, s.head_dim)
        self.k = torch.empty(dims, dtype=dtype, device=device)
        self.v = torch.empty(dims, dtype=dtype, device=device)
        nb = -(-capacity // block)
        # bf16 descriptors (tensor-core scoring) unless the cache itself is fp32 (CPU checks)
        self.desc_dtype = torch.float32 if dtype == torch.float32 else torch.bfloat16
        self.kmin = torch.empty(s.layers, nb, s.kv_heads, s.head_dim, dtype=self.desc_dtype, device=device)
        self.kmax = torch.empty_like(self.kmin)
        self.kmean = torch.empty_like(self.kmin)
        # fp32 key sum of each layer's open (last, partly filled) block, which decode extends
        self.ksum = torch.zeros(s.layers, s.kv_heads, s.head_dim, dtype=torch.float32, device=device)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.kmin, self.kmax, self.kmean))

    def fill_random(self, n: int, seed: int = 1) -> None:
        """Stand-in for a prefilled document of n tokens (timing only), descriptors included."""
        g = torch.Generator(device=self.k.device).manual_seed(seed)
        step = 1 << 16  # keys per piece: bounded temporaries even at 1M tokens
        s = self.shape
        for layer in range(s.layers):
            for a in range(0, n, step):
                b = min(n, a + step)
                keys = torch.randn(b - a, s.kv_heads, s.head_dim, generator=g, device=self.k.device, dtype=torch.bfloat16)
                vals = torch.randn(b - a, s.kv_heads, s.head_dim, generator=g, device=self.k.device, dtype=torch.bfloat16)
                if self.layout == "time":
                    self.k[layer, a:b] = keys
                    self.v[layer, a:b] = vals
                    self.update_descriptors(layer, a, b)
                else:
                    self.k[layer, :, a:b] = keys.transpose(0, 1)
                    self.v[layer, :, a:b] = vals.transpose(0, 1)

    def update_descriptors(self, layer: int, start: int, end: int) -> None:
        """Recompute min/max/mean of every block touched by keys start..end-1 (their keys are stored)."""
        b0, b1 = start // self.block, -(-end // self.block)
        keys = self.k[layer, b0 * self.block: b1 * self.block]
        if keys.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            keys = keys.to(torch.bfloat16)  # fp8 has no min/max kernels
        pad = 0
        if keys.shape[0] < (b1 - b0) * self.block or end % self.block:
            keys = keys[: end - b0 * self.block].float()
            pad = (b1 - b0) * self.block - keys.shape[0]
            lo = torch.cat([keys, keys.new_full((pad, *keys.shape[1:]), float("inf"))])
            hi = torch.cat([keys, keys.new_full((pad, *keys.shape[1:]), float("-inf"))])
            zs = torch.cat([keys, keys.new_zeros((pad, *keys.shape[1:]))])
        else:
            lo = hi = zs = keys
        shp = (b1 - b0, self.block, self.shape.kv_heads, self.shape.head_dim)
        self.kmin[layer, b0:b1] = lo.reshape(shp).amin(1).to(self.desc_dtype)
        self.kmax[layer, b0:b1] = hi.reshape(shp).amax(1).to(self.desc_dtype)
        sums = zs.reshape(shp).float().sum(1)
        counts = torch.full((b1 - b0, 1, 1), float(self.block), device=sums.device)
        counts[-1] = self.block - pad
        self.kmean[layer, b0:b1] = (sums / counts).to(self.desc_dtype)
        self.ksum[layer] = sums[-1]  # decode's append continues the last block from here


GEMV_ALL = ("qkv", "o", "gate_up", "down", "lm_head")
# Measured on the H200 in one graphed decode step at 128K (bench/results/gpu.md): every
# projection in the fused GEMV 5.23 ms, cuBLAS for o/down only 5.47, all cuBLAS 5.50 — though
# timed one by one, cuBLAS looked faster for o and down (its launch gaps hid in isolation).
GEMV_DEFAULT = GEMV_ALL


class Model:
    def __init__(self, shape: Shape, weights: Weights, routing: Routing = Routing(), *,
                 gemv: tuple[str, ...] = GEMV_DEFAULT):
        # gemv: the decode projections that run through kernels/linear's GEMV (their RMSNorm /
        # SwiGLU folded in) instead of cuBLAS plus separate kernels; the others stay cuBLAS
        assert set(gemv) <= set(GEMV_ALL), gemv
        self.s, self.w, self.r = shape, weights, routing
        self.gemv = tuple(gemv)
        self.fast_argmax = True  # decode's greedy pick through kernels/attention's two-pass argmax
        self.fused_store = True  # prefill's KV store + block descriptors in one kernel per layer
        self.fast_topk = True  # prefill routing's top-k through the decode top-k kernels, unsorted
        self.fused_qkv = True  # decode: RoPE + KV append folded into the qkv GEMV (needs "qkv" in gemv)
        # prefill routing: candidate masks in the block-score kernel and -1 for non-candidate picks
        # in the top-k kernels (was: torch masks, where, gather over the scores per layer)
        self.fold_routing = True
        self._decode_picks: list[torch.Tensor] = []  # a tiered decode step's routing picks (promotion)
        half = shape.head_dim // 2
        self.inv_freq = 1.0 / shape.rope_theta ** (
            torch.arange(half, dtype=torch.float64, device=weights.embed.device) * 2 / shape.head_dim)

    def cos_sin(self, positions: torch.Tensor):
        ang = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        return ang.cos().float(), ang.sin().float()

    # --- one layer's attention under each mode -------------------------------------------------
    def _attend_sparse_prefill(self, layer, q, kv: KVCache, p0: int, t: int):
        """Routing chunks of route_chunk queries, then the last route_tail queries on their own
        (router.routing_chunks); the keys of the whole chunk are stored before any attends."""
        r = self.r
        head = t - r.route_tail if 0 < r.route_tail < t else t
        out = torch.empty_like(q)
        self._route_and_attend(layer, q[:head], kv, p0, r.route_chunk, out[:head])
        if head < t:
            self._route_and_attend(layer, q[head:], kv, p0 + head, t - head, out[head:])
        return out

    def _route_and_attend(self, layer, q, kv: KVCache, p0: int, chunk: int, out: torch.Tensor) -> None:
        r = self.r
        t = q.shape[0]
        nb = -(-(p0 + t) // r.block)
        mean = kv.kmean[layer, :nb] if r.score == "mean" else kv.kmin[layer, :nb]
        k_pick = min(r.top_k, nb)
        first = r.sinks // r.block
        if self.fold_routing and self.fast_topk and k_pick <= 64 and p0 + min(chunk, t) - r.window >= 0:
            scores = fused_block_scores(q, kv.kmin[layer, :nb], kv.kmax[layer, :nb], mean, r.score, chunk=chunk,
                                        chunk_candidates=(first, p0, r.window, r.block))
            c = scores.shape[0]
            idx = fused_decode_topk(scores.view(-1, nb), k_pick, drop_noncandidates=True).view(c, -1, k_pick)
            if k_pick < r.top_k:
                idx = torch.cat([idx, idx.new_full((*idx.shape[:-1], r.top_k - k_pick), -1)], dim=-1)
            self._attend_routed(layer, q, kv, p0, chunk, c, idx, out)
            return
        scores = fused_block_scores(q, kv.kmin[layer, :nb], kv.kmax[layer, :nb], mean, r.score, chunk=chunk)
        c = scores.shape[0]
        last = torch.clamp(torch.arange(1, c + 1, device=q.device) * chunk, max=t) - 1 + p0
        # a block is a candidate if some key of it is outside the window of the chunk's last query
        end = ((last - r.window + 1 + r.block - 1) // r.block).clamp_min(0)[:, None, None]
        topk = fused_topk_blocks_unsorted if self.fast_topk else fused_topk_blocks
        idx = topk(scores, r.top_k, first, end)
        self._attend_routed(layer, q, kv, p0, chunk, c, idx, out)

    def _attend_routed(self, layer, q, kv, p0: int, chunk: int, c: int, idx: torch.Tensor, out: torch.Tensor) -> None:
        if _on_disk(kv):
            # tiered with segments on disk: launch by groups of routing chunks whose picks the host
            # pool can hold at once, each after its disk segments are back (no ON_DISK entry is read)
            for c0, c1 in kv.fault_groups(idx, c):
                a, b = c0 * chunk, min(c1 * chunk, q.shape[0])
                self._launch_routed(layer, q[a:b], kv, p0 + a, chunk, c1 - c0, idx[c0:c1], out[a:b])
            return
        self._launch_routed(layer, q, kv, p0, chunk, c, idx, out)

    def _launch_routed(self, layer, q, kv, p0: int, chunk: int, c: int, idx: torch.Tensor, out: torch.Tensor) -> None:
        r = self.r
        host = kv.host(layer)
        staging = None
        if host is not None:  # tiered: the selected host blocks are staged on the GPU first
            staging = kv.staging_buffers(staging_rows(c, self.s.kv_heads, idx.shape[-1], r.block))
        fused_sparse_attention(q, kv.k[layer], kv.v[layer], p0, idx, r.block, r.sinks, r.window,
                               route_chunk=chunk if c > 1 else None, out=out, block_table=kv.table,
                               host=host, staging=staging)

    def decode_end(self, pos: torch.Tensor) -> torch.Tensor:
        """First block whose keys the window of the query at `pos` covers (same for all layers)."""
        r = self.r
        return ((pos - r.window + r.block) // r.block).clamp_min(0)

    def _attend_sparse_decode(self, layer, q, kv: KVCache, pos: torch.Tensor, end: torch.Tensor):
        r = self.r
        mean = kv.kmean[layer] if r.score == "mean" else kv.kmin[layer]
        scores = fused_block_scores(q, kv.kmin[layer], kv.kmax[layer], mean, r.score,
                                    candidates=(r.sinks // r.block, end))
        # Fewer than top_k candidates only early in a context: the extra picks are then blocks
        # the window covers (or not yet written), whose keys the kernel masks (exact because no
        # block precedes `first` when sinks < block), so the raw top-k needs no clean-up launches.
        idx = fused_decode_topk(scores, min(r.top_k, scores.shape[-1]))
        if kv.table is not None:
            if kv.disk:
                kv.fault_in(idx)  # eager only: a host sync, then the picked disk segments come back
            if kv.usage is not None:
                self._decode_picks.append(idx)  # counted once per step (promotion)
        # tiered: selected blocks in CPU memory are read in place over PCIe (each once per step)
        out, _ = fused_sparse_attention(q, kv.k[layer], kv.v[layer], pos, idx, r.block, r.sinks, r.window,
                                        block_table=kv.table, host=kv.host(layer))
        return out

    def layer(self, i: int, x: torch.Tensor, kv: KVCache, cos, sin, *, p0: int | None = None,
              pos: torch.Tensor | None = None, mode: str = "sparse", dense_len: int | None = None,
              end: torch.Tensor | None = None):
        s, w = self.s, self.w
        t = x.shape[0]
        gemv = self.gemv if pos is not None else ()
        # decode: RoPE and the KV append (with descriptors) ride in the qkv GEMV's epilogue
        folded = "qkv" in gemv and self.fused_qkv and mode == "sparse" and pos is not None
        if folded:
            qkv = fused_qkv_gemv(x, w.wqkv[i], w.ln1[i], s.eps, cos, sin, s.heads, s.kv_heads, pos, kv.k[i],
                                 kv.v[i], kv.kmin[i], kv.kmax[i], kv.kmean[i], kv.ksum[i], self.r.block,
                                 ring=kv.ring_arg)
        elif "qkv" in gemv:
            qkv = fused_gemv(x, w.wqkv[i], norm_weight=w.ln1[i], eps=s.eps)
        else:
            qkv = fused_rms_norm(x, w.ln1[i], s.eps) @ w.wqkv[i].t()
        qk = qkv[:, : s.q_size + s.kv_size].view(t, s.heads + s.kv_heads, s.head_dim)
        if not folded:
            fused_rope(qk, cos, sin, out=qk)  # q and k heads are adjacent: one launch rotates both
        q = qkv[:, : s.q_size].view(t, s.heads, s.head_dim)
        k = qkv[:, s.q_size: s.q_size + s.kv_size].view(t, s.kv_heads, s.head_dim)
        v = qkv[:, s.q_size + s.kv_size:].view(t, s.kv_heads, s.head_dim)
        if mode == "sparse":
            if pos is not None:
                if not folded:
                    fused_append_kv(k, v, kv.k[i], kv.v[i], kv.kmin[i], kv.kmax[i], pos, self.r.block,
                                    kmean=kv.kmean[i], ksum=kv.ksum[i], ring=kv.ring_arg)
                o = self._attend_sparse_decode(i, q, kv, pos, self.decode_end(pos) if end is None else end)
            else:
                if self.fused_store or kv.table is not None:
                    fused_store_kv_blocks(k, v, kv.k[i], kv.v[i], kv.kmin[i], kv.kmax[i], p0, kv.block,
                                          kmean=kv.kmean[i], ksum=kv.ksum[i], ring=kv.ring_arg)
                else:
                    kv.k[i, p0: p0 + t] = k
                    kv.v[i, p0: p0 + t] = v
                    kv.update_descriptors(i, p0, p0 + t)
                o = self._attend_sparse_prefill(i, q, kv, p0, t)
        else:
            o = self._attend_dense(i, q, k, v, kv, p0, pos, dense_len)
        if "o" in gemv:
            x = fused_gemv(o.reshape(t, s.q_size), w.wo[i], residual=x)
        else:
            # in place: out-of-place addmm first copies the residual stream into its result (a
            # 32 MiB device copy per projection in a 4096-token prefill chunk); x is this layer's own
            x = x.addmm_(o.reshape(t, s.q_size), w.wo[i].t())
        if "gate_up" in gemv:
            a = fused_gemv(x, w.w13[i], norm_weight=w.ln2[i], eps=s.eps, swiglu=True)
        else:
            gu = fused_rms_norm(x, w.ln2[i], s.eps) @ w.w13[i].t()
            a = fused_swiglu(gu[:, : s.ffn], gu[:, s.ffn:])
        if "down" in gemv:
            return fused_gemv(a, w.w2[i], residual=x)
        return x.addmm_(a, w.w2[i].t())

    def _attend_dense(self, i, q, k, v, kv: KVCache, p0, pos, dense_len):
        s = self.s
        t = q.shape[0]
        g = s.heads // s.kv_heads
        if pos is not None:
            # decode at a fixed context length (dense_len keys incl. this one): SDPA has static
            # shapes only; the G query heads of a group become G queries of its kv head
            kv.k[i, :, dense_len - 1] = k[0]
            kv.v[i, :, dense_len - 1] = v[0]
            qh = q.view(s.kv_heads, g, s.head_dim)[None]
            o = F.scaled_dot_product_attention(qh, kv.k[i, None, :, :dense_len], kv.v[i, None, :, :dense_len])
            return o.reshape(1, s.heads, s.head_dim)
        kv.k[i, :, p0: p0 + t] = k.transpose(0, 1)
        kv.v[i, :, p0: p0 + t] = v.transpose(0, 1)
        assert p0 == 0, "the dense baseline prefills in one piece"
        kk = kv.k[i, :, :t].repeat_interleave(g, dim=0)[None]
        vv = kv.v[i, :, :t].repeat_interleave(g, dim=0)[None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv, is_causal=True)
        return o[0].transpose(0, 1)

    # --- whole passes ---------------------------------------------------------------------------
    def logits_last(self, x: torch.Tensor, gemv: bool = False) -> torch.Tensor:
        if gemv:
            return fused_gemv(x[-1:], self.w.lm_head, norm_weight=self.w.norm, eps=self.s.eps)
        h = fused_rms_norm(x[-1:], self.w.norm, self.s.eps)
        return h @ self.w.lm_head.t()

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, kv: KVCache, p0: int = 0, *, chunk: int = 4096, mode: str = "sparse",
                chunk_times: list | None = None) -> torch.Tensor:
        """Run tokens [T] at positions p0.. through the model, filling kv; returns last logits."""
        t_all = tokens.shape[0]
        step = chunk if mode == "sparse" else t_all
        logits = None
        for a in range(0, t_all, step):
            ev = None
            if chunk_times is not None:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            b = min(t_all, a + step)
            if kv.table is not None:  # tiered KV: room for this chunk, and start the next one's moves
                kv.prepare(p0 + a, p0 + b)
                assert kv.evicted <= max(p0 + a - self.r.window, kv.pin), "window moved off the GPU: ring too small"
                kv.prefetch(p0 + b + step)
            x = self.w.embed[tokens[a:b]]
            cos, sin = self.cos_sin(torch.arange(p0 + a, p0 + b, device=tokens.device))
            for i in range(self.s.layers):
                x = self.layer(i, x, kv, cos, sin, p0=p0 + a, mode=mode)
            if b == t_all:
                logits = self.logits_last(x)
            if ev is not None:
                ev[1].record()
                chunk_times.append((p0 + a, b - a, ev))
        return logits

    def decode_step(self, tok: torch.Tensor, pos: torch.Tensor, kv: KVCache, mode: str = "sparse",
                    dense_len: int | None = None) -> None:
        """tok [1] long, pos [1] int32 device buffers; overwrites tok with the greedy next token
        and advances pos (sparse mode; the dense baseline stays at dense_len). With a tiered
        cache the caller maps the positions first (`kv.prepare`; GraphedDecode does)."""
        x = self.w.embed[tok]
        cos, sin = self.cos_sin(pos)
        end = self.decode_end(pos)  # once per step, not per layer: fewer graph nodes
        self._decode_picks = []
        for i in range(self.s.layers):
            x = self.layer(i, x, kv, cos, sin, pos=pos, mode=mode, dense_len=dense_len, end=end)
        if self._decode_picks:  # tiered with promotion: one count of all layers' picks, on the device
            kv.record_use(torch.cat([p.reshape(-1) for p in self._decode_picks]))
            self._decode_picks = []
        logits = self.logits_last(x, gemv="lm_head" in self.gemv)
        if self.fast_argmax:
            fused_argmax(logits, out=tok)
        else:
            tok.copy_(logits.argmax(-1))
        if mode == "sparse":
            pos.add_(1)


def _on_disk(kv) -> bool:
    """A tiered cache with segments on disk: every attention launch checks its picks first."""
    return kv.table is not None and bool(kv.disk)


class GraphedDecode:
    """One decode step captured as a CUDA graph over static token/position buffers. With a tiered
    cache: while any segment is on disk, neither capture nor replay (the graph has no fault
    check, so it could read a disk entry); the loop then decodes eagerly (`Model.decode_step`).
    A decode loop with promotion calls `kv.rebalance()` between replays."""

    def __init__(self, model: Model, kv: KVCache, start_pos: int, mode: str = "sparse", warmup: int = 2):
        self.tok = torch.zeros(1, dtype=torch.long, device="cuda")
        self.pos = torch.tensor([start_pos], dtype=torch.int32, device="cuda")
        self.start = start_pos
        dense_len = start_pos + 1 if mode == "dense" else None
        if kv.table is not None:  # tiered KV: the positions the replays append to are mapped on the GPU
            kv.prepare(start_pos, min(start_pos + 512, kv.capacity))
            assert kv.evicted <= max(start_pos - model.r.window, kv.pin), "window moved off the GPU: ring too small"
            self._refuse_disk(kv)
        self.kv = kv
        step = lambda: model.decode_step(self.tok, self.pos, kv, mode, dense_len)
        with torch.inference_mode():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(warmup):  # compiles kernels, sets up cuBLAS handles
                    step()
            torch.cuda.current_stream().wait_stream(s)
            self.reset()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                step()
        self.reset()

    def reset(self) -> None:
        self.pos.fill_(self.start)
        self.tok.fill_(1)

    @staticmethod
    def _refuse_disk(kv) -> None:
        if _on_disk(kv):
            raise RuntimeError(f"{len(kv.disk)} KV segments on disk: decode eagerly (Model.decode_step)")

    def replay(self) -> None:
        self._refuse_disk(self.kv)
        self.graph.replay()
