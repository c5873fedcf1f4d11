"""Runs: every question asked, the answer shown and each citation, kept in the store.

A run is one answer to one question over one or more documents (`docqa ask`, or one
checklist item on one document in a review job). Its citations are stored row by row with
their verdict, so reports and the TUI never re-parse answers.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..pipelines.answer.citations import Citation
from ..pipelines.answer.qa import Answer, draft_of
from .errors import DocqaError
from .remote import PREFIX
from .store import Store

ROLES = ("answer", "evidence", "draft")  # draft: a withheld answer's citations


class RunNotFound(DocqaError):
    def __init__(self, ref: str):
        super().__init__(f"no run or job named {ref!r} (see `docqa runs`)")


class DocumentRemoved(DocqaError):
    """A document was removed (`docqa rm`) while a question about it was being answered."""

    def __init__(self, doc_ids: list[str]):
        super().__init__(f"document {', '.join(doc_ids)} was removed while the answer was being made; "
                         "the answer is not stored (ingest it again and ask again)")


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kind: str  # "ask" or "review"
    question: str
    doc_ids: list[str]
    model: str | None
    settings: dict = Field(default_factory=dict)
    status: str
    answer: str | None
    raw_answer: str | None
    citations: list[Citation] = Field(default_factory=list)
    evidence: list[Citation] = Field(default_factory=list)
    draft_citations: list[Citation] = Field(default_factory=list)  # a withheld answer's (raw_answer's)
    asked: list[Citation] = Field(default_factory=list)  # qa.Answer.asked, for benchmarks; not stored
    timings: dict[str, float] = Field(default_factory=dict)
    created_at: str
    job_id: str | None = None
    item_id: str | None = None

    @property
    def draft(self) -> str | None:
        """A withheld answer's text (or free text shown only as its quotes): see qa.draft_of."""
        return draft_of(self.status, self.raw_answer, self.draft_citations)


def model_label(spec: str | None) -> str:
    """How a run's model is shown: a checkpoint by its file or folder name, a model server as
    "MODEL at URL" (its spec, `openai:URL#MODEL`, is no path)."""
    if not spec:
        return "none (evidence only)"
    if spec.startswith(PREFIX):
        url, _, model = spec.removeprefix(PREFIX).partition("#")
        return f"{model or 'the server model'} at {url}"
    return Path(spec).name


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("r%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def save_run(
    store: Store,
    answer: Answer,
    *,
    doc_ids: list[str],
    model: str | None,
    settings: dict | None = None,
    kind: str = "ask",
    job_id: str | None = None,
    item_id: str | None = None,
    run_id: str | None = None,
) -> Run:
    """Store an answer and its citations in one transaction; returns the stored run."""
    run = Run(
        id=run_id or new_run_id(),
        kind=kind,
        question=answer.question,
        doc_ids=doc_ids,
        model=model,
        settings=settings or {},
        status=answer.status,
        answer=answer.answer,
        raw_answer=answer.raw_answer,
        citations=answer.citations,
        evidence=answer.evidence,
        draft_citations=answer.draft_citations,
        asked=answer.asked,
        timings=answer.timings,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        job_id=job_id,
        item_id=item_id,
    )
    with store.transaction() as db:
        # Under the write lock `docqa rm` takes too: a run is stored with all its documents or not
        # at all, never with citations of a document that is gone.
        gone = [d for d in dict.fromkeys([*doc_ids, *(c.doc_id for c in answer.citations + answer.evidence + answer.draft_citations)])
                if db.execute("SELECT 1 FROM documents WHERE doc_id = ?", [d]).fetchone() is None]
        if gone:
            raise DocumentRemoved(gone)
        db.execute(
            "INSERT INTO runs (id, kind, question, doc_ids, model, settings, status, answer,"
            " raw_answer, timings, created_at, job_id, item_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run.id, run.kind, run.question, json.dumps(run.doc_ids), run.model,
             json.dumps(run.settings), run.status, run.answer, run.raw_answer,
             json.dumps(run.timings), run.created_at, run.job_id, run.item_id],
        )
        rows = []
        for role, cites in (("answer", run.citations), ("evidence", run.evidence), ("draft", run.draft_citations)):
            for i, c in enumerate(cites):
                rows.append((run.id, i, role, c.doc_id, c.span.page, c.span.element_id, c.span.line_start,
                             c.span.line_end, c.quote, c.segment_id, int(c.verified), int(c.relocated),
                             c.span.char_start, c.span.char_end, c.note, None if c.supports is None else int(c.supports)))
        db.conn.executemany(
            "INSERT INTO citations (run_id, ord, role, doc_id, page, section_id, line_start,"
            " line_end, quote, segment_id, verified, relocated, char_start, char_end, note, supports)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    return run


def _citations(store: Store, run_id: str, role: str) -> list[Citation]:
    out = []
    for r in store.db.query(
        "SELECT * FROM citations WHERE run_id = ? AND role = ? ORDER BY ord", [run_id, role]
    ):
        for k in ("run_id", "ord", "role"):
            r.pop(k)
        r["verified"], r["relocated"] = bool(r["verified"]), bool(r["relocated"])
        r["supports"] = None if r["supports"] is None else bool(r["supports"])
        out.append(Citation(**r))
    return out


def _run(store: Store, r: dict) -> Run:
    for k in ("doc_ids", "settings", "timings"):
        r[k] = json.loads(r[k])
    return Run(
        **r,
        citations=_citations(store, r["id"], "answer"),
        evidence=_citations(store, r["id"], "evidence"),
        draft_citations=_citations(store, r["id"], "draft"),
    )


def get_run(store: Store, run_id: str) -> Run:
    row = next(store.db.query("SELECT * FROM runs WHERE id = ?", [run_id]), None)
    if row is None:
        rows = list(store.db.query("SELECT * FROM runs WHERE id LIKE ? LIMIT 2", [run_id + "%"]))
        if len(rows) != 1:
            raise RunNotFound(run_id)
        row = rows[0]
    return _run(store, row)


def list_runs(store: Store, *, job_id: str | None = None, limit: int | None = None) -> list[Run]:
    sql, params = "SELECT * FROM runs", []
    if job_id is not None:
        sql += " WHERE job_id = ?"
        params.append(job_id)
    sql += " ORDER BY created_at DESC, id DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    return [_run(store, r) for r in store.db.query(sql, params)]
