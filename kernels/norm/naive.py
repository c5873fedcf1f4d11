"""RMSNorm reference: y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32."""

from __future__ import annotations

import torch


def naive_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
                   ) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = (y * weight.float()).to(x.dtype)
    return y if out is None else out.copy_(y)
