"""Routed-expert GEMV references (fp32 PyTorch) for batch-1 decode: the experts a token's gate
chose, indexed by id in the stacked expert weights (no gather of weights, no host sync)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def naive_moe_gate_up(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """x [1, H], w13 [E, 2I, H] (gate rows then up rows), ids [K] -> [K, I]:
    silu(W_gate[e] x) * (W_up[e] x) for each chosen expert e."""
    gu = torch.einsum("kih,h->ki", w13[ids].float(), x[0].float())
    gate, up = gu.chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def naive_moe_down(act: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """act [K, I], w2 [E, H, I], ids [K], weights [K] -> [1, H]:
    sum_k weights[k] W_down[ids[k]] act[k] (+ residual [1, H])."""
    y = torch.einsum("khi,ki,k->h", w2[ids].float(), act.float(), weights.float())[None]
    if residual is not None:
        y = y + residual.float()
    return y.to(act.dtype)
