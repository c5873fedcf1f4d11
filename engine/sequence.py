"""One request of a batch: its tokens, its place in the paged KV cache, and how it ends.

A `Sequence` is what the block manager allocates blocks for and the scheduler schedules: the
prompt's and the generated tokens in one list, the physical blocks holding their K/V
(`block_table`, one entry per `block_size` tokens), and how many of its tokens are already
in those blocks (`num_cached_tokens`: computed, or found in the prefix cache). The tokens
from there on are what the next forward computes; the last one's logits give the next
token. engine/batch.py runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch


class Status(Enum):
    WAITING = "waiting"  # not yet (or no longer: preempted) in the cache
    RUNNING = "running"  # has blocks; prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    token_ids: list[int]
    max_new_tokens: int
    block_size: int
    stop_ids: frozenset[int] = frozenset()
    # pick(fp32 logits [V] on the host, generated ids) -> next token; None: greedy, on the device
    pick: Callable[[torch.Tensor, list[int]], int] | None = None
    on_token: Callable[[int], None] | None = None  # each kept token, as it is accepted
    seq_id: int = -1  # set by the scheduler
    num_prompt_tokens: int = field(init=False)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_hashed_blocks: int = 0  # leading blocks whose hashes the block manager has recorded
    stop_reason: str | None = None  # "stop" (a stop token, not kept), "length" or "aborted"

    def __post_init__(self):
        if not self.token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_blocks(self) -> int:
        return -(-len(self.token_ids) // self.block_size)

    def block(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def accept(self, token: int) -> None:
        """A token the model produced: kept (and reported) unless it is a stop token; ends the
        sequence at a stop token or at max_new_tokens."""
        if token in self.stop_ids:
            self.stop_reason = "stop"
            return
        self.token_ids.append(token)
        if self.on_token is not None:
            self.on_token(token)
        if len(self.output) >= self.max_new_tokens:
            self.stop_reason = "length"
