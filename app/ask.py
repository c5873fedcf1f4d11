"""`docqa ask`: retrieve, build the context, generate, verify, store — one function.

The CLI, the review job runner and the TUI all call `ask()`; the only difference between
them is how tokens are shown (`on_token`) and which job a run belongs to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..pipelines.document import Document
from ..pipelines.passages import Passage
from ..pipelines.qa import Answer, Generate, answer_question
from ..pipelines.retrieval import retrieve
from .runs import Run, save_run
from .store import Store


@dataclass(frozen=True)
class AskSettings:
    model: str | None = None  # checkpoint path; None: DOCQA_MODEL, else the default model
    evidence_only: bool = False
    passages: int = 8  # ranked passages offered to the context builder
    evidence: int = 5  # passages shown as evidence
    budget_tokens: int = 3000  # context budget (the default model was trained on 8K)
    max_tokens: int = 200
    temperature: float = 0.0


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


_ENGINES: dict[str | None, object] = {}


def load_engine(model: str | None):
    """The engine for a checkpoint, loaded once per process."""
    from ..engine.generate import Engine

    if model not in _ENGINES:
        _ENGINES[model] = Engine.load(model)
    return _ENGINES[model]


def engine_generate(engine, settings: AskSettings, on_token: Callable[[str], None] | None) -> Generate:
    def generate(messages: list[dict[str, str]]) -> str:
        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        user = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
        ids = engine.chat_prompt(user, system=system)
        result = engine.generate(
            ids,
            max_new_tokens=settings.max_tokens,
            temperature=settings.temperature,
            on_token=(lambda _id, delta: on_token(delta)) if on_token else None,
        )
        generate.result = result
        return result.text

    return generate


def ask(
    store: Store,
    refs: list[str],
    question: str,
    settings: AskSettings = AskSettings(),
    *,
    on_token: Callable[[str], None] | None = None,
    library: Library | None = None,
    job_id: str | None = None,
    item_id: str | None = None,
    kind: str = "ask",
) -> Run:
    """Answer `question` over the documents `refs` and store the run."""
    t0 = time.perf_counter()
    library = library or Library(store)
    docs, passages = library.load(refs)
    ranked = retrieve(question, docs, passages, fts=library.fts, k=settings.passages)
    t1 = time.perf_counter()
    generate = None
    model_name = None
    count_tokens = None
    if not settings.evidence_only:
        engine = load_engine(settings.model)
        model_name = str(engine.checkpoint.path) if hasattr(engine.checkpoint, "path") else settings.model
        generate = engine_generate(engine, settings, on_token)
        count_tokens = lambda text: len(engine.tokenizer.encode(text, add_bos=False))  # noqa: E731
    t2 = time.perf_counter()
    kwargs = {"count_tokens": count_tokens} if count_tokens else {}
    answer: Answer = answer_question(
        question, docs, ranked, generate,
        budget_tokens=settings.budget_tokens, evidence_k=settings.evidence, **kwargs,
    )
    timings = dict(answer.timings, retrieve_s=t1 - t0, load_model_s=t2 - t1)
    result = getattr(generate, "result", None)
    if result is not None:
        timings.update(prefill_s=result.prefill_s, decode_s=result.decode_s,
                       prompt_tokens=float(result.prompt_tokens), generated_tokens=float(len(result.token_ids)))
    timings["total_s"] = time.perf_counter() - t0
    answer = answer.model_copy(update={"timings": timings})
    return save_run(
        store, answer, doc_ids=list(docs), model=model_name, settings=asdict(settings),
        kind=kind, job_id=job_id, item_id=item_id,
    )
