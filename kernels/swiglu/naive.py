"""SwiGLU reference: silu(gate) * up, computed in fp32."""

from __future__ import annotations

import torch


def naive_swiglu(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    g = gate.float()
    y = (g * torch.sigmoid(g) * up.float()).to(gate.dtype)
    return y if out is None else out.copy_(y)
