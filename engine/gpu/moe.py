"""The MoE MLP of GLM's CUDA decoders: GLM-4.5/4.6 on engine/gpu/model.py's `CudaDecoder`,
GLM-4.7-Flash and GLM-5 on engine/gpu/glm.py's `GlmCudaDecoder` (one place for both).

The model's own gate (engine/models/moe.py `route`: sigmoid scores, correction bias,
group-limited top-k, routed scaling, on the device: no host sync, so decode is graphed);
decode runs the chosen experts by id with the shared expert stacked as one more (kernels/moe),
prefill sorts the chunk's (token, expert) pairs by expert and runs one grouped GEMM per
projection (kernels/moe/grouped.py `moe_prefill`).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from ...kernels.linear.triton_gemv import fused_gemv
from ...kernels.moe import fused_moe_down, fused_moe_gate_up
from ...kernels.moe.grouped import moe_prefill
from ..config import ModelConfig
from ..models.moe import route

_EXPERT = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def pop_experts(tensors: dict[str, torch.Tensor]) -> dict[int, dict[int, dict[str, torch.Tensor]]]:
    """Take the per-expert matrices (checkpoints written one tensor per expert) out of
    `tensors` (names without `model.`): {layer: {expert: {"gate" | "up" | "down": tensor}}}."""
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if _EXPERT.fullmatch(n)]:
        g = _EXPERT.fullmatch(name)
        experts.setdefault(int(g.group(1)), {}).setdefault(int(g.group(2)), {})[g.group(3)] = tensors.pop(name)
    return experts


class MoeLayer:
    """One MoE layer's tensors (gate, stacked experts, shared expert) and its forward."""

    def __init__(self, config: ModelConfig, mp: str, take, per_expert: dict | None):
        """mp: the layer's `layers.{i}.mlp.` prefix; take(name, *default) pops a tensor;
        per_expert: this layer's `pop_experts` entry when its experts are not stacked."""
        self.spec = e = config.moe
        self.gate_w = take(mp + "gate.weight").float()
        self.gate_b = take(mp + "gate.e_score_correction_bias").float()
        w13, w2 = take(mp + "experts.gate_up_proj", None), take(mp + "experts.down_proj", None)
        if w13 is None:  # one tensor per expert (older transformers): stack this layer's
            per = per_expert
            w13 = torch.stack([torch.cat([per[j]["gate"], per[j]["up"]]) for j in range(e.n_routed)])
            w2 = torch.stack([per[j]["down"] for j in range(e.n_routed)])
            del per
        sg, su, sd = (take(mp + f"shared_experts.{n}_proj.weight") for n in ("gate", "up", "down"))
        self.stacked_shared = e.n_shared == 1
        if self.stacked_shared:  # the shared expert is one more stacked expert, weight 1, at id n_routed
            self.w13 = torch.cat([w13, torch.cat([sg, su])[None]])
            del w13
            self.w2 = torch.cat([w2, sd[None]])
            del w2
        else:  # a wider shared MLP runs on its own
            self.w13, self.w2 = w13, w2
            self.shared_w13, self.shared_w2 = torch.cat([sg, su]), sd
        device = self.w13.device
        self._one = torch.ones(1, dtype=torch.float32, device=device)
        self._shared = torch.full((1,), e.n_routed, dtype=torch.long, device=device)

    def __call__(self, x: torch.Tensor, h: torch.Tensor, decode: bool) -> torch.Tensor:
        """x + MoE(h), h the normed x [T, H] (T = 1 at decode); x is updated in place in prefill."""
        e = self.spec
        ids, wts = route(h, self.gate_w, self.gate_b, top_k=e.top_k, n_group=e.n_group, topk_group=e.topk_group,
                         norm_topk_prob=e.norm_topk_prob, routed_scaling=e.routed_scaling)
        if decode:
            ids, wts = ids[0], wts[0]
            if self.stacked_shared:
                ids, wts = torch.cat((ids, self._shared)), torch.cat((wts, self._one))
            x = fused_moe_down(fused_moe_gate_up(h, self.w13, ids), self.w2, ids, wts, residual=x)
            if not self.stacked_shared:
                x = fused_gemv(fused_gemv(h, self.shared_w13, swiglu=True), self.shared_w2, residual=x)
            return x
        if self.stacked_shared:  # the shared expert as one more column of every token, weight 1
            t = ids.shape[0]
            ids = torch.cat((ids, self._shared.expand(t, 1)), dim=1)
            wts = torch.cat((wts, self._one.expand(t, 1)), dim=1)
            return moe_prefill(h, self.w13, self.w2, ids, wts, x)
        x = moe_prefill(h, self.w13, self.w2, ids, wts, x)
        gu = h @ self.shared_w13.t()
        n = gu.shape[1] // 2
        return x.addmm_(F.silu(gu[:, :n]) * gu[:, n:], self.shared_w2.t())

    def tensors(self) -> list[torch.Tensor]:
        return [x for x in vars(self).values() if isinstance(x, torch.Tensor)]
