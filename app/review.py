"""Review jobs: every checklist item asked of every document, resumable.

A job (table `jobs`, migration m004) records its checklist, its settings and its
documents. Each (document, item) is one run stored through `ask()` (or, for a `compare`
item, through `save_run` with the conflict findings); the run and its `job_items` row are
written in one transaction, and `job_items`' primary key refuses a second answer for the
same pair. So a job killed at any moment and started again skips what is stored, redoes
only what was in flight, and ends with every pair answered exactly once.

Items run in two phases: the questions, then the `compare` items, which read the answers
to their two items on the same document (`pipelines/answer/conflicts.py`).

Two ways to run an item, chosen by the executor (`Executor.shares_database`):
- local workers (`run_item`) open the database by path, call `ask()` and store the run;
- remote workers (Ray) never see the database. The driver reads what an item needs (its
  document, and the passages retrieval ranks — retrieval stays on the driver because FTS5's
  bm25 scores use statistics of the whole store, which no worker holds), ships it
  (`prepare_item`), the worker generates and verifies the answer (`answer_item`), and the
  driver writes the run and its `job_items` row in one transaction (`_store_answer`), as
  the local path does. A worker lost mid-item only loses work not yet written; a driver
  killed at any moment leaves whole runs only, and the job resumes like any other.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..pipelines.answer.conflicts import Finding, detect_conflicts
from ..pipelines.document import Document
from ..pipelines.document import Passage
from ..pipelines.answer.qa import Answer, answer_question
from .service import EVIDENCE_POOL, AskSettings, Runtime, ask
from .checklist import Checklist, ChecklistItem
from .errors import DocqaError
from .executor import Executor, SerialExecutor, ThreadExecutor
from .jobs import Job, JobError, get_job
from .runs import Run, get_run, save_run
from .store import Store


@dataclass
class ReviewSummary:
    job_id: str
    checklist: str
    documents: list[dict]
    items: int
    total: int
    done_before: int = 0
    answered_now: int = 0
    failed: list[dict] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    conflicts: int = 0
    elapsed_s: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_job_id(checklist: Checklist, doc_ids: list[str], settings: AskSettings) -> str:
    """The same checklist, documents and mode give the same job, so running the same
    command again resumes it instead of starting over."""
    key = json.dumps([checklist.digest(), sorted(doc_ids), settings.evidence_only, settings.model])
    return f"{checklist.name}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _job_settings(settings: AskSettings) -> dict:
    return {"evidence_only": settings.evidence_only, "model": settings.model,
            "max_tokens": settings.max_tokens, "budget_tokens": settings.budget_tokens}


def open_job(store: Store, job_id: str, checklist: Checklist, docs: list[tuple[str, str]],
             settings: AskSettings) -> Job:
    """Create the job, or check that an existing one has the same checklist and settings
    and add any new documents to it."""
    wanted = _job_settings(settings)
    with store.transaction() as db:
        row = db.execute("SELECT checklist_digest, settings FROM jobs WHERE id = ?", [job_id]).fetchone()
        now = _now()
        if row is None:
            db.execute(
                "INSERT INTO jobs (id, checklist_name, checklist, checklist_digest, settings, status,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                [job_id, checklist.name, checklist.model_dump_json(), checklist.digest(),
                 json.dumps(wanted), now, now],
            )
        else:
            if row[0] != checklist.digest():
                raise JobError(f"job {job_id!r} was started with a different checklist; "
                               "give another --job name")
            old = json.loads(row[1])
            for key in ("evidence_only", "model"):
                if old.get(key) != wanted[key]:
                    raise JobError(f"job {job_id!r} was started with {key}={old.get(key)!r}, "
                                   f"not {wanted[key]!r}; give another --job name")
            db.execute("UPDATE jobs SET status = 'running', updated_at = ? WHERE id = ?", [now, job_id])
        n = db.execute("SELECT count(*) FROM job_documents WHERE job_id = ?", [job_id]).fetchone()[0]
        for doc_id, path in docs:
            cur = db.execute(
                "INSERT OR IGNORE INTO job_documents (job_id, doc_id, ord, path) VALUES (?, ?, ?, ?)",
                [job_id, doc_id, n, path],
            )
            n += cur.rowcount
    return get_job(store, job_id)


def _answered(store: Store, job_id: str) -> set[tuple[str, str]]:
    return {(r[0], r[1]) for r in store.db.execute(
        "SELECT doc_id, item_id FROM job_items WHERE job_id = ?", [job_id])}


# -- the work of one (document, item): module-level, so any executor can run it ----------


@functools.lru_cache(maxsize=4)
def _worker(db_path: str) -> Runtime:
    """One runtime per worker process (and per database): the store connection, the document
    cache and the engine, loaded for the first item and reused for the rest."""
    return Runtime(Store(db_path))


@functools.lru_cache(maxsize=1)
def _remote_worker() -> Runtime:
    """A worker without the database (Ray): only the engine, loaded for its first item."""
    return Runtime()


def run_item(task: dict) -> dict:
    """Answer one checklist item on one document and store it; returns a small summary."""
    runtime = _worker(task["db"])
    item = ChecklistItem.model_validate(task["item"])
    settings = AskSettings(**task["settings"])
    try:
        if item.compare is None:
            run = ask(runtime, [task["doc_id"]], item.question, settings, query=item.query(),
                      job_id=task["job_id"], item_id=item.id, kind="review")
            return {"status": run.status, "run_id": run.id, "conflicts": 0}
        return _run_compare(runtime, task, item, settings)
    except sqlite3.IntegrityError as e:
        if "job_items" not in str(e):
            raise
        # Another process stored this pair first (two runners on one job): keep theirs.
        return {"status": "duplicate", "run_id": None, "conflicts": 0}


def _side_spans(run: Run) -> list[tuple[int, int]]:
    cites = [c for c in run.citations if c.verified] + run.evidence
    return [(c.span.char_start, c.span.char_end) for c in cites if c.span.char_start is not None and c.span.char_end is not None]


def _compare_runs(store: Store, task: dict, item: ChecklistItem) -> dict[str, Run]:
    """The stored answers to the two items a `compare` item reads, on the same document."""
    runs = {}
    for ref in item.compare:
        row = store.db.execute(
            "SELECT run_id FROM job_items WHERE job_id = ? AND doc_id = ? AND item_id = ?",
            [task["job_id"], task["doc_id"], ref],
        ).fetchone()
        if row is None:
            raise JobError(f"{item.id}: item {ref!r} has no answer on {task['doc_id']} yet")
        runs[ref] = get_run(store, row[0])
    return runs


def compare_findings(doc: Document, item: ChecklistItem, runs: dict[str, Run]) -> list[Finding]:
    """The rules' conflict findings between the passages cited for a `compare` item's two items."""
    a_id, b_id = item.compare
    return detect_conflicts(doc, a_id, _side_spans(runs[a_id]), b_id, _side_spans(runs[b_id]))


def _compare(runtime: Runtime, item: ChecklistItem, doc: Document, passages: list[Passage], runs: dict[str, Run],
             settings: AskSettings) -> tuple[Answer, str | None, int]:
    """The conflict findings between two answered items, as an answer: (answer, model, findings)."""
    a_id, b_id = item.compare
    findings = compare_findings(doc, item, runs)
    lines = [f"{f.text} {f.a.label()} / {f.b.label()}" for f in findings]
    citations = [c for f in findings for c in (f.a, f.b)]
    evidence = runs[a_id].evidence[:2] + runs[b_id].evidence[:2]
    model_name, raw = None, None
    if not settings.evidence_only:
        judged = _model_judgement(runtime, item, doc.doc_id, {doc.doc_id: doc}, passages, runs, settings)
        model_name, raw = judged["model"], judged["answer"].raw_answer
        if judged["answer"].status == "answered":
            lines.append(f"Model's judgement: {judged['answer'].answer}")
            citations += [c for c in judged["answer"].citations if c.verified]
    if findings or citations:
        status, text = "answered", "\n".join(lines)
    else:
        status = "not_found"
        text = f"No conflict found between {a_id} and {b_id} by the rules (exclusivity, periods that disagree, survival, notice and lock-in terms)."
    answer = Answer(question=item.question, status=status, answer=text, raw_answer=raw,
                    citations=citations, evidence=evidence)
    return answer, model_name, len(findings)


def _run_compare(runtime: Runtime, task: dict, item: ChecklistItem, settings: AskSettings) -> dict:
    runs = _compare_runs(runtime.store, task, item)
    docs, passages = runtime.library.load([task["doc_id"]])
    answer, model_name, n = _compare(runtime, item, docs[task["doc_id"]], passages[task["doc_id"]], runs, settings)
    run = save_run(runtime.store, answer, doc_ids=[task["doc_id"]], model=model_name, settings=asdict(settings),
                   kind="conflict", job_id=task["job_id"], item_id=item.id)
    return {"status": run.status, "run_id": run.id, "conflicts": n}


# -- the same work split for workers without the database (Ray) -------------------------


def prepare_item(runtime: Runtime, task: dict, share: Callable = lambda v: v) -> dict:
    """On the driver: what a worker needs to answer `task` without the database — its
    document (through `share`, so one copy serves all its items), the ranked passages
    (a question) or the two answers it compares (a `compare` item)."""
    item = ChecklistItem.model_validate(task["item"])
    settings = AskSettings(**task["settings"])
    store, library = runtime.store, runtime.library
    try:
        docs, passages = library.load([task["doc_id"]])
        payload = {"task": task, "doc": share(docs[task["doc_id"]])}
        if item.compare is None:
            # As `ask()` ranks for a question (retrieval with the item's hints as the query).
            payload["ranked"] = library.retrieve(item.query(), docs, passages, max(settings.passages, EVIDENCE_POOL))
        else:
            payload["passages"] = passages[task["doc_id"]]
            payload["runs"] = _compare_runs(store, task, item)
        return payload
    except DocqaError as e:
        return {"task": task, "error": str(e)}


def answer_item(payload: dict, runtime: Runtime | None = None) -> dict:
    """On a worker (`runtime`: this process's own, where the items run on its threads): the
    answer to one prepared item (nothing is stored here)."""
    if "error" in payload:
        return {"error": payload["error"]}
    task, doc = payload["task"], payload["doc"]
    item = ChecklistItem.model_validate(task["item"])
    settings = AskSettings(**task["settings"])
    runtime = runtime or _remote_worker()
    try:
        if item.compare is not None:
            answer, model_name, n = _compare(runtime, item, doc, payload["passages"], payload["runs"], settings)
            return {"answer": answer, "model": model_name, "conflicts": n, "kind": "conflict"}
        t0 = time.perf_counter()
        generate, model_name, kwargs, model = None, None, {}, None
        if not settings.evidence_only:
            model = runtime.model(settings)  # the engine is loaded once per worker process
            model_name, generate = model.name, model.generate
            if model.count_tokens:
                kwargs["count_tokens"] = model.count_tokens
        # The arguments `ask()` passes for a review item (read_all is never set by a job).
        answer = answer_question(
            item.question, {doc.doc_id: doc}, payload["ranked"], generate,
            budget_tokens=settings.budget_tokens, evidence_k=settings.evidence,
            quote=settings.quote and (model is None or model.can_quote),
            quote_from=settings.quote_from, read_k=settings.passages, support_check=settings.subject_check,
            confirm=model.confirm if model else None, **kwargs,
        )
        timings = dict(answer.timings, **(model.generation_timings() if model else {}))
        timings["total_s"] = time.perf_counter() - t0
        answer = answer.model_copy(update={"timings": timings})
        return {"answer": answer, "model": model_name, "conflicts": 0, "kind": "review"}
    except DocqaError as e:
        return {"error": str(e)}


def _store_answer(store: Store, task: dict, out: dict) -> dict:
    """On the driver: write a worker's answer; the run and its job_items row in one
    transaction, and a pair already answered (a retried task) is kept as it was."""
    try:
        run = save_run(store, out["answer"], doc_ids=[task["doc_id"]], model=out["model"],
                       settings=task["settings"], kind=out["kind"], job_id=task["job_id"],
                       item_id=task["item"]["id"])
    except sqlite3.IntegrityError as e:
        if "job_items" not in str(e):
            raise
        return {"status": "duplicate", "run_id": None, "conflicts": 0}
    return {"status": run.status, "run_id": run.id, "conflicts": out["conflicts"]}


def _remote_results(store: Store, executor: Executor, tasks: list[dict], runtime: Runtime | None = None):
    """(task, result) for each task, run on workers that do not share the database (`runtime`:
    this process's, whose threads answer the items; None: workers elsewhere, each its own)."""
    answer = functools.partial(answer_item, runtime=runtime) if runtime is not None else answer_item
    runtime = runtime or Runtime(store)
    share = getattr(executor, "share", lambda v: v)
    handles: dict[str, object] = {}

    def shared(doc: Document):
        # One handle per document; tasks come document by document, so keep the latest only.
        if doc.doc_id not in handles:
            handles.clear()
            handles[doc.doc_id] = share(doc)
        return handles[doc.doc_id]

    # A generator: the executor pulls the next item only when a worker has room, so items
    # are prepared (retrieved) as they are needed, not all up front.
    payloads = (prepare_item(runtime, t, shared) for t in tasks)
    for payload, out in executor.map(answer, payloads):
        task = payload["task"]
        yield task, (out if "error" in out else _store_answer(store, task, out))


def _model_judgement(runtime: Runtime, item, doc_id, docs, passages, runs, settings) -> dict:
    """Ask the model whether the two clauses conflict, over the passages both items cite."""
    spans = [s for r in runs.values() for s in _side_spans(r)]
    chosen = [p for p in passages if any(p.span.char_start < hi and p.span.char_end > lo for lo, hi in spans)]
    model = runtime.model(settings)
    question = (f"{item.question} Compare the clauses on '{item.compare[0]}' and '{item.compare[1]}'. "
                "If they conflict, start with CONFLICT and quote both clauses with their citations; "
                "otherwise say NO CONFLICT.")
    answer = answer_question(question, {doc_id: docs[doc_id]}, chosen, model.generate,
                             budget_tokens=settings.budget_tokens, evidence_k=0)
    return {"answer": answer, "model": model.name}


# -- the job runner ---------------------------------------------------------------------


def run_review(
    store: Store,
    checklist: Checklist,
    docs: list[tuple[str, str]],
    *,
    job_id: str | None = None,
    settings: AskSettings = AskSettings(evidence_only=True),
    executor: Executor | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_done: Callable[[dict, dict], None] | None = None,
) -> ReviewSummary:
    """Run (or resume) a review job over `docs` [(doc_id, path)]; returns its summary.

    `on_start(total, already_done)` is called once, `on_done(task, result)` per item."""
    t0 = time.perf_counter()
    if store.path == Path(":memory:"):
        raise JobError("a review job needs a database file (workers open it by path)")
    job_id = job_id or default_job_id(checklist, [d for d, _ in docs], settings)
    job = open_job(store, job_id, checklist, docs, settings)
    done = _answered(store, job.id)
    total = len(job.documents) * len(checklist.items)
    summary = ReviewSummary(
        job_id=job.id, checklist=checklist.name,
        documents=[{"doc_id": d, "path": p} for d, p in job.documents],
        items=len(checklist.items), total=total, done_before=len(done),
    )
    if on_start:
        on_start(total, len(done))
    base = {"db": str(store.path.resolve()), "job_id": job.id, "settings": asdict(settings)}
    with _batching(base["db"], settings, executor, len(done) < total) as (executor, local):
        _run_phases(store, checklist, job, base, done, executor, local, summary, on_done)
    statuses = Counter(r[0] for r in store.db.execute(
        "SELECT r.status FROM job_items j JOIN runs r ON r.id = j.run_id WHERE j.job_id = ?", [job.id]))
    summary.statuses = dict(sorted(statuses.items()))
    complete = len(_answered(store, job.id)) == total
    with store.transaction() as db:
        db.execute("UPDATE jobs SET status = ?, updated_at = ? WHERE id = ?",
                   ["done" if complete else "incomplete", _now(), job.id])
    summary.elapsed_s = round(time.perf_counter() - t0, 3)
    return summary


def _run_phases(store: Store, checklist: Checklist, job: Job, base: dict, done: set, executor: Executor,
                local: Runtime | None, summary: ReviewSummary, on_done) -> None:
    """The questions, then the `compare` items: each item not answered yet, on `executor`
    (`local`: see `_batching`)."""
    for phase in (checklist.questions, checklist.comparisons):
        tasks = [
            base | {"doc_id": d, "item": item.model_dump(mode="json")}
            for d, _ in job.documents for item in phase if (d, item.id) not in done
        ]
        failed_refs = {(f["doc_id"], f["item_id"]) for f in summary.failed}
        ready = []
        for t in tasks:
            refs = t["item"].get("compare") or []
            if any((t["doc_id"], r) in failed_refs for r in refs):
                summary.failed.append({"doc_id": t["doc_id"], "item_id": t["item"]["id"],
                                       "error": "an item it compares failed"})
            else:
                ready.append(t)
        results = (executor.map(_safe_run_item, ready) if executor.shares_database
                   else _remote_results(store, executor, ready, local))
        for task, result in results:
            if "error" in result:
                summary.failed.append({"doc_id": task["doc_id"], "item_id": task["item"]["id"],
                                       "error": result["error"]})
            elif result["status"] != "duplicate":
                summary.answered_now += 1
                summary.conflicts += result["conflicts"]
            if on_done:
                on_done(task, result)


@contextlib.contextmanager
def _batching(db: str, settings: AskSettings, executor: Executor | None, work: bool):
    """(executor, runtime) for a job's items (`work`: some are not answered yet). With a model on
    the serial executor (the default) and an engine that batches (a CUDA decoder,
    `LoadedEngine.batched`), the items run on threads of this process, as many as the batch
    holds: this thread retrieves and stores (`prepare_item`, `_store_answer`), the threads
    answer (`answer_item`, the steps `ask` takes), and the engine decodes their requests
    together — each item gets the tokens it would get alone. Otherwise (executor, None): items
    one after another, or on the workers asked for."""
    executor = executor or SerialExecutor()
    if not work or not isinstance(executor, SerialExecutor) or settings.evidence_only:
        yield executor, None
        return
    runtime = _worker(db)  # the runtime `run_item` uses: the engine is loaded once either way
    engine = runtime.model(settings).engine
    if engine is None:  # a model server
        yield executor, None
        return
    with engine.batched() as batch:
        yield (executor, None) if batch is None else (ThreadExecutor(batch.session.scheduler.max_seqs), runtime)


def _safe_run_item(task: dict) -> dict:
    """`run_item`, with a user-facing failure of one item reported instead of raised: the
    job goes on, and the item is tried again when the job is resumed."""
    try:
        return run_item(task)
    except DocqaError as e:
        return {"error": str(e)}
