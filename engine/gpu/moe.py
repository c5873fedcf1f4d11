"""The MoE MLP of GLM's CUDA decoders: GLM-4.5/4.6 on engine/gpu/model.py's `CudaDecoder`,
GLM-4.7-Flash and GLM-5 on engine/gpu/glm.py's `GlmCudaDecoder` (one place for both).

The model's own gate (engine/models/moe.py `route`: sigmoid scores, correction bias,
group-limited top-k, routed scaling, on the device: no host sync, so decode is graphed);
decode runs the chosen experts by id with the shared expert stacked as one more (kernels/moe),
prefill sorts the chunk's (token, expert) pairs by expert and runs one grouped GEMM per
projection (kernels/moe/grouped.py `moe_prefill`).

FP8 experts (`Fp8Weight`, GlmCudaDecoder on FP8 checkpoints) stay e4m3: the decode GEMVs of
kernels/moe/triton_moe_fp8.py and `fp8_grouped_matmul` as the prefill's grouped product. Experts
stored one tensor per expert are stacked FP8 when all are FP8, else dequantised to the model
dtype; the shared expert is stacked as one more only when it is stored as the experts are (all
FP8 or all plain), else it runs as a separate MLP, as a wider one does.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from ...kernels.linear.naive_fp8 import append_expert, fuse_rows, is_fp8, stack_experts
from ...kernels.linear.triton_fp8 import fp8_grouped_matmul, linear_add_mm, linear_gemv, linear_mm
from ...kernels.moe import fused_moe_down, fused_moe_gate_up
from ...kernels.moe.grouped import grouped_mm, moe_prefill
from ...kernels.moe.triton_moe_fp8 import fp8_moe_down, fp8_moe_gate_up
from ..config import ModelConfig
from ..models.moe import route

_EXPERT = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def pop_experts(tensors: dict[str, torch.Tensor]) -> dict[int, dict[int, dict[str, torch.Tensor]]]:
    """Take the per-expert matrices (checkpoints written one tensor per expert) out of
    `tensors` (names without `model.`): {layer: {expert: {"gate" | "up" | "down": tensor}}}
    (an `Fp8Weight` in place of a tensor for FP8 checkpoints)."""
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if _EXPERT.fullmatch(n)]:
        g = _EXPERT.fullmatch(name)
        experts.setdefault(int(g.group(1)), {}).setdefault(int(g.group(2)), {})[g.group(3)] = tensors.pop(name)
    return experts


class MoeLayer:
    """One MoE layer's tensors (gate, stacked experts, shared expert) and its forward."""

    def __init__(self, config: ModelConfig, mp: str, take, per_expert: dict | None, dtype: torch.dtype):
        """mp: the layer's `layers.{i}.mlp.` prefix; take(name, *default) pops a tensor (or an
        `Fp8Weight`); per_expert: this layer's `pop_experts` entry when its experts are not
        stacked; dtype: the model's, for FP8 matrices that must be dequantised."""
        self.spec = e = config.moe
        self.gate_w = take(mp + "gate.weight").float()
        self.gate_b = take(mp + "gate.e_score_correction_bias").float()
        w13, w2 = take(mp + "experts.gate_up_proj", None), take(mp + "experts.down_proj", None)
        if w13 is None:  # one tensor per expert (older transformers): stack this layer's
            per = per_expert
            w13 = stack_experts([fuse_rows([per[j]["gate"], per[j]["up"]], dtype, runs=False)
                                 for j in range(e.n_routed)], dtype)
            w2 = stack_experts([per[j]["down"] for j in range(e.n_routed)], dtype)
        sg, su, sd = (take(mp + f"shared_experts.{n}_proj.weight") for n in ("gate", "up", "down"))
        shared13 = fuse_rows([sg, su], dtype, runs=False)
        self.stacked_shared = e.n_shared == 1 and is_fp8(w13) == is_fp8(shared13) == is_fp8(w2) == is_fp8(sd)
        if self.stacked_shared:  # the shared expert is one more stacked expert, weight 1, at id n_routed
            self.w13 = append_expert(w13, shared13)
            del w13
            self.w2 = append_expert(w2, sd)
            del w2
        else:  # a wider shared MLP (or one stored otherwise than the experts) runs on its own
            self.w13, self.w2 = w13, w2
            self.shared_w13, self.shared_w2 = shared13, sd
        self.fp8 = is_fp8(self.w13)  # FP8 checkpoints quantise every expert matrix (w2 as w13)
        device = self.gate_w.device
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
            gate_up, down = (fp8_moe_gate_up, fp8_moe_down) if self.fp8 else (fused_moe_gate_up, fused_moe_down)
            x = down(gate_up(h, self.w13, ids), self.w2, ids, wts, residual=x)
            if not self.stacked_shared:
                x = linear_gemv(linear_gemv(h, self.shared_w13, swiglu=True), self.shared_w2, residual=x)
            return x
        mm = fp8_grouped_matmul if self.fp8 else grouped_mm
        if self.stacked_shared:  # the shared expert as one more column of every token, weight 1
            t = ids.shape[0]
            ids = torch.cat((ids, self._shared.expand(t, 1)), dim=1)
            wts = torch.cat((wts, self._one.expand(t, 1)), dim=1)
            return moe_prefill(h, self.w13, self.w2, ids, wts, x, mm=mm)
        x = moe_prefill(h, self.w13, self.w2, ids, wts, x, mm=mm)
        gu = linear_mm(h, self.shared_w13)
        n = gu.shape[1] // 2
        return linear_add_mm(x, F.silu(gu[:, :n]) * gu[:, n:], self.shared_w2)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the layer holds (an `Fp8Weight`'s weights and scales too)."""
        out = []
        for x in vars(self).values():
            for y in (x if isinstance(x, tuple) else (x,)):
                if isinstance(y, torch.Tensor):
                    out.append(y)
        return out
