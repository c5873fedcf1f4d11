"""`docqa ask`: retrieve, build the context, generate, verify, store — one function.

The CLI, the review job runner and the TUI all call `ask()`; the only difference between
them is how tokens are shown (`on_token`) and which job a run belongs to.

The model is the embedded engine (a checkpoint path, `DOCQA_MODEL`, else the default model) or
an OpenAI-compatible server (`openai:http://HOST:PORT/v1#MODEL`, app/remote.py). A server
gives only text, not its logits, so quote-constrained decoding cannot run there: its answer is
free text, and the same verification and support check decide what is shown.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..pipelines.document import Document
from ..pipelines.document import Passage
from ..pipelines.answer.prompt import READ_ALL_PROMPT, document_for_model
from ..pipelines.answer.qa import Generate, answer_question, check_answer, evidence_citations
from ..pipelines.answer.quote_constraint import QuoteDecoder, QuotePlan, TokenTable
from ..pipelines.answer.retrieval import retrieve
from .errors import DocqaError
from .remote import RemoteModel, is_remote
from .runs import Run, save_run
from .store import Store


ABSTAIN_MARGIN = 0.0


@dataclass(frozen=True)
class AskSettings:
    model: str | None = None  # checkpoint path or openai:URL#MODEL; None: DOCQA_MODEL, else the default model
    evidence_only: bool = False
    passages: int = 8  # ranked passages offered to the context builder
    evidence: int = 5  # passages shown as evidence
    # Context budget: prefill dominates an answer's time on a CPU (~100-300 tokens/s with the
    # default model), so a few clauses' worth; raise it for a GPU or a longer-context model.
    budget_tokens: int = 1600
    max_tokens: int = 200
    temperature: float = 0.0
    read_all: bool = False  # the engine reads the whole document (sparse attention + prefix cache)
    # Quote-constrained answers (pipelines/quote_constraint.py): the model picks the passage and
    # the words, decoding keeps them exact quotes. Free text suits models that quote unaided;
    # the default 135M model paraphrases, so none of its free-text citations verify.
    quote: bool = True
    device: str | None = None  # cpu, cuda, cuda:N, auto; None: DOCQA_DEVICE, else auto
    # Quotes from only this many best-ranked passages (None: any passage read). Measured at 3:
    # the gold page among the answer's citations 7/18, as with None (bench/results/ask.md).
    quote_from: int | None = None
    # Abstention (bench/results/ask.md). The model quotes only when its log-odds of opening a
    # quote over "Not found in the document." exceed `abstain_margin` (0: its bare preference).
    abstain_margin: float = ABSTAIN_MARGIN
    # An answer none of whose verified quotes supports it (names the question's subject; for a
    # numeric question, holds a figure of the kind and year asked) is withheld as "not found",
    # with the evidence shown (pipelines/support.py).
    subject_check: bool = True
    # Thinking controls for reasoning models, passed to the chat template as enable_thinking /
    # reasoning_effort (engine/chat.py; None: the template's own default). A model that thinks
    # gets THINK_TOKENS more to generate, and its thinking is never part of the answer.
    thinking: bool | None = None
    reasoning_effort: str | None = None


# Tokens a reasoning model may think before it answers (its think block is closed there): on
# top of max_tokens, which stays the answer's own limit.
THINK_TOKENS = 1024

# Passages retrieved per question: the context reads the first `AskSettings.passages`, the
# evidence shows the best passage of each of the first `AskSettings.evidence` distinct pages.
EVIDENCE_POOL = 40


class Library:
    """Documents and their passages loaded from the store once per process."""

    def __init__(self, store: Store):
        self.store = store
        self._docs: dict[str, Document] = {}
        self._passages: dict[str, list[Passage]] = {}

    def load(self, refs: list[str]) -> tuple[dict[str, Document], dict[str, list[Passage]]]:
        ids = list(dict.fromkeys(self.store.resolve(r) for r in refs))
        for did in ids:
            if did not in self._docs:
                self._docs[did] = self.store.get_document(did)
                self._passages[did] = self.store.passages(did)
        return {d: self._docs[d] for d in ids}, {d: self._passages[d] for d in ids}

    def fts(self, expression: str, doc_ids: list[str], limit: int) -> list[tuple[str, int, float]]:
        hits = self.store.search("", doc_ids, limit, unit="passages", match=expression)
        return [(h.doc_id, h.index, h.bm25) for h in hits]

    def page_fts(self, expression: str, doc_ids: list[str], limit: int) -> list[tuple[str, int, float]]:
        hits = self.store.search("", doc_ids, limit, unit="pages", match=expression)
        return [(h.doc_id, h.index, h.bm25) for h in hits]


_ENGINES: dict[tuple[str | None, str | None], object] = {}


def load_engine(model: str | None, device: str | None = None):
    """The engine for a checkpoint on a device, loaded once per process."""
    from ..engine.generate import Engine

    if (model, device) not in _ENGINES:
        _ENGINES[model, device] = Engine.load(model, device=device)
    return _ENGINES[model, device]


_TOKEN_TABLES: dict[int, TokenTable] = {}


def token_table(engine) -> TokenTable:
    """The engine's vocabulary as text, built once per process."""
    if id(engine) not in _TOKEN_TABLES:
        _TOKEN_TABLES[id(engine)] = TokenTable.from_tokenizer(engine.tokenizer)
    return _TOKEN_TABLES[id(engine)]


# on_progress(step, done, total): "retrieving", "loading model", "prefilling" (prompt tokens
# done / total, after each chunk), "verifying" (generation is over); the CLI shows them.
Progress = Callable[[str, int, int], None]


def engine_generate(engine, settings: AskSettings, on_token: Callable[[str], None] | None,
                    on_progress: Progress | None = None) -> Generate:
    """The engine as a `Generate`; called with a `QuotePlan` too, it decodes under that plan."""

    def generate(messages: list[dict[str, str]], plan: QuotePlan | None = None) -> str:
        from ..engine.chat import ThinkFirst, ThinkingTracker, think_ids

        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        user = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
        ids = engine.chat_prompt(user, system=system, thinking=settings.thinking,
                                 reasoning_effort=settings.reasoning_effort)
        # A reasoning model thinks first (greedy, up to THINK_TOKENS), then answers under the
        # quote plan or freely; its think block is neither streamed as the draft nor answered with.
        thinks = think_ids(engine.tokenizer) is not None and settings.thinking is not False
        limit = settings.max_tokens + (THINK_TOKENS if thinks else 0)
        decoder = (QuoteDecoder(plan, token_table(engine), max_tokens=limit,
                                abstain_margin=settings.abstain_margin) if plan is not None else None)
        choose = decoder
        if thinks and (decoder is not None or settings.temperature == 0):
            choose = ThinkFirst(decoder or (lambda logits, _out: int(logits.argmax())), engine.tokenizer, ids,
                                budget=THINK_TOKENS)
        thinking = ThinkingTracker(engine.tokenizer, ids)
        result = engine.generate(
            ids,
            max_new_tokens=limit,
            temperature=settings.temperature,
            on_token=(lambda tok, delta: None if thinking(tok) else on_token(delta)) if on_token else None,
            choose=choose,
            on_prefill=(lambda done, total: on_progress("prefilling", done, total)) if on_progress else None,
        )
        if on_progress:
            on_progress("verifying", 0, 0)
        generate.result = result
        generate.quote_margin = decoder.quote_margin if decoder is not None else None
        return result.text

    return generate


def check_thinking(settings: AskSettings) -> None:
    """Fail at once (one line) when the model's chat template cannot honour --no-thinking /
    --reasoning-effort, before a job loads the model or answers anything; reads only the
    tokenizer."""
    if settings.thinking is None and settings.reasoning_effort is None:
        return
    spec = resolve_model(settings.model)
    if is_remote(spec):
        raise DocqaError("--no-thinking and --reasoning-effort set the embedded engine's chat template; "
                         "a model server's thinking is configured on the server")
    from ..engine.chat import check_switches, template_of
    from ..engine.generate import Engine

    check_switches(template_of(Engine.load_tokenizer(spec)), settings.thinking, settings.reasoning_effort)


def resolve_model(model: str | None) -> str | None:
    """The model asked for: `--model`, else `DOCQA_MODEL`, else None (the default model)."""
    return model or os.environ.get("DOCQA_MODEL") or None


@dataclass
class Model:
    """A model ready to answer: a `Generate`, the name runs record, and what it can do."""

    name: str
    generate: Generate
    count_tokens: Callable[[str], int] | None = None  # None: the context builder's estimate
    engine: object | None = None  # the embedded engine; None for a model server
    can_quote: bool = True  # quote-constrained decoding needs the model's logits
    server: RemoteModel | None = None  # the model server, when it is one


def open_model(settings: AskSettings, on_token: Callable[[str], None] | None = None,
               on_progress: Progress | None = None) -> Model:
    """The embedded engine or a model server, as `settings.model` (or `DOCQA_MODEL`) names it."""
    spec = resolve_model(settings.model)
    if is_remote(spec):
        check_thinking(settings)
        remote = RemoteModel.parse(spec).resolved()
        return Model(remote.name, remote_generate(remote, settings, on_token), can_quote=False, server=remote)
    engine = load_engine(spec, settings.device)
    return Model(str(engine.checkpoint.path), engine_generate(engine, settings, on_token, on_progress),
                 lambda text: len(engine.tokenizer.encode(text, add_bos=False)), engine)


def remote_generate(remote: RemoteModel, settings: AskSettings, on_token: Callable[[str], None] | None) -> Generate:
    """A model server as a `Generate`: free text, streamed to `on_token`."""

    def generate(messages: list[dict[str, str]], plan: QuotePlan | None = None) -> str:
        if plan is not None:
            raise DocqaError("a model server cannot decode under a quote plan (it sends text, not logits)")
        return remote.chat(messages, max_tokens=settings.max_tokens, temperature=settings.temperature,
                           on_token=on_token)

    return generate


_SLOT = "\u0000QUESTION\u0000"


def read_all_messages(doc: Document, question: str) -> list[dict[str, str]]:
    """The whole document, then the question last: everything before the question is the same
    for every question on the document, which is what prefix caches reuse."""
    return [{"role": "system", "content": READ_ALL_PROMPT},
            {"role": "user", "content": document_for_model(doc) + "\n\nQuestion: " + question}]


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


def read_all_answer(engine, doc: Document, question: str, settings: AskSettings,
                    on_token: Callable[[str], None] | None, on_progress: Progress | None = None) -> tuple[str, dict]:
    """Generate over the whole document with the sparse engine, reusing the document's
    cached KV: the prompt is split where the question goes, the part before it (system
    prompt + document) is the per-document prefix, and only the rest is prefilled when the
    document was read before — by this process or, through the disk tier, by another."""
    from ..engine.chat import ThinkingTracker, render_chat, template_of, think_ids

    tok = engine.tokenizer
    text = render_chat(template_of(tok), read_all_messages(doc, _SLOT), bos_token=tok.token_text(tok.bos_id),
                       eos_token=tok.token_text(tok.eos_id), enable_thinking=settings.thinking,
                       reasoning_effort=settings.reasoning_effort)
    head, tail = text.split(_SLOT)
    prefix_ids = tok.encode(head, add_bos=False)
    rest_ids = tok.encode(question + tail, add_bos=False)
    thinks = think_ids(tok) is not None and settings.thinking is not False
    thinking = ThinkingTracker(tok, prefix_ids + rest_ids)
    result, timings = engine.generate_on_document(
        doc.content_sha256, prefix_ids, rest_ids, settings.max_tokens + (THINK_TOKENS if thinks else 0),
        temperature=settings.temperature,
        on_token=(lambda t, delta: None if thinking(t) else on_token(delta)) if on_token else None,
        on_prefill=(lambda done, total: on_progress("prefilling", done, total)) if on_progress else None)
    if on_progress:
        on_progress("verifying", 0, 0)
    if result.speculative:
        timings["acceptance_length"] = result.speculative["acceptance_length"]
    return result.text, timings


def ask(
    store: Store,
    refs: list[str],
    question: str,
    settings: AskSettings = AskSettings(),
    *,
    on_token: Callable[[str], None] | None = None,
    on_progress: Progress | None = None,
    query: str | None = None,
    library: Library | None = None,
    job_id: str | None = None,
    item_id: str | None = None,
    kind: str = "ask",
) -> Run:
    """Answer `question` over the documents `refs` and store the run.

    `query`, when given, is what retrieval searches with instead of the question (a checklist
    item's question plus its hints); the model and the stored run see the question itself."""
    t0 = time.perf_counter()
    if on_progress:
        on_progress("retrieving", 0, 0)
    library = library or Library(store)
    docs, passages = library.load(refs)
    # Enough passages that the evidence can show `settings.evidence` distinct pages; the
    # context reads the first `settings.passages` of them.
    ranked = retrieve(query or question, docs, passages, fts=library.fts, page_fts=library.page_fts,
                      k=max(settings.passages, EVIDENCE_POOL))
    t1 = time.perf_counter()
    model = None
    if not settings.evidence_only:
        if on_progress:
            on_progress("loading model", 0, 0)
        model = open_model(settings, on_token, on_progress)
    generate = model.generate if model else None
    model_name = model.name if model else None
    t2 = time.perf_counter()
    kwargs = {"count_tokens": model.count_tokens} if model and model.count_tokens else {}
    if settings.read_all and model is not None:
        if len(docs) != 1:
            raise DocqaError("--read-all reads one document; ask about several without it")
        (doc,) = docs.values()
        if model.engine is None:
            raw, engine_timings = read_all_remote(model.server, doc, question, settings, on_token)
        else:
            raw, engine_timings = read_all_answer(model.engine, doc, question, settings, on_token, on_progress)
        evidence = evidence_citations(docs, ranked, settings.evidence)
        answer = check_answer(question, raw, docs, passages[doc.doc_id], evidence, withhold=settings.subject_check)
        answer.timings.update(engine_timings)
    else:
        answer = answer_question(
            question, docs, ranked, generate,
            budget_tokens=settings.budget_tokens, evidence_k=settings.evidence,
            quote=settings.quote and (model is None or model.can_quote),
            quote_from=settings.quote_from, read_k=settings.passages, support_check=settings.subject_check, **kwargs,
        )
    timings = dict(answer.timings, retrieve_s=t1 - t0, load_model_s=t2 - t1)
    result = getattr(generate, "result", None)
    if result is not None and not settings.read_all:
        timings.update(prefill_s=result.prefill_s, decode_s=result.decode_s,
                       prompt_tokens=float(result.prompt_tokens), generated_tokens=float(len(result.token_ids)))
        if result.speculative:  # MTP drafts ran (a free-text answer of a checkpoint with an MTP layer)
            timings["acceptance_length"] = result.speculative["acceptance_length"]
        margin = getattr(generate, "quote_margin", None)
        if margin is not None and math.isfinite(margin):  # kept for audit and for tuning the rule
            timings["quote_margin"] = margin
    timings["total_s"] = time.perf_counter() - t0
    answer = answer.model_copy(update={"timings": timings})
    return save_run(
        store, answer, doc_ids=list(docs), model=model_name, settings=asdict(settings),
        kind=kind, job_id=job_id, item_id=item_id,
    )
