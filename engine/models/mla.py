"""Multi-head latent attention (GLM-4.7-Flash, GLM-5) and GLM-5's DSA lightning indexer.

MLA compresses each token's keys and values into one latent c = norm(W_DKV x) [kv_lora_rank]
plus one RoPE key k_rot [qk_rope_head_dim] shared by all heads. Per head, k_nope = W_UK c and
v = W_UV c; instead of expanding them for every cached token we fold W_UK into the query
(q_lat = q_nope W_UK, so q_nope . k_nope = q_lat . c) and W_UV into the output (o = o_lat W_UV^T
with o_lat the attention-weighted sum of latents). The state (engine/mla_state.py) then stores
and reads only [kv_lora_rank + qk_rope_head_dim] per token and layer.

The indexer (DSA) scores tokens with its own small heads: q_i = W_qb_i q_resid (the query's
low-rank residual), one key k_i = LayerNorm(W_k x) per token, weights w = W_w x / sqrt(H_i);
index(t, s) = sum_h w[t,h] relu(q_i[t,h] . k_i[s] / sqrt(D_i)). RoPE turns the first
qk_rope_head_dim dims of q_i and k_i (interleaved pairs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .llama import Linear, RMSNorm, _param

LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with its default eps


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = _param(dim)
        self.bias = _param(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Indexer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        d = config.dsa
        self.layer = layer
        self.n_heads, self.head_dim = d.n_heads, d.head_dim
        self.wq_b = Linear(config.mla.q_lora_rank, d.n_heads * d.head_dim)
        self.wk = Linear(config.hidden, d.head_dim)
        self.k_norm = LayerNorm(d.head_dim)
        self.weights_proj = Linear(config.hidden, d.n_heads)

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, state, positions: torch.Tensor):
        t = x.shape[0]
        q = self.wq_b(q_resid).view(t, self.n_heads, self.head_dim)
        k = self.k_norm(self.wk(x))
        w = self.weights_proj(x).float() * self.n_heads ** -0.5
        return state.select(self.layer, q, k, w, positions, scale=self.head_dim ** -0.5)


class MLAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        m = config.mla
        self.layer = layer
        self.n_heads = config.n_heads
        self.nope, self.rope_dim, self.v_dim, self.r = (m.qk_nope_head_dim, m.qk_rope_head_dim,
                                                        m.v_head_dim, m.kv_lora_rank)
        qk = self.nope + self.rope_dim
        bias = config.qkv_bias
        if m.q_lora_rank is None:
            self.q_proj = Linear(config.hidden, self.n_heads * qk)
        else:
            self.q_a_proj = Linear(config.hidden, m.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(m.q_lora_rank, self.n_heads * qk)
        self.kv_a_proj_with_mqa = Linear(config.hidden, self.r + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.r, LATENT_NORM_EPS)
        self.kv_b_proj = Linear(self.r, self.n_heads * (self.nope + self.v_dim))
        self.o_proj = Linear(self.n_heads * self.v_dim, config.hidden, bias=bias)
        self.scale = qk ** -0.5
        self.low_rank_q = m.q_lora_rank is not None
        kinds = config.dsa.indexer_types if config.dsa is not None else None
        self.indexer = Indexer(config, layer) if kinds and kinds[layer] == "full" else None
        self.uses_index = kinds is not None

    def forward(self, x: torch.Tensor, state, positions: torch.Tensor,
                indices: torch.Tensor | None = None):
        """-> (output [T, hidden], the top-k indices this layer attended to, or None for all)."""
        t = x.shape[0]
        if self.low_rank_q:
            q_resid = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_resid)
        else:
            q_resid, q = None, self.q_proj(x)
        q_nope, q_rot = q.view(t, self.n_heads, -1).split((self.nope, self.rope_dim), dim=-1)
        c, k_rot = self.kv_a_proj_with_mqa(x).split((self.r, self.rope_dim), dim=-1)
        latent = torch.cat((self.kv_a_layernorm(c), k_rot), dim=-1)
        w = self.kv_b_proj.weight.view(self.n_heads, self.nope + self.v_dim, self.r)
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope:]
        q_lat = torch.einsum("thn,hnr->thr", q_nope, w_uk)
        if self.indexer is not None:
            indices = self.indexer(x, q_resid, state, positions)
        o_lat = state.attend(self.layer, torch.cat((q_lat, q_rot), dim=-1), latent, None, positions,
                             scale=self.scale, indices=indices if self.uses_index else None)
        o = torch.einsum("thr,hvr->thv", o_lat, w_uv).reshape(t, -1)
        return self.o_proj(o), indices
