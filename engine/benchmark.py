"""What `docqa engine bench` measures, through the engine's public API only (`Engine.load`,
`new_state`, `sparse_settings`, `prefill`, `generate`, `truncate`): the figures are those of
the paths `ask` and `ask --read-all` run, never of a path of the benchmark's own. The
baselines the GPU benchmarks compare against (HF transformers, the dense state) live in
`bench/`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .generate import Engine
    from .tokenizer import Tokenizer

BENCH_TEXT = (
    "The Supplier shall deliver the Goods to the Customer at the Delivery Address on the Delivery "
    "Date. Risk in the Goods passes on delivery; title passes when the Customer has paid in full. "
    "Either party may terminate this Agreement on 30 days' written notice if the other commits a "
    "material breach which, if remediable, it fails to remedy within 14 days of being asked to. "
)


def bench_prompt(tokenizer: Tokenizer, n_tokens: int) -> list[int]:
    """Exactly n_tokens of contract-like text (repeated), for repeatable benchmarks."""
    one = tokenizer.encode(BENCH_TEXT, add_bos=False)
    ids = (one * (n_tokens // len(one) + 1))[:n_tokens]
    if tokenizer.bos_id is not None and tokenizer.add_bos:
        ids[0] = tokenizer.bos_id
    return ids


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def benchmark(engine: Engine, prefill_lengths=(512, 2048), decode_tokens: int = 64) -> dict:
    """Prefill tok/s per prompt length, and decode tok/s after the shortest prompt."""
    out = {"prefill": {}, "decode_tok_s": None}
    for n in prefill_lengths:
        ids = bench_prompt(engine.tokenizer, n)
        state = engine.new_state(capacity=n + 1)
        t0 = time.perf_counter()
        engine.prefill(ids, state)
        _sync(engine)
        out["prefill"][n] = n / (time.perf_counter() - t0)
    ids = bench_prompt(engine.tokenizer, min(prefill_lengths))
    res = engine.generate(ids, decode_tokens, stop_ids=())
    out["decode_tok_s"] = res.decode_tok_s
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def context_benchmark(engine: Engine, context: int, question_tokens: int = 64, decode_tokens: int = 64,
                      say: Callable[[str], None] = lambda _m: None) -> dict:
    """The long-document path as `ask --read-all` runs it (the engine's sparse settings and
    state factory): prefill seconds of a `context`-token document, decode ms/token after it,
    and the time to the first token of a `question_tokens` question on the cached document
    (the state truncated back to the document, as the prefix cache's live state is). The
    fields are SPEC §3's `engine bench --context N --json`, and a few more."""
    from .generate import GREEDY_SYNC_EVERY

    settings = engine.sparse_settings()
    one = engine.tokenizer.encode(BENCH_TEXT, add_bos=False)
    doc = bench_prompt(engine.tokenizer, context)
    question = (one * (question_tokens // len(one) + 1))[:question_tokens]
    state = engine.new_state(context + question_tokens + decode_tokens + 2 * GREEDY_SYNC_EVERY, settings)
    # compile the kernels outside the timings, on this very state (a tiered one has its own variants)
    engine.generate(doc[:min(context, 8192)], 4, state=state, stop_ids=())
    state.truncate(0)
    _sync(engine)
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)
    t0 = time.perf_counter()
    engine.prefill(doc, state, on_chunk=lambda done, total: say(f"prefill {done}/{total}") if done % 131072 < 4096 else None)
    _sync(engine)
    prefill_s = time.perf_counter() - t0
    firsts = []
    for _ in range(3):
        state.truncate(context)
        t0 = time.perf_counter()
        engine.generate(question, 1, state=state, stop_ids=())
        _sync(engine)
        firsts.append(time.perf_counter() - t0)
    state.truncate(context)
    engine.generate(question, 2, state=state, stop_ids=())  # the first decode on a state sets it up (CUDA graph)
    state.truncate(context)
    res = engine.generate(question, decode_tokens, state=state, stop_ids=())
    if engine.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(engine.device) / 2**30
    else:
        peak = peak_rss_mib() / 1024
    return {"model": Path(str(engine.checkpoint.path)).name, "device": str(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."), "context": context, "prefill_s": prefill_s,
            "prefill_tok_s": context / prefill_s,
            "decode_ms_per_token": res.decode_s / max(len(res.token_ids) - 1, 1) * 1e3,
            "first_token_s": min(firsts), "peak_memory_gib": peak, "state": type(state).__name__,
            "settings": {k: getattr(settings, k) for k in ("window", "top_k", "block_size", "sink_tokens", "kv_dtype")}}
