"""Stored review jobs, read back: a job's checklist, settings and documents, and the run
stored for each of its (document, item) pairs. What `export`, `browse` and the TUI read;
running a job is app/review.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .checklist import Checklist
from .errors import DocqaError
from .runs import Run, get_run
from .store import Store


class JobError(DocqaError):
    """A job that cannot be started or resumed as asked."""


@dataclass(frozen=True)
class Job:
    id: str
    checklist: Checklist
    settings: dict
    status: str
    created_at: str
    updated_at: str
    documents: list[tuple[str, str]]  # (doc_id, path), in the order they were added


def get_job(store: Store, job_id: str) -> Job:
    row = next(store.db.query("SELECT * FROM jobs WHERE id = ?", [job_id]), None)
    if row is None:
        raise JobError(f"no job named {job_id!r} (see `docqa browse` or `docqa runs`)")
    docs = [(r["doc_id"], r["path"]) for r in store.db.query(
        "SELECT doc_id, path FROM job_documents WHERE job_id = ? ORDER BY ord", [job_id])]
    return Job(id=row["id"], checklist=Checklist.model_validate_json(row["checklist"]),
               settings=json.loads(row["settings"]), status=row["status"],
               created_at=row["created_at"], updated_at=row["updated_at"], documents=docs)


def list_jobs(store: Store) -> list[Job]:
    ids = [r["id"] for r in store.db.query("SELECT id FROM jobs ORDER BY created_at DESC, id")]
    return [get_job(store, i) for i in ids]


def job_runs(store: Store, job_id: str) -> dict[tuple[str, str], Run]:
    """The stored answer of every (doc_id, item_id) of a job."""
    out = {}
    for r in store.db.query(
        "SELECT doc_id, item_id, run_id FROM job_items WHERE job_id = ?", [job_id]
    ):
        out[(r["doc_id"], r["item_id"])] = get_run(store, r["run_id"])
    return out
