"""Many requests on one engine at once: `BatchSession` (continuous batching) and the plain loop
that stands in for it where there is no batched forward.

sequence → block manager → scheduler → model runner → here: a session owns one paged KV pool
(engine/gpu/paged.py) and a scheduler over it; requests `add`ed to it join the running batch
at the next `step`, each step runs one forward over the parts the scheduler picked, and a
request leaves as soon as it ends (a stop token, its max_new_tokens, or `abort`). Each step
every sampling sequence gets its token: greedy ones from the device's argmax (one read-back
for the batch), those with a chooser or a temperature from their row of logits on the host.

`BatchThread` runs a session on a thread of its own for callers on other threads (a review's
items, a summary's segments): each `generate` call joins the batch and blocks until its request
ends, so code written for one request at a time is batched by running it on many threads.

`Engine.batch_session()` gives the Triton Llama-family decoder a `BatchSession` and every other
engine (the PyTorch model on the CPU, GLM's MLA decoder) a `SequentialSession`: the same
interface, one request after another through `Engine.generate`. Both give, for each request,
the `GenerationResult` its own `Engine.generate` would (greedy: the same tokens).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .block_manager import BlockManager
from .chat import split_thinking
from .sampling import sample
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .tokenizer import TextStream

if TYPE_CHECKING:
    from .generate import Engine, GenerationResult


@dataclass(eq=False)
class Request:
    """A request in a session: its sequence, and when its steps happened."""

    seq: Sequence
    added: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    ended: float | None = None
    cached_tokens: int | None = None  # prompt tokens found in the KV cache when it was first admitted
    cancelled: bool = False  # set from any thread (`cancel`): the session ends it at its next step
    result: GenerationResult | None = None  # once it has ended

    @property
    def done(self) -> bool:
        return self.result is not None

    def cancel(self) -> None:
        self.cancelled = True


def _picker(engine: Engine, temperature: float, top_p: float, seed: int | None,
            choose: Callable[[torch.Tensor, list[int]], int] | None):
    if choose is not None:
        return lambda logits, out: int(choose(logits, out))
    if temperature > 0:
        g = torch.Generator(device="cpu").manual_seed(seed if seed is not None else torch.seed() & 0xFFFFFFFF)
        return lambda logits, out: int(sample(logits, temperature=temperature, top_p=top_p, generator=g))
    return None


class _Session:
    """What both sessions share: requests in, `GenerationResult`s out."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def _sequence(self, ids: Seq[int], max_new_tokens: int, stop_ids, temperature, top_p, seed, choose, on_token,
                  block_size: int) -> Sequence:
        tok = self.engine.tokenizer
        stream = TextStream(tok)
        emit = (lambda t: on_token(t, stream.push(t))) if on_token is not None else None
        stops = frozenset(tok.stop_ids if stop_ids is None else stop_ids)
        return Sequence(list(ids), max_new_tokens, block_size, stops, _picker(self.engine, temperature, top_p, seed, choose),
                        emit)

    def _result(self, req: Request) -> GenerationResult:
        from .generate import GenerationResult

        seq, tok = req.seq, self.engine.tokenizer
        thinking, text = split_thinking(seq.output, tok)
        first = req.first_token or req.ended
        return GenerationResult(text, list(seq.output), seq.num_prompt_tokens, first - req.added, req.ended - first,
                                seq.stop_reason, thinking)


class BatchSession(_Session):
    def __init__(self, engine: Engine, *, pool_tokens: int, block_size: int = 64, max_seqs: int = 128,
                 max_tokens: int = 8192):
        from .gpu.paged import ModelRunner, PagedKVCache

        super().__init__(engine)
        num_blocks = max(1, pool_tokens // block_size)
        self.cache = PagedKVCache(engine.config, num_blocks, block_size, engine.dtype, engine.device)
        self.blocks = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, max_seqs=max_seqs, max_tokens=max_tokens)
        self.runner = ModelRunner(engine.model, self.cache)
        self._requests: dict[int, Request] = {}
        # seconds spent per part of `step`, summed, when a profile asks for them (`StepTimes`)
        self.times: StepTimes | None = None
        # Longer prompts belong to the long-document path (routed sparse state, prefix cache on
        # disk): a few of them would hold the whole pool and leave the batch one sequence wide.
        self.max_prompt_tokens = num_blocks * block_size // 8

    def add(self, ids: Seq[int], max_new_tokens: int = 256, *, stop_ids: Seq[int] | None = None,
            temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
            choose: Callable[[torch.Tensor, list[int]], int] | None = None,
            on_token: Callable[[int, str], None] | None = None) -> Request:
        """Queue a request (as `Engine.generate` takes one); it runs from the next `step`."""
        seq = self._sequence(ids, max_new_tokens, stop_ids, temperature, top_p, seed, choose, on_token,
                             self.blocks.block_size)
        self.scheduler.add(seq)
        req = self._requests[seq.seq_id] = Request(seq)
        return req

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[Request]:
        """One forward over what the scheduler picks; returns the requests that ended (those
        cancelled since the last step too)."""
        t0 = time.perf_counter()
        ended = []
        for req in [r for r in self._requests.values() if r.cancelled]:
            self.abort(req)
            ended.append(req)
        work = self.scheduler.schedule()
        if not work:
            if self.scheduler.has_work:
                raise RuntimeError("the KV pool cannot hold any waiting request")
            return ended
        for w in work:
            req = self._requests[w.seq.seq_id]
            if req.cached_tokens is None:
                req.cached_tokens = w.start  # its first blocks came from the cache
        t1 = time.perf_counter()
        logits = self.runner.run(work)
        t2 = time.perf_counter()
        sampling = [w.seq for w in work if w.samples]
        greedy = logits.argmax(-1).tolist() if any(s.pick is None for s in sampling) else None
        t3 = time.perf_counter()
        chosen = [j for j, seq in enumerate(sampling) if seq.pick is not None]
        rows = iter(logits[chosen].cpu()) if chosen else None  # one copy for every chooser's row
        tokens = {}
        for j, seq in enumerate(sampling):
            tokens[seq.seq_id] = greedy[j] if seq.pick is None else seq.pick(next(rows), seq.output)
        t4 = time.perf_counter()
        for seq in sampling:
            req = self._requests[seq.seq_id]
            if req.first_token is None:
                req.first_token = t4
        ended += [self._close(seq) for seq in self.scheduler.finish(work, tokens)]
        if self.times is not None:
            self.times.add(work, t0, t1, t2, t3, t4, time.perf_counter())
        return ended

    def abort(self, req: Request) -> None:
        """End a request now (its client went away): it keeps what it generated."""
        if not req.done:
            self.scheduler.abort(req.seq)
            self._close(req.seq)

    def _close(self, seq: Sequence) -> Request:
        req = self._requests.pop(seq.seq_id)
        req.ended = time.perf_counter()
        req.result = self._result(req)
        return req


@dataclass
class StepTimes:
    """Where a session's steps spend their time, summed over steps (a profile: the benchmark sets
    `BatchSession.times`). A decode step's forward is launched asynchronously, so `forward` is
    the host's time to launch it and `wait` the device's remaining time (the read-back of the
    greedy tokens); `choose` is the host's per-sequence choosers, `finish` the scheduler's
    bookkeeping and each accepted token's callback (detokenising and streaming)."""

    steps: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})
    seconds: dict[str, dict[str, float]] = field(default_factory=lambda: {
        kind: dict.fromkeys(("schedule", "forward", "wait", "choose", "finish"), 0.0) for kind in ("prefill", "decode")})
    tokens: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})

    def add(self, work, *t: float) -> None:
        kind = "decode" if all(w.count == 1 for w in work) else "prefill"
        self.steps[kind] += 1
        self.tokens[kind] += sum(w.count for w in work)
        for name, a, b in zip(self.seconds[kind], t, t[1:]):
            self.seconds[kind][name] += b - a

    def summary(self) -> dict:
        """Per kind of step: steps, tokens, and milliseconds per step of each part."""
        return {kind: {"steps": n, "tokens": self.tokens[kind],
                       **{f"{k}_ms": 1e3 * v / max(1, n) for k, v in self.seconds[kind].items()}}
                for kind, n in self.steps.items()}


class SequentialSession(_Session):
    """`BatchSession`'s interface where the engine has no batched forward: each step generates
    one request whole through `Engine.generate`."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self._queue: deque[tuple[Request, dict]] = deque()

    def add(self, ids: Seq[int], max_new_tokens: int = 256, *, stop_ids: Seq[int] | None = None,
            temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
            choose: Callable[[torch.Tensor, list[int]], int] | None = None,
            on_token: Callable[[int, str], None] | None = None) -> Request:
        seq = Sequence(list(ids), max_new_tokens, 1)
        req = Request(seq)
        self._queue.append((req, dict(max_new_tokens=max_new_tokens, stop_ids=stop_ids, temperature=temperature,
                                      top_p=top_p, seed=seed, choose=choose, on_token=on_token)))
        return req

    @property
    def has_work(self) -> bool:
        return bool(self._queue)

    def step(self) -> list[Request]:
        if not self._queue:
            return []
        req, kw = self._queue.popleft()
        if req.cancelled:
            return [self._aborted(req)]
        emit = kw.pop("on_token")

        def on_token(tok: int, delta: str) -> None:
            if req.cancelled:
                raise _Cancelled()
            req.seq.token_ids.append(tok)  # its output so far, as a BatchSession's sequence has it
            if emit is not None:
                emit(tok, delta)

        try:
            req.result = self.engine.generate(req.seq.token_ids, **kw, on_token=on_token)
        except _Cancelled:
            return [self._aborted(req)]
        req.ended = time.perf_counter()
        req.seq.status = Status.FINISHED
        return [req]

    def abort(self, req: Request) -> None:
        for i, (r, _) in enumerate(self._queue):
            if r is req:
                del self._queue[i]
                self._aborted(req)
                return

    def _aborted(self, req: Request) -> Request:
        req.seq.stop_reason = "aborted"
        req.seq.status = Status.FINISHED
        req.ended = req.first_token = time.perf_counter()
        req.result = self._result(req)
        return req


class _Cancelled(Exception):
    """A request cancelled while `Engine.generate` runs it (raised from its token callback)."""


def take_all(q: queue.Queue, wait: bool) -> list:
    """Everything waiting in `q`, and with `wait` at least one item (blocking for it): a batch
    loop takes every new request at each step, and sleeps on the queue only when it has no work."""
    items = [q.get()] if wait else []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class BatchThread:
    """A `BatchSession` run by its own thread while callers on other threads each `generate` one
    request, as `Engine.generate` would (greedy: the same tokens), blocking until it ends; their
    requests are batched at every step. The thread holds `lock` while the engine works, so a
    caller holding it may run the engine itself between steps (a prompt past the session's
    `max_prompt_tokens`, a prefill for its logits)."""

    def __init__(self, session: BatchSession, lock: threading.RLock):
        self.session, self.lock = session, lock
        self._new: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="docqa-batch", daemon=True)
        self._thread.start()

    def generate(self, ids: Seq[int], max_new_tokens: int = 256, **options) -> GenerationResult:
        """`BatchSession.add`'s arguments; the request's result once it has ended."""
        call = _Call(list(ids), max_new_tokens, options)
        self._new.put(call)
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.request.result

    def close(self) -> None:
        """Stop the thread once the requests it has are done."""
        self._new.put(None)
        self._thread.join()

    def _run(self) -> None:
        session, active, closing = self.session, {}, False
        while True:
            if closing and not session.has_work:
                return
            calls = take_all(self._new, wait=not session.has_work)
            for call in calls:
                if call is None:  # after the requests it has (a caller still waiting gets its answer)
                    closing = True
                    continue
                try:
                    call.request = session.add(call.ids, call.max_new_tokens, **call.options)
                except Exception as e:  # noqa: BLE001 - this request is refused (too long for the pool)
                    call.fail(e)
                    continue
                active[call.request] = call
            if not session.has_work:
                continue
            try:
                with self.lock:
                    ended = session.step()
            except Exception as e:  # noqa: BLE001 - the engine failed: every caller in the batch gets it
                for req, call in active.items():
                    session.abort(req)
                    call.fail(e)
                active.clear()
                continue
            for req in ended:
                active.pop(req).done.set()


@dataclass(eq=False)
class _Call:
    ids: list[int]
    max_new_tokens: int
    options: dict
    request: Request | None = None
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()
