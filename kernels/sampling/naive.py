"""Reference for choosing the next token from a logits row."""

from __future__ import annotations

import torch


def naive_argmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy pick: the index of the largest entry of a 1-D (or [1, N]) tensor as a [1] int64
    tensor (the first index on ties, as `torch.argmax`); fills `out` when given."""
    idx = x.reshape(-1).argmax().reshape(1)
    return idx if out is None else out.copy_(idx)
