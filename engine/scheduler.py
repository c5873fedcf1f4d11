"""Which sequences the next forward runs, and how many of their tokens (continuous batching).

A step either prefills or decodes (nano-vllm's order): while prompts wait for the cache, the
step prefills as many of them as the token budget holds, in order of arrival — first those
already part-way through their prefill, then new ones as the block manager has room for them
(a prompt longer than the budget is prefilled in chunks across steps), all in one forward;
otherwise every running sequence decodes one token. So a decode step is the same shape every
time (one token per sequence: a captured graph replays it), and sequences still join and leave
the batch at every step. A new prompt is admitted only if one block per running sequence stays
free besides its own, so the batch can keep decoding a while before it runs out of room; when
decoding needs a block and none is free, the sequence that came last is preempted: its blocks
go back (their full ones keep their hashes, so it often finds them again) and it waits at the
front of the queue to be prefilled again, generated tokens included.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .sequence import Sequence, Status


@dataclass(frozen=True)
class Work:
    """One sequence's part of a forward: tokens [start, start + count) of seq.token_ids."""

    seq: Sequence
    start: int
    count: int

    @property
    def samples(self) -> bool:
        """Whether the forward's last row of this part gives the sequence its next token."""
        return self.start + self.count == len(self.seq)


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_seqs: int, max_tokens: int):
        if max_seqs < 1 or max_tokens < 1:
            raise ValueError("a batch needs room for at least one sequence and one token")
        self.blocks = block_manager
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in order of admission
        self._next_id = 0

    def add(self, seq: Sequence) -> None:
        pool = len(self.blocks.blocks) * self.blocks.block_size
        if len(seq) + seq.max_new_tokens > pool:
            raise ValueError(f"{len(seq)} prompt tokens and {seq.max_new_tokens} new ones do not fit the "
                             f"KV pool ({pool} tokens)")
        seq.seq_id, self._next_id = self._next_id, self._next_id + 1
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Work]:
        return self._prefill() or self._decode()

    def _prefill(self) -> list[Work]:
        work: list[Work] = []
        budget = self.max_tokens
        for seq in self.running:  # prefills under way
            todo = len(seq) - seq.num_cached_tokens
            if todo > 1 and budget > 0:
                n = min(todo, budget)
                work.append(Work(seq, seq.num_cached_tokens, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:  # new prompts
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq, reserve=len(self.running)):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = min(len(seq) - seq.num_cached_tokens, budget)
            work.append(Work(seq, seq.num_cached_tokens, n))
            budget -= n
        return work

    def _decode(self) -> list[Work]:
        work: list[Work] = []
        for seq in list(self.running):
            if seq not in self.running:
                continue  # preempted just now
            while not self.blocks.can_append(seq):
                self._preempt(self.running[-1])
                if seq not in self.running:
                    break
            else:
                self.blocks.may_append(seq)
                work.append(Work(seq, len(seq) - 1, 1))
        return work

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.deallocate(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def finish(self, work: list[Work], tokens: dict[int, int]) -> list[Sequence]:
        """After the forward: what each part computed is in the cache, and the parts that
        sample take their token (`tokens`: seq_id -> token). Returns the sequences that ended."""
        done = []
        for w in work:
            seq = w.seq
            seq.num_cached_tokens = w.start + w.count
            self.blocks.hash_blocks(seq)
            if w.samples:
                seq.accept(tokens[seq.seq_id])
                if seq.stop_reason is not None:
                    done.append(seq)
        for seq in done:
            self._end(seq)
        return done

    def abort(self, seq: Sequence) -> None:
        """End seq now (its client went away)."""
        if seq.status == Status.FINISHED:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.stop_reason = seq.stop_reason or "aborted"
        self._end(seq)

    def _end(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.deallocate(seq)
        seq.status = Status.FINISHED
