"""The seam between the model and its KV cache.

A model layer computes q, k, v for a chunk of tokens and hands them, *before RoPE*, to the
sequence's `KVState`, which stores k/v, applies positions, and returns the attention output.
Keeping RoPE inside the state lets a sparse state give distant blocks other positions
(InfLLM-style remapping) without the model knowing. Dense and sparse states are
interchangeable; `generate()` can continue from a state that already holds a document
prefix (prefix caching).

Shapes (batch 1): q [T, Hq, D], k and v [T, Hkv, D]; output [T, Hq, D]. Queries of the chunk
attend causally to everything already in the state plus the chunk itself.
"""

from __future__ import annotations

from typing import Protocol

import torch


class KVState(Protocol):
    num_tokens: int  # tokens committed so far (the position of the next token)

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Store this chunk's k/v for `layer` and return attention output for its queries."""
        ...

    def commit(self, n: int) -> None:
        """Called by the model after all layers saw a chunk of n tokens."""
        ...

    def truncate(self, n: int) -> None:
        """Forget every token after the first n (to reuse a cached prefix)."""
        ...
