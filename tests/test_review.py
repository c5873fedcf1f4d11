"""Review jobs: checklist schema, answers on the sample contract against its known clause
lines, conflict findings, and a job killed with SIGKILL that resumes without loss or
duplicates."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import docqa.fixtures as fx
from docqa.app.service import AskSettings
from docqa.app.checklist import ChecklistError, load_checklist, parse_checklist
from docqa.app.cli import app
from docqa.app.jobs import JobError, job_runs
from docqa.app.review import run_review
from docqa.app.store import Store
from docqa.fixtures.make_pdf import text_to_pages, write_sample_contract_pdf
from docqa.pipelines.answer.conflicts import detect_conflicts
from docqa.pipelines.ingest.build import build
from docqa.pipelines.ingest.source import load
from docqa.pipelines.textnorm import normalize

SOURCE = (Path(fx.__file__).parent / "sample_contract.txt").read_text(encoding="utf-8")
HEADER = "Northwind / Bluebird - Confidential"


def source_lines(page: int) -> list[str]:
    # The PDF writer adds the running header as line 1; pypdf drops empty lines.
    return [HEADER] + [ln for ln in text_to_pages(SOURCE)[page - 1] if ln]


def invoke(*args):
    return CliRunner().invoke(app, list(args), env={"DOCQA_DEBUG": "1"})


# -- checklists ----------------------------------------------------------------------------

def test_builtin_checklists_parse():
    contract = load_checklist("contract_review")
    assert len(contract.questions) >= 12
    assert {i.compare for i in contract.comparisons} >= {("term", "termination_for_convenience")}
    assert len(load_checklist("spec_review").items) >= 8


@pytest.mark.parametrize(
    "body, message",
    [
        ("name: x\nitems:\n  - id: a\n    question: Is it?\n    hint: [x]\n", "items[0] (id 'a').hint: unknown key"),
        ("name: x\nitems:\n  - id: a\n    question: Is it?\n    type: boolean\n", "items[0] (id 'a').type: must be one of yes_no"),
        ("name: x\nitems:\n  - id: a\n    question: Is it?\n  - id: a\n    question: Again?\n", "duplicate item id 'a'"),
        ("name: x\nitems:\n  - id: a\n    question: Is it?\n  - id: c\n    question: Same?\n    compare: [a, b]\n", "compares unknown item 'b'"),
        ("name: x\nitems:\n  - id: a\n    question: Is it?\n  - id: c\n    question: Same?\n    compare: [a, a]\n", "compares 'a' with itself"),
        ("name: x\nitems:\n  - question: Is it?\n", "items[0].id: required key missing"),
        ("name: x\nitems: [\n", "not valid YAML"),
        ("- just a list\n", "expected a mapping"),
    ],
)
def test_checklist_errors_are_one_line(body, message):
    with pytest.raises(ChecklistError) as e:
        parse_checklist(body, fmt="yaml", source="c.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_toml_checklist(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('name = "t"\n[[items]]\nid = "law"\nquestion = "Which law governs?"\ntype = "party"\nhints = ["governed by"]\n')
    c = load_checklist(f)
    assert c.items[0].type == "party" and c.items[0].query().endswith("(Related: governed by.)")


def test_review_cli_reports_bad_checklist(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nitems:\n  - id: A B\n    question: Is it?\n")
    r = CliRunner().invoke(app, ["review", str(tmp_path), "--checklist", str(bad), "--db", str(tmp_path / "d.db")])
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "items[0]" in r.stderr


# -- a job over the sample contract ---------------------------------------------------------

# Clause text as written in fixtures/sample_contract.txt, and the page it is on.
KNOWN = {
    "termination_for_convenience": (2, "Customer may terminate this Agreement for convenience upon"),
    "governing_law": (3, "governed by the laws of the State of New York"),
    "anti_assignment": (3, "Neither party may assign this Agreement without the prior written consent"),
    "renewal_term": (2, "renews automatically for successive one (1) year periods"),
    "notice_to_terminate_renewal": (2, "notice of non-renewal at least sixty (60) days"),
    "term": (2, "continues for an initial term of"),
    "license_grant": (1, "Licensor grants Customer a"),
    "effective_date": (1, "March 1, 2024"),
    "parties": (1, "by and between Northwind Analytics Inc."),
    "minimum_commitment": (2, "annual license fee of $120,000"),
}


@pytest.fixture(scope="module")
def sample_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("review")
    pdf = write_sample_contract_pdf(tmp / "sample_contract.pdf")
    db = tmp / "docqa.db"
    r = invoke("review", str(pdf), "--checklist", "contract_review", "--job", "sample",
               "--evidence-only", "--db", str(db), "--json")
    assert r.exit_code == 0, r.output
    return pdf, db, json.loads(r.stdout)


def test_every_item_answered_once(sample_job):
    _, db, summary = sample_job
    n_items = len(load_checklist("contract_review").items)
    assert summary["total"] == n_items and summary["answered_now"] == n_items and not summary["failed"]
    with Store(db) as store:
        rows = store.db.execute("SELECT item_id, count(*) FROM runs WHERE job_id = 'sample' GROUP BY item_id").fetchall()
    assert len(rows) == n_items and all(n == 1 for _, n in rows)


@pytest.mark.parametrize("item_id", sorted(KNOWN))
def test_evidence_cites_the_known_clause(sample_job, item_id):
    _, db, _ = sample_job
    page, phrase = KNOWN[item_id]
    with Store(db) as store:
        runs = job_runs(store, "sample")
    run = next(r for (d, i), r in runs.items() if i == item_id)
    assert run.status == "evidence_only" and run.kind == "review"
    # Among the evidence a review shows (its top 5 passages): the whole-page bm25 signal moved
    # the fee clause from 3rd to 4th for minimum_commitment (it raised CUAD page recall@5
    # 0.866 -> 0.896, bench/results/retrieval.md).
    shown = run.evidence[:5]
    hits = [c for c in shown if normalize(phrase) in normalize(c.quote)]
    assert hits, f"{item_id}: {[c.label() for c in shown]}"
    c = hits[0]
    assert c.span.page == page and c.verified
    # The cited lines are the source's lines, as written.
    assert normalize(phrase) in normalize(" ".join(source_lines(page)[c.span.line_start - 1 : c.span.line_end]))


def test_rerun_skips_everything(sample_job):
    pdf, db, summary = sample_job
    r = invoke("review", str(pdf), "--checklist", "contract_review", "--job", "sample",
               "--evidence-only", "--db", str(db), "--json")
    again = json.loads(r.stdout)
    assert r.exit_code == 0 and again["answered_now"] == 0 and again["done_before"] == summary["total"]


def test_resume_refuses_another_checklist_or_mode(sample_job, tmp_path):
    pdf, db, _ = sample_job
    with Store(db) as store:
        with pytest.raises(JobError, match="different checklist"):
            run_review(store, load_checklist("spec_review"), [(store.resolve(str(pdf)), str(pdf))], job_id="sample")
        with pytest.raises(JobError, match="evidence_only"):
            run_review(store, load_checklist("contract_review"), [(store.resolve(str(pdf)), str(pdf))],
                       job_id="sample", settings=AskSettings(evidence_only=False))


def test_same_command_resumes_the_same_default_job(tmp_path):
    pdf = write_sample_contract_pdf(tmp_path / "c.pdf")
    db = str(tmp_path / "d.db")
    first = json.loads(invoke("review", str(pdf), "--checklist", "spec_review", "--evidence-only", "--db", db, "--json").stdout)
    second = json.loads(invoke("review", str(pdf), "--checklist", "spec_review", "--evidence-only", "--db", db, "--json").stdout)
    assert first["job_id"] == second["job_id"] and second["answered_now"] == 0


def test_process_pool_gives_the_same_answers(sample_job, tmp_path):
    pdf, _, _ = sample_job
    db = tmp_path / "pool.db"
    r = invoke("review", str(pdf), "--checklist", "contract_review", "--job", "pool", "--evidence-only",
               "--workers", "2", "--db", str(db), "--json")
    assert r.exit_code == 0, r.output
    with Store(db) as a, Store(sample_job[1]) as b:
        ra = {i: [c.label() for c in r.evidence] for (_, i), r in job_runs(a, "pool").items()}
        rb = {i: [c.label() for c in r.evidence] for (_, i), r in job_runs(b, "sample").items()}
    assert ra == rb


# -- conflicts -------------------------------------------------------------------------------

CONFLICTING = textwrap.dedent("""\
    DISTRIBUTION AGREEMENT

    1. Appointment. Supplier hereby grants Distributor an exclusive license to distribute the Products in the Territory.

    2. License. Supplier grants Distributor a non-exclusive license to distribute the Products in the Territory under the Marks.

    3. Term. This Agreement has an initial term of two (2) years. During the initial term this Agreement may not be terminated except for material breach.

    4. Termination for Convenience. Either party may terminate this Agreement for convenience upon thirty (30) months' written notice.

    5. Confidentiality. Each party shall hold the other party's Confidential Information in confidence for a period of seven (7) years from disclosure. These obligations survive for two (2) years after termination.

    6. Trade Secrets. Distributor shall keep Supplier's trade secrets confidential for so long as they remain trade secrets under applicable law.
    """)


def _paragraph(doc, start: str) -> tuple[int, int]:
    i = doc.text.index(start)
    j = doc.text.find("\n\n", i)
    return i, j if j > 0 else len(doc.text)


@pytest.fixture(scope="module")
def conflicting_doc(tmp_path_factory):
    f = tmp_path_factory.mktemp("conflict") / "distribution.txt"
    f.write_text(CONFLICTING)
    return f, build(load(f))


@pytest.mark.parametrize(
    "a, b, rule, a_quote, b_quote",
    [
        ("1. Appointment", "2. License", "exclusivity", "an exclusive license", "a non-exclusive license"),
        ("3. Term", "4. Termination", "lock_in_vs_convenience", "may not be terminated", "for convenience upon thirty"),
        ("3. Term", "4. Termination", "notice_exceeds_period", "initial term of two (2) years", "thirty (30) months"),
        ("5. Confidentiality", "6. Trade Secrets", "survival_shorter", "survive for two (2) years", "for so long as"),
    ],
)
def test_rules_find_the_planted_conflicts(conflicting_doc, a, b, rule, a_quote, b_quote):
    _, doc = conflicting_doc
    findings = [f for f in detect_conflicts(doc, "x", [_paragraph(doc, a)], "y", [_paragraph(doc, b)])
                if f.rule == rule and b_quote in f.b.quote]
    assert findings, rule
    f = findings[0]
    assert f.text.startswith("[CONFLICT: x vs y]")
    for c, quote in ((f.a, a_quote), (f.b, b_quote)):
        assert c.verified and quote in c.quote
        # The citation's lines hold its quote in the source file.
        lines = CONFLICTING.splitlines()
        kept = [ln for ln in lines]  # text ingest keeps every line, blank ones included
        assert normalize(quote) in normalize(" ".join(kept[c.span.line_start - 1 : c.span.line_end]))


def test_survival_shorter_than_confidentiality_in_one_clause(conflicting_doc):
    _, doc = conflicting_doc
    span = _paragraph(doc, "5. Confidentiality")
    found = [f for f in detect_conflicts(doc, "x", [span], "y", [span]) if f.rule == "survival_shorter"]
    assert found and "seven (7) years" in found[0].text and "two (2) years" in found[0].text


def test_no_conflict_on_consistent_clauses(sample_job):
    _, db, _ = sample_job
    with Store(db) as store:
        runs = job_runs(store, "sample")
    compare = [r for (_, i), r in runs.items() if r.kind == "conflict"]
    assert len(compare) == 3 and all(r.status == "not_found" and not r.citations for r in compare)


def test_review_reports_conflicts_end_to_end(conflicting_doc, tmp_path):
    f, _ = conflicting_doc
    db = tmp_path / "c.db"
    r = invoke("review", str(f), "--checklist", "contract_review", "--job", "c", "--evidence-only",
               "--db", str(db), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["conflicts"] >= 2
    with Store(db) as store:
        runs = {i: r for (_, i), r in job_runs(store, "c").items()}
    lic = runs["license_vs_exclusivity"]
    assert lic.status == "answered" and "[CONFLICT: license_grant vs exclusivity]" in lic.answer
    assert len(lic.citations) >= 2 and all(c.verified for c in lic.citations)
    assert "[CONFLICT: term vs termination_for_convenience]" in runs["term_vs_convenience"].answer


# -- killed and resumed ----------------------------------------------------------------------

# The child slows every item a little so the kill lands mid-job; nothing else differs.
CHILD = (
    "import sys, time, docqa.app.review as r\n"
    "orig = r.ask\n"
    "def slow(*a, **k):\n"
    "    time.sleep(0.04)\n"
    "    return orig(*a, **k)\n"
    "r.ask = slow\n"
    "from docqa.app.cli import main\n"
    "sys.argv = ['docqa'] + sys.argv[1:]\n"
    "main()\n"
)


def _count(db: Path) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT count(*) FROM runs WHERE job_id = 'k'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def test_sigkill_and_resume_answers_everything_exactly_once(tmp_path):
    pdf = write_sample_contract_pdf(tmp_path / "a.pdf")
    txt = tmp_path / "b.txt"
    txt.write_text(CONFLICTING)
    db = tmp_path / "k.db"
    cmd = [sys.executable, "-c", CHILD, "review", str(pdf), str(txt), "--checklist", "contract_review",
           "--job", "k", "--evidence-only", "--db", str(db), "--json"]
    total = 2 * len(load_checklist("contract_review").items)
    kills = 0
    for threshold in (3, 17, 30):  # kill points: early, mid-document, in the second document
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while _count(db) < threshold and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        assert _count(db) < total
    assert kills == 3
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["answered_now"] + summary["done_before"] == total
    con = sqlite3.connect(db)
    pairs = con.execute("SELECT doc_ids, item_id, count(*) FROM runs WHERE job_id = 'k' GROUP BY doc_ids, item_id").fetchall()
    assert len(pairs) == total and all(n == 1 for *_, n in pairs)
    # Every run is whole: each job_items row points at a run, and on the sample contract
    # (where every item has evidence, see sample_job) every run has its citations.
    assert con.execute("SELECT count(*) FROM job_items WHERE job_id = 'k'").fetchone()[0] == total
    empty = con.execute("SELECT count(*) FROM runs r WHERE job_id = 'k' AND kind = 'review' AND doc_ids LIKE ?"
                        " AND NOT EXISTS (SELECT 1 FROM citations c WHERE c.run_id = r.id)",
                        [f'%{Store(db).resolve(str(pdf))}%']).fetchone()[0]
    assert empty == 0
    assert con.execute("SELECT status FROM jobs WHERE id = 'k'").fetchone()[0] == "done"
