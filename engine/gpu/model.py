"""The engine's decoder on CUDA: every Llama-family checkpoint the engine loads, and GLM-4 /
GLM-4.5 (`glm4`, `glm4_moe`), over the Triton kernels (GLM's MLA models: engine/gpu/glm.py).

`Engine.load(..., device="cuda")` builds a `CudaDecoder` from the checkpoint's own tensors
(bf16 by default); `bench/gpu.py` benchmarks the same class on random-weight checkpoints
written by `transformers`. The CPU path (engine/models/llama.py) is the reference it is
checked against, as is HF transformers.

Per layer: RMSNorm + fused q/k/v projection (+ Qwen2 biases, + Qwen3 q/k norms), RoPE at true
positions, the K/V store with block descriptors, attention, o projection, RMSNorm + gate/up +
SwiGLU + down. Decode (one token) runs every projection through the GEMV of kernels/linear with
its norm / SwiGLU / residual fused, and RoPE and the KV append in the qkv GEMV's epilogue (Llama,
Mistral) or in one launch after it with the biases and q/k norms (Qwen2, Qwen3:
`fused_rope_append`); prefill runs cuBLAS GEMMs. GLM adds partial / interleaved RoPE (made
rotate_half by the order q/k dims are loaded in: `rope_halves_order`), norms of each sublayer's
output (GLM-4) and MoE layers (engine/gpu/moe.py). FP8 block-scaled checkpoints keep their
matrices e4m3 on the device (`CudaWeights`): every product goes through kernels/linear/triton_fp8.py
`linear_gemv` / `linear_mm` / `linear_add_mm`, which run `fp8_gemv` / `fp8_matmul` on those and
the plain kernels above on the rest (MoE experts: engine/gpu/moe.py). Attention reads the state's
settings:

- sparse: sinks ∪ top-k routed blocks ∪ local window (kernels/attention/triton_sparse_attention.py);
  prefill routes once per `route_chunk` queries (the chunk's last `route_tail` on their own),
  decode per token;
- dense: the same kernel with no routed blocks and a window wider than any context (exact
  causal attention; what `ask` over retrieved passages uses).

Decode is one CUDA graph per state (`GraphedDecode`): the position lives in a device tensor the
graph advances and the greedy token is written back into the input buffer, so a run of replays
is greedy decoding with no host synchronisation; the logits of each step land in a static
buffer for callers that choose tokens themselves.
"""

from __future__ import annotations

import weakref

import torch

from ...kernels.attention.triton_block_scores import fused_block_scores
from ...kernels.attention.triton_kvstore import fused_rope_append, fused_store_kv_blocks
from ...kernels.attention.triton_sparse_attention import fused_sparse_attention, staging_rows
from ...kernels.attention.triton_topk import fused_decode_topk, fused_topk_blocks_unsorted
from ...kernels.linear.naive_fp8 import fuse_rows, held_bytes, is_fp8, pair_scales, take_rows
from ...kernels.linear.triton_fp8 import linear_add_mm, linear_gemv, linear_mm
from ...kernels.linear.triton_gemv import fused_qkv_gemv
from ...kernels.norm.triton_rms_norm import fused_rms_norm
from ...kernels.rope.triton_rope import fused_rope
from ...kernels.sampling.triton_argmax import fused_argmax
from ...kernels.swiglu.triton_swiglu import fused_swiglu
from ..config import ModelConfig
from ..models.mtp import take_mtp_weights
from ..rope import inv_frequencies
from .moe import MoeLayer, pop_experts

DENSE_WINDOW = 1 << 30  # a window wider than any context: the sparse kernel attends densely


def rope_halves_order(config: ModelConfig) -> list[int] | None:
    """The order of a head's dims under which the checkpoint's RoPE is rotate_half over the whole
    head, or None where it already is (the Llama family).

    GLM turns only the first rotary_dim dims of a q/k head, as interleaved pairs (x0, x1),
    (x2, x3).. (`glm4`) or as the halves of those dims (`glm4_moe`). Listing each pair's first
    dim in the head's first half and its second dim at the same place in the second half (the
    dims RoPE leaves alone paired among themselves, turned by angle 0: `CudaDecoder.inv_freq` is
    padded with zeros) makes it the rotate_half every kernel here applies. q and k rows (and
    their biases and q/k norms, which act per dim) are loaded in this order, so no dot product
    changes, nothing is permuted at run time, and prefill, decode, the sparse routing
    descriptors and the prefix-cache segments of this state all see the one layout (keys in it
    are not HF's order: only this decoder reads them)."""
    d, r = config.head_dim, config.rotary_dim or config.head_dim
    if (d - r) % 2:
        raise ValueError(f"head_dim {d} minus rotary_dim {r} must be even")
    if config.rope_interleaved:
        first, second = list(range(0, r, 2)), list(range(1, r, 2))
    else:
        first, second = list(range(r // 2)), list(range(r // 2, r))
    rest = list(range(r, d))
    order = first + rest[: len(rest) // 2] + second + rest[len(rest) // 2:]
    return None if order == list(range(d)) else order


class CudaWeights:
    """The checkpoint's tensors (HF names, already in the run dtype on the device), fused the way
    the kernels read them: q/k/v rows in one matrix, gate/up rows in one matrix. Each source
    tensor is dropped as soon as it is fused, so loading peaks at one layer above the model.

    FP8 checkpoints (config.fp8_block) keep each quantised matrix e4m3 as an `Fp8Weight`
    (kernels/linear/naive_fp8.py: scales per row and column block), which the products of
    kernels/linear/triton_fp8.py run as stored. Fusing and GLM's q/k row order (`rope_halves_order`)
    move whole rows with their scales, so they are exact for any block size; a fused projection
    whose parts mix FP8 and plain matrices is kept as runs (gate/up: one dequantised matrix, as
    the SwiGLU GEMV reads gate and up rows of one matrix)."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor]):
        c = config
        t = {name.removeprefix("model."): x for name, x in tensors.items()}
        tensors.clear()
        # GLM-4.5's MTP layers, kept aside for speculative decoding (engine/models/mtp.py)
        self.mtp_weights = take_mtp_weights(t, c, t["embed_tokens.weight"].dtype)
        if c.fp8_block is not None:
            pair_scales(t, c.fp8_block)
        take = t.pop
        experts = pop_experts(t)  # GLM-4.5 checkpoints written one tensor per expert
        order = rope_halves_order(c)
        hd = c.head_dim

        def heads(x):  # a q/k projection's rows (or bias, or norm; or an Fp8Weight) in `order`
            if order is None:
                return x
            rows = torch.arange(x.shape[0] // hd)[:, None] * hd + torch.tensor(order)
            return take_rows(x, rows.flatten().to(x.w.device if is_fp8(x) else x.device))

        self.embed = take("embed_tokens.weight")
        if is_fp8(self.embed):
            raise KeyError("FP8 embeddings are not supported (FP8 checkpoints quantise the linear layers)")
        dtype = self.embed.dtype  # FP8 matrices a kernel cannot read as they are are dequantised to it
        self.wqkv, self.bqkv, self.q_norm, self.k_norm = [], [], [], []
        self.wo, self.w13, self.w2, self.ln1, self.ln2 = [], [], [], [], []
        self.post_attn, self.post_mlp = [], []  # GLM-4's norms of each sublayer's output
        self.moe: list = []  # per layer: GLM-4.5's MoE (engine/gpu/moe.py `MoeLayer`) or None (dense MLP)
        for i in range(c.n_layers):
            p = f"layers.{i}."
            a = p + "self_attn."
            self.wqkv.append(fuse_rows([heads(take(a + "q_proj.weight")), heads(take(a + "k_proj.weight")),
                                        take(a + "v_proj.weight")], dtype))
            if c.qkv_bias:
                self.bqkv.append(torch.cat([heads(take(a + "q_proj.bias")), heads(take(a + "k_proj.bias")),
                                            take(a + "v_proj.bias")]))
            if c.qk_norm:
                self.q_norm.append(heads(take(a + "q_norm.weight")))
                self.k_norm.append(heads(take(a + "k_norm.weight")))
            self.wo.append(take(a + "o_proj.weight"))
            m = p + "mlp."
            if c.moe is not None and c.moe.layer_types[i] == "sparse":  # GLM-4.5's layers past first_k_dense_replace
                self.moe.append(MoeLayer(c, m, take, experts.pop(i, None), dtype))
                self.w13.append(None)
                self.w2.append(None)
            else:
                self.moe.append(None)
                gate_up = take(m + "gate_up_proj.weight", None)  # GLM-4 stores gate and up as one matrix
                if gate_up is None:
                    gate_up = fuse_rows([take(m + "gate_proj.weight"), take(m + "up_proj.weight")], dtype, runs=False)
                self.w13.append(gate_up)
                self.w2.append(take(m + "down_proj.weight"))
            self.ln1.append(take(p + "input_layernorm.weight"))
            self.ln2.append(take(p + "post_attention_layernorm.weight"))
            if c.post_norms:
                self.post_attn.append(take(p + "post_self_attn_layernorm.weight"))
                self.post_mlp.append(take(p + "post_mlp_layernorm.weight"))
        self.norm = take("norm.weight")
        head = t.pop("lm_head.weight", None)
        self.lm_head = self.embed if c.tie_embeddings or head is None else head
        if t:
            raise KeyError(f"checkpoint tensors the model does not use: {sorted(t)[:5]}")
        want = (c.vocab, c.hidden)
        runs = self.wqkv[0] if isinstance(self.wqkv[0], list) else [self.wqkv[0]]  # naive_fp8.py `fuse_rows`
        qkv = (sum(r.shape[0] for r in runs), runs[0].shape[1])
        if tuple(self.embed.shape) != want or qkv != ((c.n_heads + 2 * c.n_kv_heads) * c.head_dim, c.hidden):
            raise KeyError(f"tensor shapes do not fit the config (embed {tuple(self.embed.shape)}, want {want})")

    def nbytes(self) -> int:
        """Bytes of every tensor held (an FP8 matrix's e4m3 weights and fp32 scales)."""
        return held_bytes([self.embed, self.norm, self.lm_head, self.wqkv, self.bqkv, self.q_norm, self.k_norm,
                           self.wo, self.w13, self.w2, self.ln1, self.ln2, self.post_attn, self.post_mlp,
                           [moe.tensors() for moe in self.moe if moe is not None]])


class CudaDecoder:
    def __init__(self, config: ModelConfig, weights: CudaWeights):
        self.config, self.w = config, weights
        c = config
        self.q_size, self.kv_size = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        # RoPE and the KV append ride in the qkv GEMV's epilogue unless something must happen
        # between the projection and RoPE (Qwen2's biases, Qwen3's per-head norms) or the matrix
        # is FP8 (`fp8_gemv` has no such epilogue: one `fused_rope_append` launch follows it)
        self.fold_qkv = not c.qkv_bias and not c.qk_norm and isinstance(weights.wqkv[0], torch.Tensor)
        device = weights.embed.device
        inv_freq = inv_frequencies(c).double()
        # partial RoPE (GLM): the dims past rotary_dim turn by angle 0 (see rope_halves_order)
        inv_freq = torch.cat([inv_freq, inv_freq.new_zeros(c.head_dim // 2 - inv_freq.numel())])
        self.inv_freq = inv_freq.to(device)
        self.post_norms = c.post_norms  # GLM-4: RMSNorm on each sublayer's output before the residual add
        self.dtype = weights.embed.dtype
        self.mtp_weights = weights.mtp_weights  # Engine.mtp_layer builds the MTP layer from them
        self._decode_picks: list[torch.Tensor] = []  # a tiered decode step's routing picks (promotion)
        self._no_blocks: dict[int, torch.Tensor] = {}  # dense attention's empty selection per device

    @property
    def device(self) -> torch.device:
        return self.w.embed.device

    def cos_sin(self, positions: torch.Tensor):
        # float64 angles: at position 1M a float32 product loses the low frequencies' phase
        ang = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        return ang.cos().float(), ang.sin().float()

    def _empty_selection(self) -> torch.Tensor:
        idx = self._no_blocks.get(0)
        if idx is None:
            idx = self._no_blocks[0] = torch.full((self.config.n_kv_heads, 1), -1, dtype=torch.long, device=self.device)
        return idx

    # --- one layer's attention -------------------------------------------------------------------
    def _attend_prefill(self, layer, q, kv, p0: int) -> torch.Tensor:
        s = kv.settings
        t = q.shape[0]
        if s.attention == "dense":
            out, _ = fused_sparse_attention(q, kv.k[layer], kv.v[layer], p0, self._empty_selection(), s.block_size,
                                            0, DENSE_WINDOW)
            return out
        # routing chunks of route_chunk queries, then the last route_tail queries on their own
        # (router.routing_chunks); the keys of the whole chunk are stored before any attends
        head = t - s.route_tail if 0 < s.route_tail < t else t
        out = torch.empty_like(q)
        self._route_and_attend(layer, q[:head], kv, p0, s.route_chunk, out[:head])
        if head < t:
            self._route_and_attend(layer, q[head:], kv, p0 + head, t - head, out[head:])
        return out

    def _route_and_attend(self, layer, q, kv, p0: int, chunk: int, out: torch.Tensor) -> None:
        s = kv.settings
        t = q.shape[0]
        nb = -(-(p0 + t) // s.block_size)
        mean = kv.kmean[layer, :nb] if s.block_score == "mean" else kv.kmin[layer, :nb]
        k_pick = min(s.top_k, nb)
        first = s.sink_tokens // s.block_size
        if 0 < k_pick <= 64 and p0 + min(chunk, t) - s.window >= 0:
            # candidate masks in the block-score kernel, -1 for non-candidate picks in the top-k
            scores = fused_block_scores(q, kv.kmin[layer, :nb], kv.kmax[layer, :nb], mean, s.block_score, chunk=chunk,
                                        chunk_candidates=(first, p0, s.window, s.block_size))
            c = scores.shape[0]
            idx = fused_decode_topk(scores.view(-1, nb), k_pick, drop_noncandidates=True).view(c, -1, k_pick)
        else:  # early in a context, or a top_k past the decode top-k kernel's 64
            scores = fused_block_scores(q, kv.kmin[layer, :nb], kv.kmax[layer, :nb], mean, s.block_score, chunk=chunk)
            c = scores.shape[0]
            last = torch.clamp(torch.arange(1, c + 1, device=q.device) * chunk, max=t) - 1 + p0
            # a block is a candidate if some key of it is outside the window of the chunk's last query
            end = ((last - s.window + 1 + s.block_size - 1) // s.block_size).clamp_min(0)[:, None, None]
            idx = fused_topk_blocks_unsorted(scores, max(s.top_k, 1), first, end)
        if kv.table is not None and kv.disk:
            # tiered with segments on disk: launch by groups of routing chunks whose picks the host
            # pool can hold at once, each after its disk segments are back (no ON_DISK entry is read)
            for c0, c1 in kv.fault_groups(idx, c):
                a, b = c0 * chunk, min(c1 * chunk, t)
                self._launch_routed(layer, q[a:b], kv, p0 + a, chunk, c1 - c0, idx[c0:c1], out[a:b])
            return
        self._launch_routed(layer, q, kv, p0, chunk, c, idx, out)

    def _launch_routed(self, layer, q, kv, p0: int, chunk: int, c: int, idx: torch.Tensor, out: torch.Tensor) -> None:
        s = kv.settings
        host = kv.host(layer)
        staging = None
        if host is not None:  # tiered: the selected host blocks are staged on the GPU first
            staging = kv.staging_buffers(staging_rows(c, self.config.n_kv_heads, idx.shape[-1], s.block_size))
        fused_sparse_attention(q, kv.k[layer], kv.v[layer], p0, idx, s.block_size, s.sink_tokens, s.window,
                               route_chunk=chunk if c > 1 else None, out=out, block_table=kv.table,
                               host=host, staging=staging)

    @staticmethod
    def decode_end(kv, pos: torch.Tensor) -> torch.Tensor:
        """First block whose keys the window of the query at `pos` covers (same for all layers)."""
        s = kv.settings
        return ((pos - s.window + s.block_size) // s.block_size).clamp_min(0)

    def _attend_decode(self, layer, q, kv, pos: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        s = kv.settings
        if s.attention == "dense":
            out, _ = fused_sparse_attention(q, kv.k[layer], kv.v[layer], pos, self._empty_selection(), s.block_size,
                                            0, DENSE_WINDOW)
            return out
        mean = kv.kmean[layer] if s.block_score == "mean" else kv.kmin[layer]
        scores = fused_block_scores(q, kv.kmin[layer], kv.kmax[layer], mean, s.block_score,
                                    candidates=(s.sink_tokens // s.block_size, end))
        # Fewer than top_k candidates only early in a context: the extra picks are then blocks
        # the window covers (or not yet written), whose keys the kernel masks (exact because no
        # block precedes `first` when sinks < block), so the raw top-k needs no clean-up launches.
        idx = fused_decode_topk(scores, min(s.top_k, scores.shape[-1]))
        if kv.table is not None:
            if kv.disk:
                kv.fault_in(idx)  # eager only: a host sync, then the picked disk segments come back
            if kv.usage is not None:
                self._decode_picks.append(idx)  # counted once per step (promotion)
        # tiered: selected blocks in CPU memory are read in place over PCIe (each once per step)
        out, _ = fused_sparse_attention(q, kv.k[layer], kv.v[layer], pos, idx, s.block_size, s.sink_tokens, s.window,
                                        block_table=kv.table, host=kv.host(layer))
        return out

    # --- one layer ---------------------------------------------------------------------------------
    def layer(self, i: int, x: torch.Tensor, kv, cos, sin, *, p0: int | None = None,
              pos: torch.Tensor | None = None, end: torch.Tensor | None = None) -> torch.Tensor:
        t = x.shape[0]
        if pos is not None:  # decode: k and v go to the cache inside the projection's launches
            q = self._decode_q(i, x, kv, cos, sin, pos)
            o = self._attend_decode(i, q, kv, pos, self.decode_end(kv, pos) if end is None else end)
        else:
            q, k, v = self.qkv_rows(i, x, cos, sin)
            s = kv.settings
            fused_store_kv_blocks(k, v, kv.k[i], kv.v[i], kv.kmin[i], kv.kmax[i], p0, s.block_size,
                                  kmean=kv.kmean[i], ksum=kv.ksum[i], ring=kv.ring_arg)
            o = self._attend_prefill(i, q, kv, p0)
        return self.after_attention(i, x, o.reshape(t, self.q_size), decode=pos is not None)

    def _decode_q(self, i: int, x: torch.Tensor, kv, cos, sin, pos: torch.Tensor) -> torch.Tensor:
        """One token's rotated query [1, H, D], its key and value appended to kv at pos (with the
        block descriptors): in the qkv GEMV's epilogue (Llama, Mistral), or in one launch after
        it doing bias + norms + RoPE + the append where something must happen between the
        projection and RoPE (Qwen2's biases, Qwen3's q/k norms, FP8 matrices)."""
        c, w, s = self.config, self.w, kv.settings
        if self.fold_qkv:
            qkv = fused_qkv_gemv(x, w.wqkv[i], w.ln1[i], c.rms_eps, cos, sin, c.n_heads, c.n_kv_heads, pos, kv.k[i],
                                 kv.v[i], kv.kmin[i], kv.kmax[i], kv.kmean[i], kv.ksum[i], s.block_size,
                                 ring=kv.ring_arg)
        else:
            qkv = linear_gemv(x, w.wqkv[i], norm_weight=w.ln1[i], eps=c.rms_eps)
            fused_rope_append(qkv, w.bqkv[i] if w.bqkv else None, w.q_norm[i] if c.qk_norm else None,
                              w.k_norm[i] if c.qk_norm else None, c.rms_eps, cos, sin, c.n_heads, c.n_kv_heads, pos,
                              kv.k[i], kv.v[i], kv.kmin[i], kv.kmax[i], kv.kmean[i], kv.ksum[i], s.block_size,
                              ring=kv.ring_arg)
        return qkv[:, : self.q_size].view(x.shape[0], c.n_heads, c.head_dim)

    def qkv_rows(self, i: int, x: torch.Tensor, cos, sin):
        """Rotated q [T, H, D], k and v [T, Hkv, D] of T rows (prefill, or a batch of sequences'
        tokens: engine/gpu/paged.py), by GEMMs; nothing is stored."""
        c, w = self.config, self.w
        t, hd = x.shape[0], c.head_dim
        qkv = linear_mm(fused_rms_norm(x, w.ln1[i], c.rms_eps), w.wqkv[i])
        if w.bqkv:
            qkv += w.bqkv[i]
        if c.qk_norm:
            q = fused_rms_norm(qkv[:, : self.q_size].reshape(t, c.n_heads, hd), w.q_norm[i], c.rms_eps)
            k = fused_rms_norm(qkv[:, self.q_size: self.q_size + self.kv_size].reshape(t, c.n_kv_heads, hd),
                               w.k_norm[i], c.rms_eps)
            fused_rope(q, cos, sin, out=q)
            fused_rope(k, cos, sin, out=k)
        else:  # q and k heads are adjacent: one launch rotates both
            qk = qkv[:, : self.q_size + self.kv_size].view(t, c.n_heads + c.n_kv_heads, hd)
            fused_rope(qk, cos, sin, out=qk)
            q = qkv[:, : self.q_size].view(t, c.n_heads, hd)
            k = qkv[:, self.q_size: self.q_size + self.kv_size].view(t, c.n_kv_heads, hd)
        return q, k, qkv[:, self.q_size + self.kv_size:].view(t, c.n_kv_heads, hd)

    def after_attention(self, i: int, x: torch.Tensor, o: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """x + o projection, then + MLP: the rest of layer i given its attention output o [T, H * D]."""
        c, w = self.config, self.w
        if self.post_norms or w.moe[i] is not None:
            return self._glm_sublayers(i, x, o, decode)
        if decode:
            x = linear_gemv(o, w.wo[i], residual=x)
            a = linear_gemv(x, w.w13[i], norm_weight=w.ln2[i], eps=c.rms_eps, swiglu=True)
            return linear_gemv(a, w.w2[i], residual=x)
        # in place: out-of-place addmm first copies the residual stream into its result (a
        # 32 MiB device copy per projection in a 4096-token prefill chunk); x is this layer's own
        x = linear_add_mm(x, o, w.wo[i])
        gu = linear_mm(fused_rms_norm(x, w.ln2[i], c.rms_eps), w.w13[i])
        a = fused_swiglu(gu[:, : c.intermediate], gu[:, c.intermediate:])
        return linear_add_mm(x, a, w.w2[i])

    def _glm_sublayers(self, i: int, x: torch.Tensor, o: torch.Tensor, decode: bool) -> torch.Tensor:
        """What follows attention on GLM: o projection, GLM-4's norm of each sublayer's output
        before its residual add, and the dense SwiGLU MLP or GLM-4.5's MoE (engine/gpu/moe.py)."""
        c, w = self.config, self.w
        post = self.post_norms
        if decode:
            x = x + fused_rms_norm(linear_gemv(o, w.wo[i]), w.post_attn[i], c.rms_eps) if post else \
                linear_gemv(o, w.wo[i], residual=x)
        else:
            x = x.add_(fused_rms_norm(linear_mm(o, w.wo[i]), w.post_attn[i], c.rms_eps)) if post else \
                linear_add_mm(x, o, w.wo[i])
        if w.moe[i] is not None:  # x + MoE(norm(x)): no GLM checkpoint has post-norms with experts
            return w.moe[i](x, fused_rms_norm(x, w.ln2[i], c.rms_eps), decode)
        if decode:
            a = linear_gemv(x, w.w13[i], norm_weight=w.ln2[i], eps=c.rms_eps, swiglu=True)
            return x + fused_rms_norm(linear_gemv(a, w.w2[i]), w.post_mlp[i], c.rms_eps) if post else \
                linear_gemv(a, w.w2[i], residual=x)
        gu = linear_mm(fused_rms_norm(x, w.ln2[i], c.rms_eps), w.w13[i])
        n = gu.shape[1] // 2
        a = fused_swiglu(gu[:, :n], gu[:, n:])
        return x.add_(fused_rms_norm(linear_mm(a, w.w2[i]), w.post_mlp[i], c.rms_eps)) if post else \
            linear_add_mm(x, a, w.w2[i])

    # --- whole passes --------------------------------------------------------------------------------
    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return linear_mm(fused_rms_norm(x, self.w.norm, self.config.rms_eps), self.w.lm_head)

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, kv, p0: int = 0, *, chunk: int | None = None,
                all_logits: bool = False, on_chunk=None, return_hidden: bool = False):
        """Run tokens [T] at positions p0.. through the model, filling kv. Returns fp32 logits of
        the last token [1, V] (of every token [T, V] with all_logits), and with return_hidden the
        normed final hidden states of every token [T, H] too (what an MTP layer reads).
        on_chunk(done, total) after each chunk."""
        s = kv.settings
        t_all = tokens.shape[0]
        step = chunk or s.chunk_size
        outs, hiddens = [], []
        for a in range(0, t_all, step):
            b = min(t_all, a + step)
            if kv.table is not None:  # tiered KV: room for this chunk, and start the next one's moves
                kv.prepare(p0 + a, p0 + b)
                assert kv.evicted <= max(p0 + a - s.window, kv.pin), "window moved off the GPU: ring too small"
                kv.prefetch(p0 + b + step)
            x = self.w.embed[tokens[a:b]]
            cos, sin = self.cos_sin(torch.arange(p0 + a, p0 + b, device=tokens.device))
            for i in range(self.config.n_layers):
                x = self.layer(i, x, kv, cos, sin, p0=p0 + a)
            if return_hidden:
                hiddens.append(fused_rms_norm(x, self.w.norm, self.config.rms_eps))
            if all_logits:
                outs.append(self._logits(x).float())
            elif b == t_all:
                outs.append(self._logits(x[-1:]).float())
            if on_chunk is not None:
                on_chunk(b, t_all)
        logits = outs[0] if len(outs) == 1 else torch.cat(outs)
        return (logits, torch.cat(hiddens)) if return_hidden else logits

    def decode_step(self, tok: torch.Tensor, pos: torch.Tensor, kv, logits: torch.Tensor | None = None) -> None:
        """tok [1] long, pos [1] int32 device buffers: overwrites tok with the greedy next token,
        writes the step's logits into `logits` [1, V] when given, and advances pos. With a tiered
        cache the caller maps the positions first (`kv.prepare`; GraphedDecode does)."""
        x = self.w.embed[tok]
        cos, sin = self.cos_sin(pos)
        end = self.decode_end(kv, pos)  # once per step, not per layer: fewer graph nodes
        self._decode_picks = []
        for i in range(self.config.n_layers):
            x = self.layer(i, x, kv, cos, sin, pos=pos, end=end)
        if self._decode_picks:  # tiered with promotion: one count of all layers' picks, on the device
            kv.record_use(torch.cat([p.reshape(-1) for p in self._decode_picks]))
            self._decode_picks = []
        out = linear_gemv(x, self.w.lm_head, norm_weight=self.w.norm, eps=self.config.rms_eps)
        if logits is not None:
            logits.copy_(out)
        fused_argmax(out, out=tok)
        pos.add_(1)


class GraphedDecode:
    """One decode step of `decoder` over `kv`, captured as a CUDA graph over static token /
    position / logits buffers. With a tiered cache: while any segment is on disk, neither
    capture nor replay (the graph has no fault check, so it could read a disk entry): `step`
    then runs the step eagerly. A decode loop with promotion calls `kv.rebalance()` between
    replays. Off CUDA (the Triton interpreter in tests) every step is eager."""

    def __init__(self, decoder: CudaDecoder, kv, start_pos: int, *, warmup: int = 2, graph: bool = True):
        dev = decoder.device
        # the state owns its graph (state.decode_graph): a weak reference back keeps that a tree,
        # so a dropped state frees its GPU memory at once instead of at the next cycle collection
        self.decoder, self.kv = decoder, weakref.proxy(kv)
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.tensor([start_pos], dtype=torch.int32, device=dev)
        self.logits = torch.empty(1, decoder.config.vocab, dtype=decoder.dtype, device=dev)
        self.start = start_pos
        self.graph = None
        if kv.table is not None:  # tiered KV: the positions the replays append to are mapped on the GPU
            kv.prepare(start_pos, min(start_pos + 512, kv.capacity))
            assert kv.evicted <= max(start_pos - kv.settings.window, kv.pin), "window moved off the GPU: ring too small"
        if not graph or dev.type != "cuda" or (kv.table is not None and kv.disk):
            return
        with torch.inference_mode():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(warmup):  # compiles kernels, sets up cuBLAS handles
                    self._eager()
            torch.cuda.current_stream().wait_stream(s)
            self.reset(start_pos)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._eager()
        self.reset(start_pos)

    def _eager(self) -> None:
        self.decoder.decode_step(self.tok, self.pos, self.kv, self.logits)

    def reset(self, pos: int, tok: int = 1) -> None:
        self.pos.fill_(pos)
        self.tok.fill_(tok)

    @torch.inference_mode()
    def step(self) -> None:
        """One token: the graph when it can run, else the same step eagerly."""
        if self.graph is not None and not (self.kv.table is not None and self.kv.disk):
            self.graph.replay()
        else:
            self._eager()
