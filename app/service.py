"""The library service: `ask` a question of stored documents, on a `Runtime`.

A `Runtime` is what answering runs on — the store and its documents (loaded once), and the
engines loaded so far with their token tables and prefix caches — made once per process (a
CLI command, a review worker, a chat session) and passed explicitly to `ask`, review items
and map-reduce. Nothing here is cached at module level.

`ask()`: retrieve, build the context, generate, verify, store — one function. The CLI, the
review job runner and the TUI all call it; the only difference between them is how tokens
are shown (`on_token`) and which job a run belongs to. The model is the embedded engine (a
checkpoint path, `DOCQA_MODEL`, else the default model) or an OpenAI-compatible server
(app/models.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np

from ..pipelines.document import Document, Encoder, Passage
from ..pipelines.answer.qa import answer_question, answer_read_all
from ..pipelines.answer.retrieval import Dense, retrieve
from . import config
from .config import AskSettings
from .errors import DocqaError
from .models import (EngineGenerate, LoadedEngine, Model, Progress, ReadAllPrompt, check_thinking, read_all_engine,
                     read_all_remote, remote_generate)
from .remote import RemoteModel, is_remote
from .runs import Run, save_run
from .store import Store


# Passages retrieved per question: the context reads the first `AskSettings.passages`, the
# evidence shows the best passage of each of the first `AskSettings.evidence` distinct pages.
EVIDENCE_POOL = 40


class Library:
    """Documents, their passages and passage vectors loaded from the store once per process,
    and retrieval over them as `docqa ask` runs it (`retrieve`)."""

    def __init__(self, store: Store):
        self.store = store
        self._docs: dict[str, Document] = {}
        self._passages: dict[str, list[Passage]] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._question_encoder: Encoder | None = None
        self._passage_encoder: Encoder | None = None  # loaded only for a document without vectors
        self._no_encoder = False  # the MiniLM package is not installed: lexical search only

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

    def dense(self, doc_ids: list[str], on_progress: Progress | None = None) -> Dense | None:
        """Dense retrieval's inputs for loaded documents: their stored passage vectors and the
        question encoder (numpy: no torch for an evidence-only question). A document stored
        without vectors, or with another encoder's, gets them now, once (the torch encoder;
        `on_progress("encoding passages", done, total)`). None without the MiniLM package."""
        from ..engine.config import CheckpointError
        from ..engine.models.bert_numpy import load_question_encoder
        from ..pipelines.ingest.passages import vectors_name

        if self._question_encoder is None and not self._no_encoder:
            try:
                self._question_encoder = load_question_encoder()
            except CheckpointError:  # the MiniLM package is not installed
                self._no_encoder = True
        if self._question_encoder is None:
            return None
        name = vectors_name(self._question_encoder)
        for did in doc_ids:
            if did not in self._vectors:
                stored = self.store.passage_vectors(did)
                if stored is None or stored.name != name:
                    stored = self._make_vectors(did, on_progress)
                self._vectors[did] = stored.matrix
        return Dense({d: self._vectors[d] for d in doc_ids}, self._question_encoder)

    def _make_vectors(self, doc_id: str, on_progress: Progress | None):
        from ..pipelines.ingest.passages import passage_titles, passage_vectors
        from .ingest import PassageEncoder

        if self._passage_encoder is None:
            self._passage_encoder = PassageEncoder()
        passages = self._passages[doc_id]
        report = (lambda done, total: on_progress("encoding passages", done, total)) if on_progress else None
        vectors = passage_vectors(passages, passage_titles(self._docs[doc_id].sections, passages),
                                  self._passage_encoder, report)
        self.store.set_passage_vectors(doc_id, vectors)
        return vectors

    def retrieve(self, query: str, docs: dict[str, Document], passages: dict[str, list[Passage]], k: int,
                 on_progress: Progress | None = None) -> list[Passage]:
        """The `k` best passages of loaded documents for `query`: the store's full-text
        indexes, the passage vectors, every signal fused (`pipelines.answer.retrieval`)."""
        return retrieve(query, docs, passages, fts=self.fts, page_fts=self.page_fts,
                        dense=self.dense(list(docs), on_progress), k=k)


class Runtime:
    """What answering runs on, passed explicitly: the store with its document cache (None on a
    worker that never sees the database), and the engines loaded so far, each once, with its
    token table and prefix cache (`LoadedEngine`)."""

    def __init__(self, store: Store | None = None):
        self.store = store
        self.library = Library(store) if store is not None else None
        self._engines: dict[tuple[str | None, str | None], LoadedEngine] = {}

    def engine(self, model: str | None, device: str | None = None, prefetch=None) -> LoadedEngine:
        """The engine for a checkpoint (None: the default model) on a device, loaded once.
        `prefetch`: see `Engine.load` (a document whose cached KV to read while loading)."""
        if (model, device) not in self._engines:
            from ..engine.generate import Engine

            self._engines[model, device] = LoadedEngine(Engine.load(model, device=device, prefetch=prefetch))
        return self._engines[model, device]

    def model(self, settings: AskSettings, on_token: Callable[[str], None] | None = None,
              on_progress: Progress | None = None, prefetch=None) -> Model:
        """The embedded engine or a model server, as `settings.model` (or `DOCQA_MODEL`) names it.
        `prefetch`: see `Engine.load`."""
        spec = config.model_spec(settings.model)
        if is_remote(spec):
            check_thinking(settings)
            remote = RemoteModel.parse(spec).resolved()
            return Model(remote.name, remote_generate(remote, settings, on_token), can_quote=False, server=remote)
        loaded = self.engine(spec, settings.device, prefetch)
        tokenizer = loaded.engine.tokenizer
        return Model(str(loaded.engine.checkpoint.path), EngineGenerate(loaded, settings, on_token, on_progress),
                     lambda text: len(tokenizer.encode(text, add_bos=False)), loaded)


def ask(
    runtime: Runtime,
    refs: list[str],
    question: str,
    settings: AskSettings = AskSettings(),
    *,
    on_token: Callable[[str], None] | None = None,
    on_progress: Progress | None = None,
    query: str | None = None,
    job_id: str | None = None,
    item_id: str | None = None,
    kind: str = "ask",
) -> Run:
    """Answer `question` over the documents `refs` in the runtime's store, and store the run.

    `query`, when given, is what retrieval searches with instead of the question (a checklist
    item's question plus its hints); the model and the stored run see the question itself."""
    t0 = time.perf_counter()
    if on_progress:
        on_progress("retrieving", 0, 0)
    library = runtime.library
    docs, passages = library.load(refs)
    # Enough passages that the evidence can show `settings.evidence` distinct pages; the
    # context reads the first `settings.passages` of them.
    ranked = library.retrieve(query or question, docs, passages, max(settings.passages, EVIDENCE_POOL), on_progress)
    t1 = time.perf_counter()
    model = None
    prompt = ReadAllPrompt(*docs.values(), question, settings) if settings.read_all and len(docs) == 1 else None
    if not settings.evidence_only:
        if on_progress:
            on_progress("loading model", 0, 0)
        model = runtime.model(settings, on_token, on_progress, prefetch=prompt)
    t2 = time.perf_counter()
    if settings.read_all and model is not None:
        if len(docs) != 1:
            raise DocqaError("--read-all reads one document; ask about several without it")
        (doc,) = docs.values()
        if model.engine is None:
            raw, engine_timings = read_all_remote(model.server, doc, question, settings, on_token)
        else:
            raw, engine_timings = read_all_engine(model.engine, prompt, on_token, on_progress)
        answer = answer_read_all(question, raw, docs, ranked, passages[doc.doc_id], evidence_k=settings.evidence,
                                 support_check=settings.subject_check, confirm=model.confirm)
        answer.timings.update(engine_timings)
    else:
        answer = answer_question(
            question, docs, ranked, model.generate if model else None,
            budget_tokens=settings.budget_tokens, evidence_k=settings.evidence,
            quote=settings.quote and (model is None or model.can_quote),
            quote_from=settings.quote_from, read_k=settings.passages, support_check=settings.subject_check,
            confirm=model.confirm if model else None,
            **({"count_tokens": model.count_tokens} if model and model.count_tokens else {}),
        )
    timings = dict(answer.timings, retrieve_s=t1 - t0, load_model_s=t2 - t1)
    if model is not None and not settings.read_all:
        timings.update(model.generation_timings())
    timings["total_s"] = time.perf_counter() - t0
    answer = answer.model_copy(update={"timings": timings})
    return save_run(
        runtime.store, answer, doc_ids=list(docs), model=model.name if model else None, settings=asdict(settings),
        kind=kind, job_id=job_id, item_id=item_id,
    )
