"""Next-token choice: greedy (the default, so answers are deterministic) or temperature/top-p."""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [V] -> a 0-d LongTensor token id. temperature 0 is argmax."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest head of the distribution whose mass reaches top_p (always >= 1 token).
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return order[choice].reshape(())
    return torch.multinomial(probs, 1, generator=generator).reshape(())
