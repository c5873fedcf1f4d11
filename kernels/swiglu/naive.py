"""SwiGLU reference: silu(gate) * up, computed in fp32."""

from __future__ import annotations

import torch


def naive_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.float()
    return (g * torch.sigmoid(g) * up.float()).to(gate.dtype)
