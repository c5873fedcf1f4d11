"""`Engine`: a loaded model + tokenizer, and the prefill/decode loop."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..kernels.gpu import has_triton
from .attention import KVState
from .chat import render_chat
from .checkpoint import Checkpoint, load_model
from .dense import DenseKVState
from .device import resolve_device
from .rope import Rope
from .sampling import sample
from .settings import EngineSettings
from .sparse_state import SparseKVState
from .tokenizer import TextStream, Tokenizer


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated tokens only
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    stop_reason: str = "length"  # "stop" (a stop token) or "length" (max_new_tokens)

    @property
    def decode_tok_s(self) -> float:
        # The first token comes out of prefill; decode time covers the rest.
        n = max(len(self.token_ids) - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0


def default_threads() -> int:
    """`DOCQA_THREADS`, else one thread per core that is not already busy.

    Cores are the ones visible to this process; busy ones are counted from the 1-minute load
    average. On a shared machine every OpenMP thread of a matmul waits at its end for the
    slowest one, and a thread whose core runs someone else's process is descheduled for whole
    time slices: 2 threads on 2 busy cores decoded ~90x slower than on an idle core, where
    1 thread gets its fair share (bench/results/cpu_contention.md). Threads also sleep rather
    than spin while they wait (OMP_WAIT_POLICY=PASSIVE, set in engine/__init__.py before torch
    loads), so our own waiting threads do not take time from the others either."""
    if os.environ.get("DOCQA_THREADS"):
        return max(1, int(os.environ["DOCQA_THREADS"]))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(cores, round(cores - _busy_cores())))


def _busy_cores() -> float:
    """Cores other work keeps busy: the 1-minute load average, or the processes runnable right
    now (/proc/loadavg's 4th field, less this one) when higher, since the average lags a minute
    behind work that just started."""
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 0.0
    try:
        with open("/proc/loadavg") as f:
            busy = max(busy, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        pass
    return busy


def _tokenizer_of(ckpt: Checkpoint) -> Tokenizer:
    if ckpt.format == "gguf":
        return Tokenizer.from_gguf_metadata(ckpt.metadata)
    return Tokenizer.from_hf_dir(ckpt.path)


@dataclass
class Engine:
    model: torch.nn.Module
    tokenizer: Tokenizer
    checkpoint: Checkpoint
    prefill_chunk: int = 1024
    rope: Rope = field(init=False)

    def __post_init__(self):
        self.rope = Rope(self.config)

    @property
    def config(self):
        return self.checkpoint.config

    @classmethod
    def load(cls, path: str | Path | None = None, *, dtype: torch.dtype = torch.float32,
             threads: int | None = None, device: str | None = None,
             decode_weights: str = "auto") -> Engine:
        """Load a GGUF file or HF directory; None means `DOCQA_MODEL`, else the default model.
        device: "cpu", "cuda[:n]" or "auto" (None: `DOCQA_DEVICE`, else auto = CUDA when present).
        decode_weights: "auto", "q4", "bf16" or "fp32": decode-only weight copies on CPU (see
        engine/decode_weights.py); "auto" keeps a Q4_0/Q4_1 GGUF's matrices 4-bit for decode."""
        from .decode_weights import resolve_mode
        from .default_model import resolve_model_path

        where = resolve_device(device)  # before reading weights: a bad choice fails at once
        decode_weights = resolve_mode(decode_weights, where)
        torch.set_num_threads(threads or default_threads())
        model, ckpt = load_model(resolve_model_path(path), dtype=dtype, decode_weights=decode_weights)
        return cls(model.to(where), _tokenizer_of(ckpt), ckpt)

    @staticmethod
    def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
        """Only the tokenizer (with its chat template) of a checkpoint; no weights are read."""
        from .checkpoint import open_checkpoint
        from .default_model import resolve_model_path

        return _tokenizer_of(open_checkpoint(resolve_model_path(path)))

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def new_state(self, capacity: int = 1024) -> DenseKVState:
        dtype = self.model.embed_tokens.weight.dtype
        return DenseKVState(self.config, self.rope, capacity=capacity, dtype=dtype, device=self.device)

    def new_sparse_state(self, settings: EngineSettings | None = None) -> KVState:
        """The sparse three-layer state on the engine's device: the Triton kernels on CUDA where
        they serve the settings (true positions, per-head routing), else the PyTorch reference state."""
        settings = settings or EngineSettings()
        triton_serves = settings.positions == "true" and not settings.route_shared
        if self.device.type == "cuda" and triton_serves and has_triton():
            from .gpu.state import TritonKVState

            return TritonKVState(self.config, settings, self.rope, device=self.device)
        return SparseKVState(self.config, settings, self.rope, device=self.device)

    def chat_prompt(self, user: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": user}]
        text = render_chat(self.tokenizer.chat_template, messages,
                           bos_token=self.tokenizer.token_text(self.tokenizer.bos_id),
                           eos_token=self.tokenizer.token_text(self.tokenizer.eos_id))
        # The template writes BOS itself when the model wants one.
        return self.tokenizer.encode(text, add_bos=False)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *,
                 state: KVState | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, stop_ids: Sequence[int] | None = None,
                 on_token: Callable[[int, str], None] | None = None,
                 choose: Callable[[torch.Tensor, list[int]], int] | None = None,
                 on_prefill: Callable[[int, int], None] | None = None) -> GenerationResult:
        """Continue `state` (a fresh dense one if None) with `prompt`, then decode.

        choose(logits, generated_ids) -> token id, when given, replaces sampling: constrained
        decoding (pipelines/quote_constraint.py) picks each token from the model's scores itself.

        prompt: text (encoded with the model's BOS rule) or token ids. `state` may already hold a
        prefix (prefix caching): the prompt is appended after it. on_token(id, text_delta) is
        called for each generated token; text_delta may be "" while a multi-byte character is
        still incomplete. on_prefill(done, total) is called after each prefill chunk with the
        prompt tokens prefilled so far (for progress bars). Generation stops at a stop token (not
        included in the result) or after max_new_tokens.
        """
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if state is None:
            state = self.new_state(capacity=len(ids) + max_new_tokens)
        stops = set(self.tokenizer.stop_ids if stop_ids is None else stop_ids)
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(seed if seed is not None else
                                                       torch.seed() & 0xFFFFFFFF)

        greedy = temperature == 0 and choose is None  # only the argmax of each step is used
        t0 = time.perf_counter()
        logits = self.model(torch.tensor(ids, dtype=torch.long, device=self.device), state, last_only=True,
                            chunk_size=self.prefill_chunk, on_chunk=on_prefill)[-1]
        out: list[int] = []
        token = int(choose(logits, out) if choose else
                    sample(logits, temperature=temperature, top_p=top_p, generator=generator))
        t1 = time.perf_counter()

        stream = TextStream(self.tokenizer)
        reason = "length"
        while True:
            if token in stops:
                reason = "stop"
                break
            out.append(token)
            if on_token is not None:
                on_token(token, stream.push(token))
            if len(out) >= max_new_tokens:
                break
            logits = self.model(torch.tensor([token], dtype=torch.long, device=self.device), state,
                                last_only=True, argmax_only=greedy)[-1]
            token = int(choose(logits, out) if choose else
                        sample(logits, temperature=temperature, top_p=top_p, generator=generator))
        t2 = time.perf_counter()
        return GenerationResult(self.tokenizer.decode(out), out, len(ids), t1 - t0, t2 - t1, reason)


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


def benchmark(engine: Engine, prefill_lengths=(512, 2048), decode_tokens: int = 64) -> dict:
    """Prefill tok/s per prompt length, and decode tok/s after the shortest prompt."""
    out = {"prefill": {}, "decode_tok_s": None}
    for n in prefill_lengths:
        ids = torch.tensor(bench_prompt(engine.tokenizer, n), device=engine.device)
        state = engine.new_state(capacity=n + 1)
        t0 = time.perf_counter()
        engine.model(ids, state, last_only=True, chunk_size=engine.prefill_chunk)
        out["prefill"][n] = n / (time.perf_counter() - t0)
    ids = bench_prompt(engine.tokenizer, min(prefill_lengths))
    res = engine.generate(ids, decode_tokens, stop_ids=())
    out["decode_tok_s"] = res.decode_tok_s
    out["peak_rss_mib"] = peak_rss_mib()
    return out
