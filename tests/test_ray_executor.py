"""Review jobs and summaries on a real local Ray cluster (no mocks): the same answers as the serial
executor, a worker process killed mid-job, and the driver killed and the job resumed —
every (document, item) answered exactly once each time."""

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'docqa[cluster]')")

from docqa.app.checklist import load_checklist  # noqa: E402
from docqa.app.ingest import ingest_path  # noqa: E402
from docqa.app.executor import ProcessExecutor, RayExecutor  # noqa: E402
from docqa.app.jobs import job_runs  # noqa: E402
from docqa.app.review import run_review  # noqa: E402
from docqa.app.store import Store  # noqa: E402
from docqa.app.summarize import SummarizeSettings, summarize  # noqa: E402
from docqa.pipelines.ingest.build import ingest_file  # noqa: E402
from docqa.fixtures.make_pdf import write_sample_contract_pdf  # noqa: E402
from docqa.pipelines.ingest.record import make_record  # noqa: E402

CHECKLIST = load_checklist("contract_review")

# A second document whose clauses conflict, so the job's `compare` items find something.
CONFLICTING = """DISTRIBUTION AGREEMENT

1. Term. This Agreement has an initial term of two (2) years.

2. Termination for Convenience. Either party may terminate this Agreement for convenience upon thirty (30) months' written notice.

3. Governing Law. This Agreement is governed by the laws of the State of Delaware.

4. Confidentiality. Each party shall hold the other party's Confidential Information in confidence for seven (7) years. These obligations survive for two (2) years after termination.
"""


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    txt = tmp / "distribution.txt"
    txt.write_text(CONFLICTING)
    return [write_sample_contract_pdf(tmp / "sample_contract.pdf"), txt]


def _ingest(db: Path, files: list[Path]) -> list[tuple[str, str]]:
    with Store(db) as store:
        return [(r["doc_id"], r["path"]) for r in (ingest_path(store, f, max_bytes=10**8) for f in files)]


def _answers(db: Path, job: str) -> dict:
    """Everything a report shows of each (document, item): status, text, citations, evidence."""
    with Store(db) as store:
        return {key: (run.kind, run.status, run.answer,
                      [(c.label(), c.quote, c.verified) for c in run.citations],
                      [(c.label(), c.quote) for c in run.evidence])
                for key, run in job_runs(store, job).items()}


def _pairs(db: Path, job: str) -> list[tuple[str, str, int]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT doc_ids, item_id, count(*) FROM runs WHERE job_id = ?"
                           " GROUP BY doc_ids, item_id", [job]).fetchall()
    except sqlite3.OperationalError:  # the driver has not created the tables yet
        return []
    finally:
        con.close()


@pytest.fixture(scope="module")
def serial(files, tmp_path_factory):
    db = tmp_path_factory.mktemp("serial") / "serial.db"
    docs = _ingest(db, files)
    with Store(db) as store:
        summary = run_review(store, CHECKLIST, docs, job_id="j")
    assert summary.answered_now == summary.total == 2 * len(CHECKLIST.items) and not summary.failed
    return _answers(db, "j")


def test_ray_answers_equal_serial(cluster, files, serial, tmp_path):
    db = tmp_path / "ray.db"
    docs = _ingest(db, files)
    with Store(db) as store, RayExecutor(workers=2) as ex:
        summary = run_review(store, CHECKLIST, docs, job_id="j", executor=ex)
        assert len(ex.pids) == 2 and os.getpid() not in ex.pids  # answered in two other processes
    assert summary.answered_now == summary.total and not summary.failed
    assert summary.conflicts > 0  # the compare items ran (and found the planted conflicts)
    assert _answers(db, "j") == serial


def test_worker_killed_mid_job(cluster, files, serial, tmp_path):
    db = tmp_path / "kill.db"
    docs = _ingest(db, files)
    killed: list[int] = []

    with Store(db) as store, RayExecutor(workers=2) as ex:
        def on_done(task, result):
            # Once both workers have answered, kill one of them by its process id.
            if not killed and len(ex.pids) == 2:
                killed.append(min(ex.pids))
                os.kill(killed[0], signal.SIGKILL)

        summary = run_review(store, CHECKLIST, docs, job_id="j", executor=ex, on_done=on_done)
        pids = set(ex.pids)
        lost = ex.lost
    assert killed, "both workers answered before the job ended"
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)  # that worker process is really gone
    # Ray restarted the actor in a new process, which answered items after the kill ...
    assert len(pids - set(killed)) >= 2, (pids, killed, lost)
    # ... and the job is whole: every pair once, answers as the serial run's.
    assert not summary.failed and summary.answered_now == summary.total
    assert all(n == 1 for *_, n in _pairs(db, "j")) and len(_pairs(db, "j")) == summary.total
    assert _answers(db, "j") == serial


CHILD = "import sys; from docqa.app.cli import main; sys.argv[0] = 'docqa'; main()"


def test_driver_killed_and_resumed(cluster, files, serial, tmp_path):
    db = tmp_path / "driver.db"
    cmd = [sys.executable, "-c", CHILD, "review", *map(str, files), "--checklist", "contract_review",
           "--job", "j", "--evidence-only", "--db", str(db), "--json",
           "--executor", "ray", "--address", cluster, "--workers", "2"]
    total = 2 * len(CHECKLIST.items)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if db.exists() and len(_pairs(db, "j")) >= 5:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read().decode()
    os.kill(proc.pid, signal.SIGKILL)  # the driver alone: the cluster and its workers live on
    proc.wait()
    stored = len(_pairs(db, "j"))
    assert 5 <= stored < total
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["done_before"] == stored and summary["answered_now"] == total - stored
    assert all(n == 1 for *_, n in _pairs(db, "j")) and len(_pairs(db, "j")) == total
    assert _answers(db, "j") == serial


# -- summarize: segments read on the review executor ------------------------------------------

SUMMARY = SummarizeSettings(evidence_only=True, length="detailed", cluster="section")


def _extractions_of(db: Path) -> list:
    """What the map step stored, per segment (the same settings key in every database)."""
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT settings_key, doc_id, segment, extraction FROM summary_segments"
                           " ORDER BY doc_id, segment").fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def summary_db(files, tmp_path_factory):
    """The sample contract cut into several segments, and its summary read in this process."""
    doc = ingest_file(files[0], segment_tokens=150)
    assert len(doc.segments) >= 4
    db = tmp_path_factory.mktemp("summ") / "serial.db"
    with Store(db) as store:
        store.add_record(make_record(doc))
        _, summ = summarize(store, [doc.doc_id], SUMMARY)
    return doc, summ, db


@pytest.mark.parametrize("kind", ["pool", "ray"])
def test_summarize_on_the_local_pool_and_on_ray_equals_serial(cluster, summary_db, tmp_path, kind):
    doc, serial, serial_db = summary_db
    db = tmp_path / f"{kind}.db"
    with Store(db) as store:
        store.add_record(make_record(doc))
        ex = ProcessExecutor(2) if kind == "pool" else RayExecutor(workers=2)
        try:
            _, summ = summarize(store, [doc.doc_id], SUMMARY, executor=ex)
        finally:
            getattr(ex, "close", lambda: None)()
    if kind == "ray":
        assert len(ex.pids) == 2 and os.getpid() not in ex.pids  # read in two other processes
    # Every segment read once and stored here, as the serial run stored it; the same summary.
    assert [r[2] for r in _extractions_of(db)] == list(range(len(doc.segments)))
    assert _extractions_of(db) == _extractions_of(serial_db)
    assert summ.stats["resumed_segments"] == 0 and summ.blocks == serial.blocks


def test_summarize_cli_with_executor_ray(cluster, summary_db, tmp_path):
    doc, _, serial_db = summary_db
    db = tmp_path / "cli.db"
    with Store(db) as store:
        store.add_record(make_record(doc))
    cmd = [sys.executable, "-c", CHILD, "summarize", doc.doc_id, "--evidence-only", "--length", "detailed",
           "--db", str(db), "--json", "--executor", "ray", "--address", cluster, "--workers", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert value["stats"]["segments"] == len(doc.segments) and value["stats"]["resumed_segments"] == 0
    assert _extractions_of(db) == _extractions_of(serial_db)
    cites = [c for b in value["blocks"] for s in b["sentences"] for c in s["citations"]]
    assert cites and all(c["verified"] for c in cites) and value["dropped_sentences"] == 0
    bad = subprocess.run([sys.executable, "-c", CHILD, "summarize", doc.doc_id, "--evidence-only", "--db", str(db),
                          "--address", cluster], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--address applies to --executor ray" in bad.stderr
