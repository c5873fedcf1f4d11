"""The paged KV cache's bookkeeping: fixed-size blocks, a block table per sequence, and full
blocks shared by content (nano-vllm's block manager, in our words).

A block holds `block_size` consecutive tokens' K/V of one sequence. A full block is known by
a hash chained over the token ids (h_i = hash(h_{i-1}, tokens of block i)), so its hash
commits to every token before it, and a later sequence whose tokens start the same way
takes the same blocks instead of computing them again; a hit re-checks the token ids, so a
hash collision never serves K/V that other tokens produced. A block whose last user is done
goes back to the free list but keeps its hash until it is handed out again: a prefix outlives
the request that computed it for as long as the pool does not need its room.

Only the last, partial block of a sequence is ever written: shared blocks are full and
immutable.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field

import torch

from .sequence import Sequence


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = field(default=(), repr=False)


def chain_hash(token_ids: list[int], prefix: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    if prefix is not None:
        h.update(prefix)
    h.update(torch.tensor(token_ids, dtype=torch.int64).numpy().tobytes())
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the pool needs at least one block of at least one token")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block: dict[bytes, int] = {}
        self.free: deque[int] = deque(range(num_blocks))
        self.used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self.free)

    # --- allocation -----------------------------------------------------------------------------
    def _take(self) -> int:
        block = self.blocks[self.free.popleft()]
        assert block.ref_count == 0
        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]  # its content is about to be overwritten
        block.ref_count, block.hash, block.token_ids = 1, None, ()
        self.used.add(block.block_id)
        return block.block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.used.discard(block_id)
            self.free.append(block_id)

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding seq's leading full blocks, as far as the cache has them. The block
        with the last token is never taken: generation needs that token's logits."""
        out, h = [], None
        for i in range((len(seq) - 1) // self.block_size):
            tokens = seq.block(i)
            h = chain_hash(tokens, h)
            bid = self.hash_to_block.get(h)
            if bid is None or self.blocks[bid].token_ids != tuple(tokens):
                break
            out.append(bid)
        return out

    def can_allocate(self, seq: Sequence, reserve: int = 0) -> bool:
        """Room for seq's blocks with `reserve` blocks left free after them."""
        cached = self._cached_prefix(seq)
        fresh = seq.num_blocks - len(cached)
        revived = sum(1 for b in cached if b not in self.used)  # free blocks the hit takes back
        return self.num_free - revived - reserve >= fresh

    def allocate(self, seq: Sequence) -> None:
        """Blocks for every token seq holds now: cached ones shared, the rest fresh."""
        assert not seq.block_table
        cached = self._cached_prefix(seq)
        for bid in cached:
            block = self.blocks[bid]
            if bid in self.used:
                block.ref_count += 1
            else:
                self.free.remove(bid)
                self.used.add(bid)
                block.ref_count = 1
            seq.block_table.append(bid)
        for _ in range(len(cached), seq.num_blocks):
            seq.block_table.append(self._take())
        seq.num_cached_tokens = len(cached) * self.block_size
        seq.num_hashed_blocks = len(cached)

    def deallocate(self, seq: Sequence) -> None:
        for bid in reversed(seq.block_table):
            self._release(bid)
        seq.block_table.clear()
        seq.num_cached_tokens = seq.num_hashed_blocks = 0

    def can_append(self, seq: Sequence) -> bool:
        """Room for seq's next token (a new block when the last one is full)."""
        return len(seq.block_table) * self.block_size > len(seq) or self.num_free > 0

    def may_append(self, seq: Sequence) -> None:
        if len(seq.block_table) * self.block_size <= len(seq):
            seq.block_table.append(self._take())

    def hash_blocks(self, seq: Sequence) -> None:
        """Record the hashes of seq's blocks that its computed tokens have filled, so later
        sequences with the same start share them."""
        first = seq.num_hashed_blocks
        h = self.blocks[seq.block_table[first - 1]].hash if first else None
        for i in range(first, seq.num_cached_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            tokens = seq.block(i)
            h = chain_hash(tokens, h)
            block.hash, block.token_ids = h, tuple(tokens)
            self.hash_to_block[h] = block.block_id
            seq.num_hashed_blocks = i + 1
