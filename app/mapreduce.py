"""`docqa ask --map-reduce`: map the question over every segment of the documents, store
each segment's extraction as it is made, reduce into one cited answer.

Each mapped segment is written in its own transaction under a key of (question, documents,
model, settings), so a run that is interrupted — killed, out of time — resumes from the
segments it has not read yet when the same question is asked again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict

from ..pipelines.answer.mapreduce import Extraction, map_segment, reduce_extractions
from ..pipelines.answer.qa import Generate, evidence_citations, judge
from ..pipelines.answer.support import for_documents, need_of
from .service import AskSettings, Runtime
from .runs import Run, save_run
from .store import Store

Progress = Callable[[int, int], None]  # (segments done, segments in all)


def run_key(question: str, doc_ids: list[str], model: str | None, settings: AskSettings) -> str:
    blob = json.dumps([question, sorted(doc_ids), model, settings.max_tokens, settings.temperature])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _stored(store: Store, key: str) -> dict[tuple[str, int], Extraction]:
    rows = store.db.query("SELECT doc_id, segment, extraction FROM map_results WHERE run_key = ?", [key])
    return {(r["doc_id"], r["segment"]): Extraction.model_validate_json(r["extraction"]) for r in rows}


def map_reduce(
    runtime: Runtime,
    refs: list[str],
    question: str,
    settings: AskSettings = AskSettings(),
    *,
    generate: Generate | None = None,
    model_name: str | None = None,
    on_progress: Progress | None = None,
) -> Run:
    """Answer over whole documents by map-reduce, stored in the runtime's store; `generate`
    defaults to the runtime's model for `settings`."""
    t0 = time.perf_counter()
    store, library = runtime.store, runtime.library
    docs, passages = library.load(refs)
    if generate is None:
        model = runtime.model(settings)
        generate, model_name = model.generate, model.name
    key = run_key(question, list(docs), model_name, settings)
    done = _stored(store, key)
    todo = [(d, s) for d in docs.values() for s in d.segments]
    resumed = sum((d.doc_id, s.index) in done for d, s in todo)
    for i, (doc, seg) in enumerate(todo):
        if (doc.doc_id, seg.index) not in done:
            ext = map_segment(question, doc, seg, generate)
            with store.transaction() as db:
                db.execute(
                    "INSERT OR REPLACE INTO map_results (run_key, doc_id, segment, extraction) VALUES (?, ?, ?, ?)",
                    [key, doc.doc_id, seg.index, ext.model_dump_json()],
                )
            done[(doc.doc_id, seg.index)] = ext
        if on_progress:
            on_progress(i + 1, len(todo))
    t1 = time.perf_counter()
    ranked = library.retrieve(question, docs, passages, settings.evidence)
    extractions = [done[(d.doc_id, s.index)] for d, s in todo]
    answer = reduce_extractions(question, docs, extractions, evidence_citations(docs, ranked, settings.evidence))
    # Each merged citation says whether it supports an answer; a list over the whole document
    # is not withheld for the ones that do not.
    need = for_documents(need_of(question), docs.values())
    answer.citations = [judge(c, docs[c.doc_id], need) if c.verified else c for c in answer.citations]
    answer.timings.update(map_s=t1 - t0, segments=float(len(todo)), resumed_segments=float(resumed),
                          rejected_citations=float(sum(e.rejected for e in extractions)),
                          total_s=time.perf_counter() - t0)
    return save_run(store, answer, doc_ids=list(docs), model=model_name,
                    settings=asdict(settings) | {"map_reduce": True}, kind="mapreduce")
