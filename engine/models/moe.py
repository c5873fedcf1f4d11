"""Mixture of experts with shared experts and the DeepSeek-V3 / GLM-4.5 gate.

The gate scores every routed expert with a sigmoid, adds a per-expert correction bias (used only
to *choose* experts, not to weight them), keeps the `topk_group` groups whose two best biased
scores sum highest, takes the top_k experts inside them, weights each by its unbiased score
(normalised to sum 1 when norm_topk_prob) times routed_scaling. Shared experts see every token.

Routed experts are stored stacked ([E, 2I, H] gate+up, [E, H, I] down) so a step touches only
the chosen experts' slices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .llama import Linear, _param


def route(x: torch.Tensor, gate_weight: torch.Tensor, bias: torch.Tensor, *, top_k: int,
          n_group: int, topk_group: int, norm_topk_prob: bool,
          routed_scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (expert ids [T, top_k], weights [T, top_k]) as the checkpoint's gate decides."""
    scores = F.linear(x.float(), gate_weight.float()).sigmoid()
    choice = scores + bias
    n = choice.shape[-1]
    if n_group > 1:
        groups = choice.view(-1, n_group, n // n_group).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(groups, dtype=torch.bool)
        keep.scatter_(1, groups.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(n // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return ids, weights * routed_scaling


class DenseMLP(nn.Module):
    """SwiGLU MLP of any width (shared experts, GLM's dense layers)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate)
        self.up_proj = Linear(hidden, intermediate)
        self.down_proj = Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.weight = _param(config.moe.n_routed, config.hidden)
        self.e_score_correction_bias = _param(config.moe.n_routed)


class Experts(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        m = config.moe
        self.gate_up_proj = _param(m.n_routed, 2 * m.intermediate, config.hidden)
        self.down_proj = _param(m.n_routed, config.hidden, m.intermediate)


class MoE(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.spec = config.moe
        self.gate = Gate(config)
        self.experts = Experts(config)
        self.shared_experts = DenseMLP(config.hidden, config.moe.intermediate * config.moe.n_shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.spec
        ids, weights = route(x, self.gate.weight, self.gate.e_score_correction_bias, top_k=m.top_k,
                             n_group=m.n_group, topk_group=m.topk_group,
                             norm_topk_prob=m.norm_topk_prob, routed_scaling=m.routed_scaling)
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            tok, slot = torch.where(ids == e)
            gate, up = F.linear(x[tok], self.experts.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.experts.down_proj[e])
            out.index_add_(0, tok, y * weights[tok, slot, None].to(y.dtype))
        return out + self.shared_experts(x)
