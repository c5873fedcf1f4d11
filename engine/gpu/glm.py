"""GLM-4.7-Flash (`glm4_moe_lite`: MLA + MoE) and GLM-5 (`glm_moe_dsa`: MLA + DSA + MoE) on CUDA.

`Engine.load(..., device="cuda")` builds a `GlmCudaDecoder` for these architectures (the
Llama family gets engine/gpu/model.py's `CudaDecoder`); the PyTorch model (engine/models/glm.py)
stays the CPU path and, with HF transformers, the reference this one is tested against.

The state (`GlmCudaState`) caches per token and layer only MLA's latent (the normalised
kv_lora_rank vector and the roped shared key, R + P numbers) and, for GLM-5's "full" indexer
layers, the indexer key. Per layer:

- one projection of the normed hidden state for everything that reads it (q_a, the latent,
  and the indexer's key and head weights), one for everything that reads the q residual
  (q_b and the indexer's queries), each a fused GEMV at decode (RMSNorm in its prologue);
- attention on the latent with W_UK folded into the query (q_nope W_UK) and W_UV into the
  output: kernels/mla_decode (dense decode: every cached token; DSA decode and prefill: each query's
  top-k), dense prefill by SDPA (flash) over keys and values expanded from the latents for
  that chunk (absorbed dense prefill would do ~2x the FLOPs);
- the engine's sparse settings on a model without an indexer (GLM-4.7-Flash under
  `Engine.sparse_settings()`, what `--read-all` runs): routed attention
  (kernels/mla_sparse triton_mla_routed.py) — per-block latent descriptors, block scores of the
  absorbed queries per routing chunk, top-k blocks, attention over sinks + blocks + window for
  prefill calls, and the same three sets at decode (kernels/mla_decode `routed=`). A long
  prefill call attends on keys and values expanded per head from the latent rows it reads (one
  gather and one GEMM; half the absorbed form's multiply-adds), a short one on the latent
  (`_expands` decides). Linear in the context: dense MLA prefill is quadratic (28 s of the
  37 s at 128K on the H200). Dense settings keep dense MLA; GLM-5 keeps its indexer;
- DSA: the indexer scores every cached token (kernels/dsa_index in prefill; a matmul and
  torch.topk over the whole capacity at decode, static shapes), "shared" layers reuse the
  indices of the "full" layer before them (IndexShare);
- MoE (engine/gpu/moe.py `MoeLayer`, GLM-4.5's on CudaDecoder too): the model's own gate
  (engine/models/moe.py `route`: sigmoid, correction bias, group-limited top-k, routed
  scaling); decode runs the chosen experts by id with the shared expert stacked as one more
  (kernels/moe), prefill sorts the chunk's (token, expert) pairs by expert and runs one grouped
  GEMM per projection (kernels/moe/grouped.py: no host sync).

FP8 checkpoints (config.fp8_block: e4m3 + `weight_scale_inv` block scales, as the official
GLM-5 FP8 release) keep every quantised matrix 1-byte on the GPU as an `Fp8Weight`
(kernels/linear/naive_fp8.py: the scales expanded along rows only, 3 % more) and run the FP8
kernels: `fp8_gemv` at decode, `fp8_matmul` in prefill (an FP8 tensor-core dot with the
activations quantised per token and block for bf16, exact for fp32; kernels/linear/triton_fp8.py
`linear_gemv` / `linear_mm` pick the kernel per weight), and in engine/gpu/moe.py the expert
GEMVs of kernels/moe/triton_moe_fp8.py and `fp8_grouped_matmul` for MoE prefill. Fused projections
whose parts mix FP8 and plain matrices (DeepSeek-V3.2's indexer weights_proj is bf16) keep
them as runs, one product each. Only kv_b_proj is dequantised at load (to the model dtype): it
is split per head into the absorbed W_UK / W_UV that batched products read (~1 % of a layer).

Decode has no host synchronisation: `capture_decode` captures it as a CUDA graph
(engine/gpu/model.py `GraphedDecode`), the position in a device tensor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ...kernels.attention.triton_topk import fused_decode_topk
from ...kernels.dsa_index import fused_index_scores, fused_index_topk
from ...kernels.linear.naive_fp8 import fuse_rows, held_bytes, pair_scales, plain
from ...kernels.linear.triton_fp8 import linear_add_mm, linear_gemv, linear_mm
from ...kernels.mla_decode import fused_mla_decode
from ...kernels.mla_sparse import (
    fused_latent_append,
    fused_mla_block_scores,
    fused_mla_routed_attention,
    fused_mla_routed_attention_expanded,
    store_latent_descriptors,
)
from ...kernels.mla_sparse.triton_mla_routed import expanded_rows
from ...kernels.norm.triton_rms_norm import fused_rms_norm
from ...kernels.rope.triton_rope import fused_rope
from ...kernels.sampling.triton_argmax import fused_argmax
from ..config import ModelConfig
from ..kv_cache import DTYPES
from ..models.mla import LATENT_NORM_EPS
from ..models.mtp import take_mtp_weights
from ..rope import inv_frequencies
from ..settings import EngineSettings
from .moe import MoeLayer, pop_experts
from .state import KVStateBase

GLM_CUDA_ARCHS = ("glm4_moe_lite", "glm_moe_dsa")
INDEX_NORM_EPS = 1e-6  # the indexer's key LayerNorm (engine/models/mla.py)
EXPAND_ROWS = 65536  # latents expanded to per-head keys/values per product in dense prefill
# Routed prefill picks, per call, the absorbed kernel or expanded keys and values
# (`GlmCudaDecoder._expands`) by counting multiply-adds, the attention kernels' at this many
# times a GEMM's: on the H200 they run at ~150-190 TFLOP/s, cuBLAS's GEMMs at ~600
# (bench/results/gpu_glm.md).
ATTN_PER_GEMM = 3


class GlmLayer:
    """One layer's tensors, fused the way the kernels read them."""

    def __init__(self, config: ModelConfig, i: int, take, experts: dict, dtype: torch.dtype):
        c, m = config, config.mla
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        self.ln1, self.ln2 = take(p + "input_layernorm.weight"), take(p + "post_attention_layernorm.weight")
        if m.q_lora_rank is None:
            raise NotImplementedError("the CUDA GLM path needs q_lora_rank (every GLM MLA checkpoint has one)")
        self.full = c.dsa is not None and c.dsa.indexer_types[i] == "full"
        # what reads the normed hidden state: [q_a | latent + rope key | indexer key | indexer weights]
        parts = [take(a + "q_a_proj.weight"), take(a + "kv_a_proj_with_mqa.weight")]
        biases = [take(a + "q_a_proj.bias", None), take(a + "kv_a_proj_with_mqa.bias", None)]
        if self.full:
            parts += [take(a + "indexer.wk.weight"), take(a + "indexer.weights_proj.weight")]
            self.ik_norm = (take(a + "indexer.k_norm.weight"), take(a + "indexer.k_norm.bias"))
        rows = sum(p.shape[0] for p in parts)
        self.wa = fuse_rows(parts, dtype)
        del parts
        self.ba = None
        if biases[0] is not None:
            zeros = biases[0].new_zeros(rows - sum(b.shape[0] for b in biases))
            self.ba = torch.cat([*biases, zeros])
        self.q_a_norm = take(a + "q_a_layernorm.weight")
        self.kv_a_norm = take(a + "kv_a_layernorm.weight")
        # what reads the q residual: [q_b | indexer queries]
        wb = [take(a + "q_b_proj.weight")] + ([take(a + "indexer.wq_b.weight")] if self.full else [])
        self.wb = fuse_rows(wb, dtype)
        del wb
        h, nope, vd, r = c.n_heads, m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank
        w = plain(take(a + "kv_b_proj.weight"), dtype).view(h, nope + vd, r).contiguous()
        # [H, nope + v, R]: routed prefill (models without an indexer) expands the latents it reads
        self.w_kv = w if c.dsa is None else None
        self.w_uk = w[:, :nope].contiguous()  # [H, nope, R]: q_lat = q_nope W_UK
        self.w_uv = w[:, nope:].contiguous()  # [H, v, R]: dense prefill expands values with it
        self.w_uv_t = w[:, nope:].transpose(1, 2).contiguous()  # [H, R, v]: o = o_lat W_UV^T
        self.wo, self.bo = take(a + "o_proj.weight"), take(a + "o_proj.bias", None)
        mp = p + "mlp."
        self.moe = None
        if c.moe is not None and c.moe.layer_types[i] == "sparse":  # engine/gpu/moe.py (FP8 experts too)
            self.moe = MoeLayer(c, mp, take, experts.pop(i, None), dtype)
            return
        self.w13 = fuse_rows([take(mp + "gate_proj.weight"), take(mp + "up_proj.weight")], dtype, runs=False)
        self.w2 = take(mp + "down_proj.weight")


class GlmCudaState(KVStateBase):
    """The KV state of `GlmCudaDecoder`: latents [L, capacity, R + P] (rope part rotated at its
    true position) and, with DSA, the indexer keys [full layers, capacity, Di] (rotated). A model
    without an indexer also keeps, per block of `block_size` latents, their min / max / mean
    [L, capacity / block_size, R + P] in every attention mode (so a segment is the same whichever
    state wrote it); `routed` (sparse settings) states route on them.

    Prefix-cache segments (`KVStateBase.export_segment` / `adopt`, engine/gpu/state.py): a
    segment file holds the segment's latents as "k", its indexer keys as "v" (empty without DSA)
    and its blocks' descriptors, each as views of this state's rows."""

    def __init__(self, config: ModelConfig, settings: EngineSettings, capacity: int, device: torch.device):
        super().__init__(config, settings)
        self.device = torch.device(device)
        self.dtype = DTYPES[settings.kv_dtype]
        self.dsa = config.dsa is not None  # GLM-5 attends through its indexer
        self.blocks = not self.dsa
        self.routed = self.blocks and settings.attention == "sparse"
        self.slots = {}
        if self.dsa:
            self.slots = {i: j for j, i in enumerate(i for i, k in enumerate(config.dsa.indexer_types) if k == "full")}
        self.layout = "glm-latent"  # what a prefix-cache segment of this state holds
        self._alloc(max(capacity, 1))

    def _alloc(self, capacity: int) -> None:
        c, m = self.config, self.config.mla
        step = math.lcm(64, self.settings.block_size)  # whole blocks
        cap = -(-capacity // step) * step
        width = m.kv_lora_rank + m.qk_rope_head_dim
        self.kv = torch.zeros(c.n_layers, cap, width, dtype=self.dtype, device=self.device)
        nb = cap // self.settings.block_size if self.blocks else 0
        self.kmin, self.kmax, self.kmean = (torch.zeros(c.n_layers, nb, width, dtype=self.dtype, device=self.device)
                                            for _ in range(3))
        self.ik = torch.zeros(len(self.slots), cap, c.dsa.head_dim if self.dsa else 1, dtype=self.dtype,
                              device=self.device)  # no rows without DSA
        self.rows = torch.arange(cap, dtype=torch.int32, device=self.device)

    @property
    def k(self) -> torch.Tensor:  # KVStateBase reads the device from it
        return self.kv

    @property
    def capacity(self) -> int:
        return self.kv.shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.ik, self.kmin, self.kmax, self.kmean))

    def reserve(self, n: int) -> None:
        """Room for n tokens (grows by doubling, keeping what is stored; a captured decode graph
        points at the old buffers, so it is dropped)."""
        if n <= self.capacity:
            return
        old, m = (self.kv, self.ik, self.kmin, self.kmax, self.kmean), self.num_tokens
        self._alloc(max(n, 2 * self.capacity))
        self.kv[:, :m], self.ik[:, :m] = old[0][:, :m], old[1][:, :m]
        nb = -(-m // self.settings.block_size) if self.blocks else 0
        for new, prev in zip((self.kmin, self.kmax, self.kmean), old[2:]):
            new[:, :nb] = prev[:, :nb]
        self.decode_graph = None

    def _segment_views(self, a: int) -> dict[str, torch.Tensor]:
        size, b = self.settings.segment_size, self.settings.block_size
        nb0, nb1 = (a // b, (a + size) // b) if self.blocks else (0, 0)
        return {"k": self.kv[:, a:a + size], "v": self.ik[:, a:a + size], "kmin": self.kmin[:, nb0:nb1],
                "kmax": self.kmax[:, nb0:nb1], "kmean": self.kmean[:, nb0:nb1]}

    def adopt(self, segments, reader=None) -> int:
        if segments:  # room first: growing later would leave the views being filled behind
            self.reserve(segments[-1].start + segments[-1].size)
        return super().adopt(segments, reader)


class GlmCudaDecoder:
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor]):
        if config.mla is None or config.arch not in GLM_CUDA_ARCHS:
            raise ValueError(f"GlmCudaDecoder runs {GLM_CUDA_ARCHS}, not {config.arch}")
        self.config = c = config
        t = {name.removeprefix("model."): x for name, x in tensors.items()}
        tensors.clear()
        # the MTP layer, kept aside for speculative decoding (engine/models/mtp.py)
        self.mtp_weights = take_mtp_weights(t, c, t["embed_tokens.weight"].dtype)
        if c.fp8_block is not None:  # each e4m3 matrix with its block scales, kept 1-byte
            pair_scales(t, c.fp8_block)
        experts = pop_experts(t)

        def take(name, *default):
            return t.pop(name, *default)

        self.embed = take("embed_tokens.weight")
        self.layers = [GlmLayer(c, i, take, experts, self.embed.dtype) for i in range(c.n_layers)]
        self.norm = take("norm.weight")
        head = t.pop("lm_head.weight", None)
        self.lm_head = self.embed if c.tie_embeddings or head is None else head
        if t:
            raise KeyError(f"checkpoint tensors the model does not use: {sorted(t)[:5]}")
        if tuple(self.embed.shape) != (c.vocab, c.hidden):
            raise KeyError(f"embed_tokens has shape {tuple(self.embed.shape)}, the config implies {(c.vocab, c.hidden)}")
        m = c.mla
        self.r, self.p, self.nope, self.vd = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        self.qr = m.q_lora_rank
        self.scale = (self.nope + self.p) ** -0.5
        self.inv_freq = inv_frequencies(c).double().to(self.device)
        self.dtype = self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def nbytes(self) -> int:
        return held_bytes([list(vars(obj).values()) for obj in
                           [self, *self.layers, *(ly.moe for ly in self.layers if ly.moe is not None)]])

    def new_state(self, capacity: int = 1024, settings: EngineSettings | None = None):
        """The state Engine.new_state gives on CUDA. The model attends as it was trained: GLM-5
        through its indexer's top-k."""
        if settings is None:
            kv = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(self.dtype, "float32")
            settings = EngineSettings(kv_dtype=kv, chunk_size=4096)
        return GlmCudaState(self.config, settings, capacity, self.device)

    def capture_decode(self, state):
        from .model import GraphedDecode

        return GraphedDecode(self, state, state.num_tokens)

    # --- pieces -------------------------------------------------------------------------------
    def rotation(self, positions: torch.Tensor):
        """What `rope` turns by at these positions: (cos, sin) [T, rotary_dim / 2] fp32. Once per
        chunk or decode step."""
        # float64 angles: at position 1M a float32 product loses the low frequencies' phase
        ang = positions.to(torch.float64)[:, None] * self.inv_freq
        return ang.cos().float(), ang.sin().float()

    def rope(self, x: torch.Tensor, rot, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H, D] with its first rotary_dim dims turned (interleaved pairs or halves, as the
        config says), one launch, into `out` when given (any [T, H, D] view: the cache row, the
        absorbed query's slice)."""
        cos, sin = rot
        rd = 2 * cos.shape[-1]
        if out is None:
            out = torch.empty_like(x)
        fused_rope(x[..., :rd], cos, sin, out=out[..., :rd], interleaved=self.config.rope_interleaved)
        if x.shape[-1] > rd:
            out[..., rd:] = x[..., rd:]
        return out

    def _project(self, ly: GlmLayer, x: torch.Tensor, decode: bool):
        """-> (a = [q_a | latent | indexer key | indexer weights] of the normed x, b = [q | indexer q])."""
        c = self.config
        if decode:
            a = linear_gemv(x, ly.wa, norm_weight=ly.ln1, eps=c.rms_eps)
            if ly.ba is not None:
                a = a + ly.ba
            b = linear_gemv(a[:, : self.qr], ly.wb, norm_weight=ly.q_a_norm, eps=LATENT_NORM_EPS)
        else:
            a = linear_mm(fused_rms_norm(x, ly.ln1, c.rms_eps), ly.wa)
            if ly.ba is not None:
                a += ly.ba
            b = linear_mm(fused_rms_norm(a[:, : self.qr], ly.q_a_norm, LATENT_NORM_EPS), ly.wb)
        return a, b

    def _latent(self, ly: GlmLayer, a: torch.Tensor, rot, out: torch.Tensor | None = None) -> torch.Tensor:
        """The cached row [T, R + P]: normed latent | roped shared key (written into `out`, a
        [T, R + P] row range of the cache, when given: no concatenated copy)."""
        qr, r = self.qr, self.r
        if out is None:
            out = a.new_empty(a.shape[0], r + self.p)
        fused_rms_norm(a[:, qr: qr + r], ly.kv_a_norm, LATENT_NORM_EPS, out=out[:, :r])
        self.rope(a[:, None, qr + r: qr + r + self.p], rot, out=out[:, None, r:])
        return out

    def _queries(self, ly: GlmLayer, b: torch.Tensor, rot):
        """-> (q_nope [T, H, nope], q_rot roped [T, H, P], absorbed query [T, H, R + P]); the
        batched matmul and the rope write straight into their slices of the absorbed query
        (q_rot is a view of it)."""
        t, h = b.shape[0], self.config.n_heads
        q = b[:, : h * (self.nope + self.p)].view(t, h, self.nope + self.p)
        q_nope = q[..., : self.nope]
        q_abs = b.new_empty(t, h, self.r + self.p)
        torch.bmm(q_nope.transpose(0, 1), ly.w_uk, out=q_abs.transpose(0, 1)[..., : self.r])
        q_rot = self.rope(q[..., self.nope:], rot, out=q_abs[..., self.r:])
        return q_nope, q_rot, q_abs

    def _index_inputs(self, ly: GlmLayer, a: torch.Tensor, b: torch.Tensor, rot):
        """The indexer's roped queries [T, Hi, Di], roped keys [T, Di] and head weights [T, Hi]."""
        d = self.config.dsa
        t = a.shape[0]
        off = self.qr + self.r + self.p
        k = F.layer_norm(a[:, off: off + d.head_dim].float(), (d.head_dim,), ly.ik_norm[0].float(),
                         ly.ik_norm[1].float(), INDEX_NORM_EPS).to(a.dtype)
        w = a[:, off + d.head_dim: off + d.head_dim + d.n_heads].float() * d.n_heads ** -0.5
        q = b[:, self.config.n_heads * (self.nope + self.p):].view(t, d.n_heads, d.head_dim)
        return self.rope(q, rot), self.rope(k[:, None], rot)[:, 0], w

    def _out(self, ly: GlmLayer, o_lat: torch.Tensor) -> torch.Tensor:
        """o_lat [T, H, R] -> [T, H * v] (W_UV applied; the batched matmul writes token-major
        rows itself, no transposed copy)."""
        t, h = o_lat.shape[:2]
        o = o_lat.new_empty(t, h, self.vd)
        torch.bmm(o_lat.transpose(0, 1), ly.w_uv_t, out=o.transpose(0, 1))
        return o.view(t, h * self.vd)

    def _dense_prefill_attention(self, ly, q_nope, q_rot, kv, layer: int, end: int) -> torch.Tensor:
        """Causal attention of the chunk's queries over tokens 0..end-1, keys and values expanded
        from the latents (flash SDPA; the chunk's queries are the last rows)."""
        c = self.config
        t, h = q_nope.shape[0], c.n_heads
        lat = kv.kv[layer, :end]
        # expanded in row blocks straight into k and v: at 1M tokens and 64 heads each is 32 GiB,
        # and one [S, H (nope + v)] product beside them would not fit
        k = torch.empty(end, h, self.nope + self.p, dtype=lat.dtype, device=lat.device)
        v = torch.empty(end, h, self.vd, dtype=lat.dtype, device=lat.device)
        w_uk, w_uv = ly.w_uk.view(h * self.nope, self.r), ly.w_uv.view(h * self.vd, self.r)
        for s0 in range(0, end, EXPAND_ROWS):
            s1 = min(end, s0 + EXPAND_ROWS)
            c_blk = lat[s0:s1, : self.r]
            k[s0:s1, :, : self.nope] = (c_blk @ w_uk.t()).view(s1 - s0, h, self.nope)
            torch.mm(c_blk, w_uv.t(), out=v[s0:s1].view(s1 - s0, h * self.vd))
        k[:, :, self.nope:] = lat[:, None, self.r:]
        q = torch.cat((q_nope, q_rot), dim=-1)
        mask = causal_lower_right(t, end) if t > 1 else None
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], attn_mask=mask, scale=self.scale)
        return o[0].transpose(0, 1).reshape(t, h * self.vd)

    def _routed_prefill_attention(self, ly: GlmLayer, q_nope, q_rot, q_abs, kv: GlmCudaState, layer: int,
                                  p0: int) -> torch.Tensor:
        """Sparse attention of the chunk's queries (q_nope, roped q_rot and the absorbed q_abs
        [T, H, R + P]) over the latent: routing chunks of route_chunk queries, the last
        route_tail queries on their own (engine/router.py `routing_chunks`, as the Llama path)
        -> [T, H * v]."""
        s = kv.settings
        t, h = q_abs.shape[:2]
        head = t - s.route_tail if 0 < s.route_tail < t else t
        out = q_abs.new_empty(t, h, self.vd)
        for a, b, chunk in ((0, head, s.route_chunk), (head, t, t - head)):
            if b > a:
                self._route_and_attend(ly, q_nope[a:b], q_rot[a:b], q_abs[a:b], kv, layer, p0 + a, chunk, out[a:b])
        return out.view(t, h * self.vd)

    def _route_and_attend(self, ly: GlmLayer, q_nope, q_rot, q, kv: GlmCudaState, layer: int, p0: int, chunk: int,
                          out: torch.Tensor) -> None:
        """Route the queries' chunks to their top-k blocks (scored with the absorbed queries) and
        attend over sinks + blocks + window, writing [T, H, v] into out."""
        s = kv.settings
        t, b = q.shape[0], s.block_size
        nb = -(-(p0 + t) // b)
        first = s.sink_tokens // b
        k = min(s.top_k, nb)
        if k and (p0 + t - 1 - s.window + b) // b > first:  # some query of the call has candidates
            scores = fused_mla_block_scores(q, kv.kmin[layer, :nb], kv.kmax[layer, :nb], kv.kmean[layer, :nb],
                                            s.block_score, chunk, p0, first, s.window, b)
            # picks past a chunk's candidates come back -1 (or, past 64, are blocks whose keys the
            # attention masks anyway: inside the window or the sinks)
            blocks = fused_decode_topk(scores, k, drop_noncandidates=True) if k <= 64 else \
                scores.topk(k, dim=-1, sorted=False).indices
        else:
            blocks = torch.empty(-(-t // chunk), 0, dtype=torch.long, device=q.device)
        if self._expands(t, p0, blocks.numel(), s):
            fused_mla_routed_attention_expanded(q_nope, q_rot, kv.kv[layer], ly.w_kv, p0, blocks, chunk, b,
                                                s.sink_tokens, s.window, self.scale, out=out)
        else:
            o_lat = fused_mla_routed_attention(q, kv.kv[layer], p0, blocks, chunk, b, s.sink_tokens, s.window, self.r,
                                               self.scale)
            torch.bmm(o_lat.transpose(0, 1), ly.w_uv_t, out=out.transpose(0, 1))

    def _expands(self, t: int, p0: int, n_blocks: int, s: EngineSettings) -> bool:
        """Whether t queries at p0.. (n_blocks routed blocks in all) attend on expanded keys and
        values: the expansion (one GEMM over the rows they read) costs less than the absorbed
        form's extra (R + P) + R - ((N + P) + V) multiply-adds per query, head and key. True for
        a long prompt's chunks, False for a question after a cached document."""
        h, seen = self.config.n_heads, min(s.budget, p0 + t)
        per_key = ATTN_PER_GEMM * t * h * seen
        absorbed = per_key * (2 * self.r + self.p)
        rows = expanded_rows(t, p0, n_blocks, s.block_size, s.sink_tokens, s.window)
        return per_key * (self.nope + self.p + self.vd) + rows * self.r * h * (self.nope + self.vd) < absorbed

    def _routed_decode_attention(self, q: torch.Tensor, kv: GlmCudaState, layer: int, length: torch.Tensor,
                                 end: torch.Tensor) -> torch.Tensor:
        """One step's sparse attention (no host sync): block scores over the whole capacity
        (candidates before `end`, on the device), top-k, split-K attention over sinks + blocks +
        window. Non-candidate picks (fewer candidates than top_k early on) hold only keys the
        attention masks."""
        s = kv.settings
        k = min(s.top_k, kv.kmean.shape[1])
        if k:
            scores = fused_mla_block_scores(q, kv.kmin[layer], kv.kmax[layer], kv.kmean[layer], s.block_score, 1, 0,
                                            s.sink_tokens // s.block_size, s.window, s.block_size, end=end)
            blocks = fused_decode_topk(scores, k)
        else:
            blocks = torch.empty(1, 0, dtype=torch.long, device=q.device)
        return fused_mla_decode(q, kv.kv[layer], length, self.r, self.scale,
                                routed=(blocks, s.sink_tokens, s.window, s.block_size))

    def _mlp(self, ly: GlmLayer, x: torch.Tensor, decode: bool) -> torch.Tensor:
        """x + MLP(norm(x)) (dense SwiGLU or the MoE)."""
        c = self.config
        if ly.moe is None:
            if decode:
                act = linear_gemv(x, ly.w13, norm_weight=ly.ln2, eps=c.rms_eps, swiglu=True)
                return linear_gemv(act, ly.w2, residual=x)
            gu = linear_mm(fused_rms_norm(x, ly.ln2, c.rms_eps), ly.w13)
            n = gu.shape[1] // 2
            return linear_add_mm(x, F.silu(gu[:, :n]) * gu[:, n:], ly.w2)
        return ly.moe(x, fused_rms_norm(x, ly.ln2, c.rms_eps), decode)

    # --- prefill --------------------------------------------------------------------------------
    def _prefill_layer(self, i: int, x: torch.Tensor, kv: GlmCudaState, p0: int, rot, indices):
        ly = self.layers[i]
        t = x.shape[0]
        end = p0 + t
        a, b = self._project(ly, x, decode=False)
        self._latent(ly, a, rot, out=kv.kv[i, p0:end])
        if kv.blocks:  # before routing: the chunk's own earlier blocks are candidates of its later queries
            store_latent_descriptors(kv.kv[i], kv.kmin[i], kv.kmax[i], kv.kmean[i], p0, end, kv.settings.block_size)
        q_nope, q_rot, q_abs = self._queries(ly, b, rot)
        if kv.dsa and ly.full:
            qi, ki, w = self._index_inputs(ly, a, b, rot)
            slot = kv.ik[kv.slots[i]]
            slot[p0:end] = ki
            topk = self.config.dsa.topk
            indices = None if end <= topk else fused_index_topk(
                fused_index_scores(qi, slot[:end], w, p0, self.config.dsa.head_dim ** -0.5), topk)
        if kv.dsa and indices is not None:
            o = self._out(ly, fused_mla_decode(q_abs, kv.kv[i, :end], None, self.r, self.scale, indices))
        elif kv.routed:
            o = self._routed_prefill_attention(ly, q_nope, q_rot, q_abs, kv, i, p0)
        else:
            o = self._dense_prefill_attention(ly, q_nope, q_rot, kv, i, end)
        x = linear_add_mm(x, o, ly.wo)
        if ly.bo is not None:
            x += ly.bo
        return self._mlp(ly, x, decode=False), indices

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return linear_mm(fused_rms_norm(x, self.norm, self.config.rms_eps), self.lm_head).float()

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, kv: GlmCudaState, p0: int = 0, *, chunk: int | None = None,
                all_logits: bool = False, on_chunk=None, return_hidden: bool = False):
        """Run tokens [T] at positions p0.. through the model, filling kv (the caller commits).
        fp32 logits of the last token [1, V] (of every token [T, V] with all_logits), and with
        return_hidden the normed final hidden states of every token [T, H] too (what an MTP
        layer reads)."""
        n = tokens.shape[0]
        step = chunk or kv.settings.chunk_size
        kv.reserve(p0 + n)
        outs, hiddens = [], []
        for a in range(0, n, step):
            b = min(n, a + step)
            x = self.embed[tokens[a:b]]
            rot = self.rotation(torch.arange(p0 + a, p0 + b, device=tokens.device))
            indices = None
            for i in range(self.config.n_layers):
                x, indices = self._prefill_layer(i, x, kv, p0 + a, rot, indices)
            if return_hidden:
                hiddens.append(fused_rms_norm(x, self.norm, self.config.rms_eps))
            if all_logits:
                outs.append(self._logits(x))
            elif b == n:
                outs.append(self._logits(x[-1:]))
            if on_chunk is not None:
                on_chunk(b, n)
        logits = outs[0] if len(outs) == 1 else torch.cat(outs)
        return (logits, torch.cat(hiddens)) if return_hidden else logits

    # --- decode ---------------------------------------------------------------------------------
    def _index_decode(self, qi, ki, w, kv: GlmCudaState, slot: int, pos_l, pos) -> torch.Tensor:
        """Store the step's indexer key, score every cached token (the capacity: static shape,
        positions after `pos` masked) and keep the top-k ([1, K], -1 = none)."""
        keys = kv.ik[slot]
        keys.index_copy_(0, pos_l, ki)
        d = self.config.dsa
        # in the cache's dtype until the head-weighted sum (its accumulation is fp32): the [S, Hi]
        # intermediate is the largest tensor of a 1M-token step
        s = (keys @ (qi[0] * d.head_dim ** -0.5).t()).relu_()
        scores = torch.mv(s, w[0].to(s.dtype)).float().masked_fill(kv.rows > pos, float("-inf"))
        vals, idx = scores.topk(min(d.topk, scores.shape[0]))
        return torch.where(torch.isinf(vals), -1, idx)[None]

    def decode_step(self, tok: torch.Tensor, pos: torch.Tensor, kv: GlmCudaState,
                    logits: torch.Tensor | None = None) -> None:
        """tok [1] long, pos [1] int32 device buffers: overwrites tok with the greedy next token,
        writes the step's logits into `logits` [1, V] when given, and advances pos."""
        x = self.embed[tok]
        rot = self.rotation(pos)
        pos_l = pos.long()
        length = pos + 1
        indices = None
        s = kv.settings
        if kv.routed:  # the first block the window covers: candidates end there (all layers)
            end = ((pos - s.window + s.block_size) // s.block_size).clamp_min(0)
        for i, ly in enumerate(self.layers):
            a, b = self._project(ly, x, decode=True)
            if kv.blocks:  # the row and its block's descriptors
                fused_latent_append(self._latent(ly, a, rot), kv.kv[i], kv.kmin[i], kv.kmax[i], kv.kmean[i], pos,
                                    s.block_size)
            else:
                kv.kv[i].index_copy_(0, pos_l, self._latent(ly, a, rot))
            _, _, q_abs = self._queries(ly, b, rot)
            if kv.dsa and ly.full:
                qi, ki, w = self._index_inputs(ly, a, b, rot)
                indices = self._index_decode(qi, ki, w, kv, kv.slots[i], pos_l, pos)
            if kv.routed:
                o_lat = self._routed_decode_attention(q_abs, kv, i, length, end)
            else:
                o_lat = fused_mla_decode(q_abs, kv.kv[i], length, self.r, self.scale,
                                         indices=indices if kv.dsa else None)
            o = self._out(ly, o_lat)
            x = linear_gemv(o, ly.wo, residual=x)
            if ly.bo is not None:
                x = x + ly.bo
            x = self._mlp(ly, x, decode=True)
        out = linear_gemv(x, self.lm_head, norm_weight=self.norm, eps=self.config.rms_eps)
        if logits is not None:
            logits.copy_(out)
        fused_argmax(out, out=tok)
        pos.add_(1)
