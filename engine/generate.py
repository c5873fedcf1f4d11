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
from .chat import render_chat, split_thinking, template_of
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
    thinking: str = ""  # a reasoning model's <think> text, kept out of `text` (engine/chat.py)
    # MTP speculative decoding (engine/models/mtp.py), when it ran: main-model verify forwards,
    # drafts accepted, and the acceptance length (tokens per verify forward, 1.0-2.0)
    speculative: dict | None = None

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
    from .settings import env_threads

    if env_threads() is not None:
        return env_threads()
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


KERNELS = ("auto", "torch", "triton")
TRITON_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "glm4", "glm4_moe")  # what engine/gpu/model.py's decoder runs
GLM_CUDA_ARCHS = ("glm4_moe_lite", "glm_moe_dsa")  # engine/gpu/glm.py's decoder (bf16/fp32 or FP8 weights)
GREEDY_SYNC_EVERY = 16  # greedy CUDA decode reads its tokens back every this many steps
# The Triton decoder's reusable dense state holds at least this many tokens: an `ask` prompt
# (~4K tokens of passages) and its answer, so one state and one captured decode graph serve
# every question of a process.
SCRATCH_TOKENS = 8192
# The KV pool of batched requests (engine/batch.py) on a GPU takes at most this much, and at
# most half of what is free beside the weights: the long-document states need room too.
BATCH_POOL_BYTES = 16 * 2**30
BATCH_POOL_TOKENS_CPU = 16384  # under the Triton interpreter (tests)


@dataclass
class Engine:
    """A loaded model + tokenizer, and the prefill/decode loop, on one device.

    `model` is the PyTorch decoder (engine/models/llama.py) on the CPU and the Triton decoder
    (engine/gpu/model.py `CudaDecoder`) on CUDA; `new_state` gives the KV state that fits it,
    and everything else (generate, the prefix cache, the bench) goes through those two."""

    model: object
    tokenizer: Tokenizer
    checkpoint: Checkpoint
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    prefill_chunk: int = 1024
    # Greedy decoding drafts with the checkpoint's MTP layer when it has one (same tokens, fewer
    # main-model forwards); False decodes one token per forward. None: on for the PyTorch model,
    # off on the Triton decoders, where plain greedy replays one CUDA graph per token and a verify
    # step runs eagerly: on the H200 one cost 10-17 graphed steps (bench/results/gpu_mtp.md)
    speculative: bool | None = None
    rope: Rope = field(init=False)
    _prefix_cache: object = field(default=None, init=False, repr=False)
    _scratch: object = field(default=None, init=False, repr=False)  # see `_dense_state`
    _mtp: object = field(default=None, init=False, repr=False)
    _batch: object = field(default=None, init=False, repr=False)  # see `batch_session`
    warm_up_s: float = field(default=0.0, init=False)  # what `warm_up` took (part of loading)

    def __post_init__(self):
        self.rope = Rope(self.config)

    @property
    def config(self):
        return self.checkpoint.config

    @property
    def triton(self) -> bool:
        """True when the model is the Triton decoder (CUDA, or CPU tensors under TRITON_INTERPRET)."""
        return not isinstance(self.model, torch.nn.Module)

    @classmethod
    def load(cls, path: str | Path | None = None, *, dtype: torch.dtype | None = None,
             threads: int | None = None, device: str | None = None,
             decode_weights: str = "auto", kernels: str = "auto",
             prefetch: Callable[[Tokenizer], tuple[str, Sequence[int], int] | None] | None = None) -> Engine:
        """Load a GGUF file or HF directory; None means `DOCQA_MODEL`, else the default model.
        device: "cpu", "cuda[:n]" or "auto" (None: `DOCQA_DEVICE`, else auto = CUDA when present).
        dtype: None = bfloat16 on CUDA, float32 on the CPU (faster there, and the reference).
        decode_weights: "auto" or "fp32": on the CPU "auto" keeps a GGUF's quantised matrices as
        stored and computes on them, "fp32" dequantises them (engine/gguf_weights.py).
        kernels: "auto" (Triton on CUDA, PyTorch on the CPU), or "triton" on CPU tensors under
        TRITON_INTERPRET=1 (how the tests check the CUDA path without a GPU).
        prefetch: given the tokenizer, the (document key, prefix ids, capacity) of the document
        a `generate_on_document` will come for (`ask --read-all`), or None. On the Triton
        decoder the prefix cache reads that document's cached KV into a new state while the
        weights load, so a new process pays for the read only where it outlasts the loading."""
        from .checkpoint import open_checkpoint
        from .gguf_weights import resolve_mode
        from .default_model import resolve_model_path

        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, not {kernels!r}")
        where = resolve_device(device)  # before reading weights: a bad choice fails at once
        use_triton = kernels == "triton" or (kernels == "auto" and where.type == "cuda")
        glm = False
        if use_triton:
            ckpt = open_checkpoint(resolve_model_path(path))
            # GLM's MLA models run engine/gpu/glm.py's decoder, the Llama family engine/gpu/model.py's
            # (FP8 checkpoints too: their matrices stay e4m3 on the device); Gemma runs its PyTorch
            # model on the device (not wired in yet)
            glm = ckpt.config.arch in GLM_CUDA_ARCHS and has_triton()
            use_triton = glm or ckpt.config.arch in TRITON_ARCHS
        if use_triton:
            if not has_triton():
                raise RuntimeError("the CUDA path needs triton: pip install 'docqa[gpu]'")
            from .gpu.glm import GlmCudaDecoder
            from .gpu.model import CudaDecoder, CudaWeights

            dtype = dtype or (torch.bfloat16 if where.type == "cuda" else torch.float32)
            tokenizer = _tokenizer_of(ckpt)
            document = prefetch(tokenizer) if prefetch else None
            cache = _prefetching_cache(ckpt, dtype, where, document) if document else None
            model = (GlmCudaDecoder(ckpt.config, ckpt.tensors(dtype, where)) if glm else
                     CudaDecoder(ckpt.config, CudaWeights(ckpt.config, ckpt.tensors(dtype, where))))
            engine = cls(model, tokenizer, ckpt, where)
            engine._prefix_cache = cache
            if where.type == "cuda":
                engine.warm_up()
            return engine
        decode_weights = resolve_mode(decode_weights, where)
        torch.set_num_threads(threads or default_threads())
        model, ckpt = load_model(resolve_model_path(path), dtype=dtype or torch.float32, decode_weights=decode_weights)
        return cls(model.to(where), _tokenizer_of(ckpt), ckpt, where)

    @staticmethod
    def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
        """Only the tokenizer (with its chat template) of a checkpoint; no weights are read."""
        from .checkpoint import open_checkpoint
        from .default_model import resolve_model_path

        return _tokenizer_of(open_checkpoint(resolve_model_path(path)))

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype if self.triton else self.model.norm.weight.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dense KV cache's dtype: fp16 where the model computes on GGUF blocks on the CPU (as
        llama.cpp's cache: half the memory, and half the bytes a decode step's attention reads,
        which bounds it; engine/dense.py), else the weights' dtype."""
        if not self.triton and getattr(self.model, "decode_weights", {}).get("mode") == "gguf":
            return torch.float16
        return self.dtype

    # --- states ---------------------------------------------------------------------------------
    def sparse_settings(self, **overrides) -> EngineSettings:
        """The sparse (read-the-whole-document) settings this engine runs: on the Triton decoder
        keys are stored rotated at their true positions in the weights' dtype, and prefill runs
        in 4096-token chunks (the kernels' measured best on the H200)."""
        return _sparse_settings(self.dtype, **overrides) if self.triton else EngineSettings(**overrides)

    @staticmethod
    def document_capacity(prefix_tokens: int, rest_tokens: int, max_new_tokens: int) -> int:
        """The tokens a `generate_on_document` state holds in all."""
        return prefix_tokens + rest_tokens + max_new_tokens + GREEDY_SYNC_EVERY

    def new_state(self, capacity: int = 1024, settings: EngineSettings | None = None) -> KVState:
        """A KV state for this engine's model: dense (exact attention over everything) when
        `settings` is None, else under `settings` (sparse: sinks + routed blocks + window)."""
        if self.triton:
            from .gpu.state import new_cuda_state

            if settings is None:
                settings = self.sparse_settings(attention="dense")
            elif settings.attention == "sparse" and settings.positions != "true":
                raise ValueError(f"the Triton decoder stores keys at their true positions, not {settings.positions!r}")
            if hasattr(self.model, "new_state"):  # GLM (engine/gpu/glm.py): its own latent state
                return self.model.new_state(capacity, settings)
            return new_cuda_state(self.config, settings, capacity, self.device)
        if hasattr(self.model, "new_state"):
            # GLM: MLA latents or partial-RoPE dense K/V when dense; GLM-5 routes with its own
            # indexer (engine/mla_state.py) and Gemma 3's own state keeps its sliding windows (the
            # sparse states do not know them)
            if settings is None:
                return self.model.new_state(capacity, dtype=self.dtype, device=self.device)
            if self.config.dsa is not None or self.config.arch == "gemma3":
                return self.model.new_state(dtype=self.dtype, device=self.device)
        if settings is None:
            return DenseKVState(self.config, self.rope, capacity=capacity, dtype=self.kv_dtype, device=self.device)
        if self.config.mla is not None:  # MLA: latents (+ indexer keys) in the segmented cache
            from .mla_state import MLAKVState

            return MLAKVState(self.config, self.rope, settings=settings, device=self.device)
        return SparseKVState(self.config, settings, self.rope, device=self.device)

    def _dense_state(self, capacity: int) -> KVState:
        """The state of a `generate` given none: dense. The Triton decoder keeps one and reuses it
        (truncated) while it is big enough, and with it its captured decode graph: capturing
        costs ~25 ms per state, which over a 64-token answer was 0.4 ms a token."""
        if not self.triton:
            return self.new_state(capacity)
        state = self._scratch
        if state is None or state.capacity < capacity:
            self._scratch = state = None  # the old one's memory goes back before the new one is made
            state = self._scratch = self.new_state(max(capacity, SCRATCH_TOKENS))
        else:
            state.truncate(0)
        return state

    def warm_up(self) -> None:
        """Run every kind of step the product's paths launch once (~0.5 s on an H200): a new
        process otherwise pays for loading the Triton kernels, first cuBLAS calls and memory
        pool growth (and, where Triton's cache lacks them, compiling kernel variants) inside its
        first prefill — a second and more of a `--read-all` document's. Also captures the dense
        state's decode graph (see `_dense_state`). Odd lengths too: some kernels specialise on
        whether a length is a multiple of 16."""
        t0 = time.perf_counter()
        from .benchmark import bench_prompt

        ids = bench_prompt(self.tokenizer, 301)
        self.generate(ids[:301], 2, stop_ids=())  # dense prefill + decode (the graph is captured)
        self.generate(ids[:300], 2, stop_ids=())
        settings = self.sparse_settings()
        # sparse prefill: two full chunks (the first routes past the window; GEMMs and attention
        # tiles at full size), then a long odd one (a document's last chunk: full-size tiles,
        # a length no multiple of 16) and a short odd one at offsets, then decode (its graph
        # belongs to this throwaway state)
        ids = bench_prompt(self.tokenizer, 2 * settings.chunk_size + 1537 + 77 + 19)
        state = self.new_state(len(ids) + 8, settings)
        self.prefill(ids[:2 * settings.chunk_size], state)
        self.prefill(ids[2 * settings.chunk_size:-96], state)
        self.prefill(ids[-96:-19], state)
        # a question's length: a few queries routed apart from the last route_tail (their own tiles)
        self.generate(ids[-19:], 2, state=state, stop_ids=())
        del state
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warm_up_s = time.perf_counter() - t0

    def batch_session(self):
        """The engine's session for many requests at once (engine/batch.py), made on first use:
        continuous batching over a paged KV pool on the Triton Llama-family decoder, one request
        after another elsewhere."""
        if self._batch is None:
            from .batch import BatchSession, SequentialSession
            from .gpu.model import CudaDecoder

            if not isinstance(self.model, CudaDecoder):
                self._batch = SequentialSession(self)
            else:
                from .gpu.paged import kv_bytes_per_token
                from .gpu.state import RESERVE_BYTES

                tokens = BATCH_POOL_TOKENS_CPU
                if self.device.type == "cuda":
                    free, _ = torch.cuda.mem_get_info(self.device)
                    room = min(BATCH_POOL_BYTES, max(0, free - RESERVE_BYTES) // 2)
                    tokens = room // kv_bytes_per_token(self.config, self.dtype)
                self._batch = BatchSession(self, pool_tokens=tokens)
        return self._batch

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 256, *,
                       stop_ids: Sequence[int] | None = None, temperature: float = 0.0, top_p: float = 1.0,
                       seed: int | None = None,
                       choose: Sequence[Callable[[torch.Tensor, list[int]], int] | None] | None = None,
                       on_token: Sequence[Callable[[int, str], None] | None] | None = None) -> list[GenerationResult]:
        """`generate` for every prompt, run together (`batch_session`); one result per prompt, in
        order, each what `generate` gives that prompt alone (greedy: the same tokens). `choose`
        and `on_token`: one per prompt (or None)."""
        session = self.batch_session()
        n = len(prompts)
        choose, on_token = choose or [None] * n, on_token or [None] * n
        requests = [session.add(self.tokenizer.encode(p) if isinstance(p, str) else list(p), max_new_tokens,
                                stop_ids=stop_ids, temperature=temperature, top_p=top_p, seed=seed, choose=c,
                                on_token=t)
                    for p, c, t in zip(prompts, choose, on_token)]
        while not all(r.done for r in requests):
            session.step()
        return [r.result for r in requests]

    @property
    def prefix_cache(self):
        """This engine's per-document prefix cache (engine/prefix_cache.py), made on first use."""
        if self._prefix_cache is None:
            from .prefix_cache import PrefixCache

            self._prefix_cache = PrefixCache.for_engine(self)
        return self._prefix_cache

    def chat_prompt(self, user: str, system: str | None = None, *, thinking: bool | None = None,
                    reasoning_effort: str | None = None) -> list[int]:
        """thinking / reasoning_effort go to the template as enable_thinking / reasoning_effort
        (None: the template's own default)."""
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": user}]
        text = render_chat(template_of(self.tokenizer), messages,
                           bos_token=self.tokenizer.token_text(self.tokenizer.bos_id),
                           eos_token=self.tokenizer.token_text(self.tokenizer.eos_id),
                           enable_thinking=thinking, reasoning_effort=reasoning_effort)
        # The template writes BOS itself when the model wants one.
        return self.tokenizer.encode(text, add_bos=False)

    # --- forward passes -----------------------------------------------------------------------
    def prefill(self, ids: Sequence[int] | torch.Tensor, state: KVState, *,
                on_chunk: Callable[[int, int], None] | None = None, all_logits: bool = False) -> torch.Tensor:
        """Append `ids` to `state`; fp32 logits of the last token [V] (of every token [T, V] with
        all_logits)."""
        ids = torch.as_tensor(ids, dtype=torch.long).to(self.device)
        if not self.triton:
            out = self.model(ids, state, last_only=not all_logits, chunk_size=self.prefill_chunk, on_chunk=on_chunk)
            return out.float() if all_logits else out[-1].float()
        n = state.num_tokens
        if hasattr(state, "reserve"):
            state.reserve(n + ids.shape[0])
        out = self.model.prefill(ids, state, n, all_logits=all_logits, on_chunk=on_chunk)
        state.commit(ids.shape[0])
        return out if all_logits else out[-1]

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
            state = self._dense_state(len(ids) + max_new_tokens + GREEDY_SYNC_EVERY + 1)
        stops = set(self.tokenizer.stop_ids if stop_ids is None else stop_ids)
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(seed if seed is not None else
                                                       torch.seed() & 0xFFFFFFFF)
        pick = (lambda logits, out: int(choose(logits, out))) if choose else \
            (lambda logits, out: int(sample(logits, temperature=temperature, top_p=top_p, generator=generator)))

        if temperature == 0 and choose is None and self.mtp_layer is not None and self._verifies_exactly(state):
            return self._generate_speculative(ids, max_new_tokens, state, stops, on_token, on_prefill)
        t0 = time.perf_counter()
        if self.triton and hasattr(state, "reserve"):
            state.reserve(state.num_tokens + len(ids) + max_new_tokens + GREEDY_SYNC_EVERY)
        logits = self.prefill(ids, state, on_chunk=on_prefill)
        token = pick(logits, [])
        t1 = time.perf_counter()
        stream = TextStream(self.tokenizer)
        emit = (lambda tok: on_token(tok, stream.push(tok))) if on_token is not None else None
        take = _Output(max_new_tokens, stops, emit)
        greedy = temperature == 0 and choose is None  # only the argmax of each step is used
        if self.triton:
            self._decode_triton(state, token, take, None if greedy else pick, guess=choose is not None)
        else:
            self._decode_torch(state, token, take, pick, greedy)
        out, reason = take.out, take.reason
        t2 = time.perf_counter()
        thinking, text = split_thinking(out, self.tokenizer)
        return GenerationResult(text, out, len(ids), t1 - t0, t2 - t1, reason, thinking)

    @property
    def mtp_layer(self):
        """The checkpoint's MTP layer (GLM-4.5+/GLM-5), built on first use; None without one or
        with `speculative` off (None: off on the Triton decoders)."""
        if not (self.speculative if self.speculative is not None else not self.triton):
            return None
        if self._mtp is None and getattr(self.model, "mtp_weights", None):
            from .models.mtp import MTPLayer

            if self.triton:  # the PyTorch layer on the decoder's device, sharing its embedding
                from ..kernels.linear.naive_fp8 import plain

                w = getattr(self.model, "w", self.model)  # CudaDecoder keeps its tensors in CudaWeights
                self._mtp = MTPLayer.from_weights(self.config, self.model.mtp_weights, w.embed,
                                                  plain(w.lm_head, self.dtype))
                # the layer holds what it runs (experts stacked): no second copy on the GPU
                self.model.mtp_weights.clear()
            else:
                self._mtp = MTPLayer.from_model(self.model)
        return self._mtp

    def _verifies_exactly(self, state) -> bool:
        """Whether a verify forward of [token, draft] attends as two decode steps would, so the
        kept tokens are plain greedy decoding's. The routed states (SparseKVState on the CPU, the
        Triton decoders' sparse states) route a forward's queries per routing chunk, so the token
        and its draft share one choice of blocks where two decode steps choose one each (on the
        CPU that changed a tiny GLM-4.5's tokens from the third on). Each state says so in its
        `routed`; the others (dense states, the CPU's MLA latents attended whole, GLM-5's indexer
        choosing per query) have none or False."""
        return not getattr(state, "routed", False)

    def _hidden_forward(self, ids: torch.Tensor, state, *, last_only: bool = False, chunk_size: int | None = None,
                        on_chunk=None, return_hidden: bool = True):
        """The Triton decoders called as `GlmModel` is by speculative decoding (engine/models/mtp.py):
        append ids to state -> (logits of the last or every row, normed hidden states of every row).
        Chunks are the state's (its settings'), as in `prefill`."""
        n = state.num_tokens
        if hasattr(state, "reserve"):
            state.reserve(n + ids.shape[0])
        out = self.model.prefill(ids, state, n, all_logits=not last_only, on_chunk=on_chunk, return_hidden=True)
        state.commit(ids.shape[0])
        return out

    def _generate_speculative(self, ids, max_new_tokens, state, stops, on_token, on_prefill) -> GenerationResult:
        """Greedy generation with MTP drafts verified by the main model (engine/models/mtp.py):
        the same tokens as one token per forward."""
        from .models.mtp import speculative_decode

        stream = TextStream(self.tokenizer)
        take = _Output(max_new_tokens, stops, (lambda tok: on_token(tok, stream.push(tok))) if on_token else None)
        t0 = time.perf_counter()
        first = {}

        def chunk(done, total):  # prefill ends with the last chunk: the decode time starts there
            first["t"] = time.perf_counter()
            if on_prefill is not None:
                on_prefill(done, total)

        steps, drafted, accepted = speculative_decode(
            self._hidden_forward if self.triton else self.model, state,
            torch.tensor(ids, dtype=torch.long, device=self.device), take, mtp=self.mtp_layer, out=take.out, chunk_size=self.prefill_chunk, on_chunk=chunk)
        t2 = time.perf_counter()
        t1 = first.get("t", t0)
        thinking, text = split_thinking(take.out, self.tokenizer)
        spec = {"steps": steps, "drafted": drafted, "accepted": accepted,
                "acceptance_length": (steps + accepted) / steps if steps else 0.0}
        return GenerationResult(text, take.out, len(ids), t1 - t0, t2 - t1, take.reason, thinking, spec)

    def generate_on_document(self, doc_key: str, prefix_ids: Sequence[int], rest_ids: Sequence[int],
                             max_new_tokens: int = 256, *, temperature: float = 0.0,
                             on_token: Callable[[int, str], None] | None = None,
                             on_prefill: Callable[[int, int], None] | None = None) -> tuple[GenerationResult, dict]:
        """Generate after a per-document prefix (system prompt + document) that the prefix cache
        keeps: only what it does not hold is prefilled (nothing of the document when this or
        another process read it before), then `rest_ids` (the question). Returns the result and
        timings (tokens cached and prefilled, seconds of each step)."""
        cache = self.prefix_cache
        t0 = time.perf_counter()
        need = self.document_capacity(len(prefix_ids), len(rest_ids), max_new_tokens)
        state, cached = cache.get_state(doc_key, prefix_ids, capacity=need)
        t_cache = time.perf_counter()
        doc_part = len(prefix_ids) - cached
        total = doc_part + len(rest_ids)  # progress counts the document's part and the question's as one
        if doc_part:
            self.prefill(prefix_ids[cached:], state,
                         on_chunk=(lambda done, _: on_prefill(done, total)) if on_prefill else None)
        t1 = time.perf_counter()
        result = self.generate(rest_ids, max_new_tokens, state=state, temperature=temperature, on_token=on_token,
                               on_prefill=(lambda done, _: on_prefill(doc_part + done, total)) if on_prefill else None)
        t2 = time.perf_counter()
        saved = cache.save(doc_key, prefix_ids, state)  # after the answer, which the user sees first
        timings = {
            "prefix_tokens": float(len(prefix_ids)), "cached_tokens": float(cached),
            "prefilled_tokens": float(len(prefix_ids) - cached + len(rest_ids)),
            "cache_load_s": t_cache - t0, "document_prefill_s": t1 - t0, "prefill_s": result.prefill_s,
            "decode_s": result.decode_s,
            "first_token_s": t1 - t0 + result.prefill_s, "generated_tokens": float(len(result.token_ids)),
            "cache_save_s": time.perf_counter() - t2, "segments_saved": float(saved),
        }
        if cache.reader is not None and cached and cache.reader.stats["bytes"]:  # segments came from files
            st = cache.reader.stats
            timings.update(cache_read_GiB=st["bytes"] / 2**30, cache_read_s=st["read_s"], cache_check_s=st["check_s"])
        return result, timings

    def _decode_torch(self, state, token, take: "_Output", pick, greedy: bool) -> None:
        while not take(token):
            logits = self.model(torch.tensor([token], dtype=torch.long, device=self.device), state,
                                last_only=True, argmax_only=greedy)[-1]
            token = pick(logits, take.out)

    def _decode_triton(self, state, token, take: "_Output", pick, *, guess: bool = False) -> None:
        """The CUDA-graphed decode step (eager under the interpreter). Greedy decoding keeps the
        tokens on the device and reads them back every GREEDY_SYNC_EVERY steps (the steps after a
        stop token are computed and dropped); a chooser or sampler reads each step's logits.
        `guess` (a chooser on a dense state): see `_decode_guessing`."""
        n0 = state.num_tokens
        if take(token):  # nothing to decode: no graph to capture
            return
        if state.table is not None:  # tiered: the rows this decode appends to are mapped on the GPU
            state.prepare(n0, min(n0 + take.max_new + GREEDY_SYNC_EVERY, state.capacity))
        g = state.decode_graph
        if g is None:
            g = state.decode_graph = (self.model.capture_decode(state) if hasattr(self.model, "capture_decode")
                                      else _capture_decode(self.model, state))
        g.reset(n0, token)
        if pick is None:
            buf = torch.empty(GREEDY_SYNC_EVERY, dtype=torch.long, device=self.device)
            done = False
            while not done:
                steps = min(GREEDY_SYNC_EVERY, take.max_new - len(take.out))
                with torch.inference_mode():
                    for i in range(steps):
                        g.step()
                        buf[i].copy_(g.tok[0])
                done = any(take(tok) for tok in buf[:steps].tolist())
        elif guess and state.settings.attention == "dense":
            self._decode_guessing(g, take, pick)
        else:
            while True:
                g.step()
                token = pick(g.logits[0].float().clone(), take.out)  # the buffer is the next step's too
                g.tok.fill_(token)
                if take(token):
                    break
        # every token fed to the model holds KV: all of `out` after a stop, all but the last otherwise
        state.num_tokens = n0 + (len(take.out) if take.reason == "stop" else len(take.out) - 1)


    def _decode_guessing(self, g, take: "_Output", pick) -> None:
        """Chosen tokens (quote-constrained decoding) without the GPU idling while the host
        chooses: each step's logits go to host memory, the next step starts at once on the
        model's own greedy token, and the chooser runs meanwhile. When it chooses that token
        (a model quoting its source mostly does) the next step is already done; otherwise the
        position is stepped again with the chosen token, overwriting the guessed one's K/V row
        (dense states only: a sparse state's block descriptors would keep the guessed key)."""
        cuda = g.logits.device.type == "cuda"
        host = torch.empty(g.logits.shape[-1], dtype=torch.float32, pin_memory=cuda)
        ready = torch.cuda.Event() if cuda else None
        g.step()
        while True:
            host.copy_(g.logits[0], non_blocking=cuda)
            if ready is not None:
                ready.record()
            g.step()  # on the device's greedy token: the chooser's likely pick
            if ready is not None:
                ready.synchronize()  # this step's logits are in; the guessed step runs on
            greedy = int(host.argmax())  # ties: the first index, as the device's argmax
            token = pick(host.clone(), take.out)  # the buffer is the next step's too
            if take(token):
                break
            if token != greedy:  # a wrong guess: the same position again with the chosen token
                g.pos.sub_(1)
                g.tok.fill_(token)
                g.step()


def _sparse_settings(dtype: torch.dtype, **overrides) -> EngineSettings:
    kv = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
    base = dict(positions="true", kv_dtype=kv, chunk_size=4096)
    return EngineSettings(**{**base, **overrides})


def _prefetching_cache(ckpt: Checkpoint, dtype: torch.dtype, device: torch.device, document):
    """The prefix cache of a Triton-decoder engine still loading, with `document`'s cached KV
    being read into a new state meanwhile (`PrefixCache.prefetch`). That state may take only
    the GPU memory the weights will leave: the state factory's own estimate would count the
    memory they are about to fill as free."""
    from .gpu.glm import GlmCudaState
    from .gpu.state import RESERVE_BYTES, new_cuda_state
    from .prefix_cache import PrefixCache

    settings = _sparse_settings(dtype)
    config = ckpt.config
    if config.arch in GLM_CUDA_ARCHS:  # MLA latents: one state on the GPU, no tiered form
        def make(cap, budget=None):
            return GlmCudaState(config, settings, cap, device)
    else:
        def make(cap, budget=None):
            return new_cuda_state(config, settings, cap, device, gpu_kv_bytes=budget)
    budget = None
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # the weights, and a tenth more for what the decoder builds from them (fused QKV)
        budget = max(0, free - RESERVE_BYTES - int(1.1 * ckpt.parameter_count() * dtype.itemsize))
    cache = PrefixCache.for_checkpoint(ckpt, settings, make, triton=True, device=device)
    doc_key, prefix_ids, capacity = document
    cache.prefetch(doc_key, prefix_ids, capacity, new_state=lambda cap: make(cap, budget))
    return cache


class _Output:
    """The generated tokens as they are accepted: a stop token ends generation (and is not
    kept), so does the max_new-th token. Calling it with a token says whether generation is over."""

    def __init__(self, max_new: int, stops: set[int], emit):
        self.max_new, self.stops, self.emit = max_new, stops, emit
        self.out: list[int] = []
        self.reason: str | None = None

    def __call__(self, token: int) -> bool:
        if self.reason is not None:
            return True
        if token in self.stops:
            self.reason = "stop"
            return True
        self.out.append(token)
        if self.emit:
            self.emit(token)
        if len(self.out) >= self.max_new:
            self.reason = "length"
        return self.reason is not None


def _capture_decode(decoder, state):
    """The state's decode graph. Capturing runs the step (warm-up, then the capture itself) at
    position state.num_tokens with a dummy token, which folds that token's key into the open
    block's descriptors and key sum: they are restored after, so the first real step sees the
    block as the prefill left it."""
    from .gpu.model import GraphedDecode

    blk = state.num_tokens // state.settings.block_size
    saved = [t[:, blk].clone() for t in (state.kmin, state.kmax, state.kmean)] + [state.ksum.clone()]
    g = GraphedDecode(decoder, state, state.num_tokens)
    for t, keep in zip((state.kmin, state.kmax, state.kmean), saved):
        t[:, blk] = keep
    state.ksum.copy_(saved[3])
    return g
