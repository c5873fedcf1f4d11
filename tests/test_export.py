"""`docqa export`: reports agree with the stored runs and the source text; HTML escapes
document text and links citations to the source."""

import json
import re

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.app.jobs import job_runs
from docqa.app.store import Store
from docqa.fixtures.make_pdf import write_sample_contract_pdf


def invoke(*args):
    return CliRunner().invoke(app, list(args), env={"DOCQA_DEBUG": "1"})


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    pdf = write_sample_contract_pdf(tmp / "sample_contract.pdf")
    hostile = tmp / "hostile.txt"
    hostile.write_text("GOVERNING LAW\n\n<script>alert('pwned')</script> This Agreement is governed by the laws "
                       "of the State of Delaware & <b>nothing</b> else.\n")
    db = tmp / "e.db"
    r = invoke("review", str(pdf), str(hostile), "--checklist", "contract_review", "--job", "ex",
               "--evidence-only", "--db", str(db))
    assert r.exit_code == 0, r.output
    return tmp, pdf, hostile, db


def export(db, ref, fmt, out):
    r = invoke("export", ref, "--format", fmt, "-o", str(out), "--db", str(db))
    assert r.exit_code == 0, r.output
    return out.read_text(encoding="utf-8")


def test_json_matches_the_stored_runs(job):
    tmp, pdf, _, db = job
    data = json.loads(export(db, "ex", "json", tmp / "r.json"))
    with Store(db) as store:
        runs = job_runs(store, "ex")
        pdf_id = store.resolve(str(pdf))
    assert data["kind"] == "job" and data["checklist"] == "contract-review"
    doc = next(d for d in data["documents"] if d["doc_id"] == pdf_id)
    for row in doc["rows"]:
        run = runs[(pdf_id, row["item_id"])]
        assert row["run_id"] == run.id and row["status"] == run.status
        assert [c["quote"] for c in row["evidence"]] == [c.quote for c in run.evidence]
    law = next(r for r in doc["rows"] if r["item_id"] == "governing_law")
    top = law["evidence"][0]
    # The sample contract's page 3, lines 10-11 (fixtures/sample_contract.txt, clause 7.1).
    assert (top["page"], top["line_start"], top["line_end"]) == (3, 10, 11)
    assert "governed by the laws of the State of New York" in top["quote"]
    assert top["href"] == pdf.resolve().as_uri() + "#page=3"


def test_html_is_self_contained_escaped_and_linked(job):
    tmp, pdf, hostile, db = job
    html = export(db, "ex", "html", tmp / "r.html")
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in html
    assert "&lt;b&gt;nothing&lt;/b&gt;" in html and "Delaware &amp;" in html
    assert not re.search(r"""(src|href)=["']https?:""", html)  # no external assets
    assert "default-src 'none'" in html
    assert f'href="{pdf.resolve().as_uri()}#page=3"' in html
    assert html.count("<table>") == 2  # one table per document
    assert "governed by the laws of the State of New York" in html


def test_markdown_escapes_and_quotes_the_source(job):
    tmp, _, _, db = job
    md = export(db, "ex", "md", tmp / "r.md")
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "> 7.1 Governing Law. This Agreement is governed by the laws of the State of New York, without" in md
    assert "### governing_law:" in md


def test_export_a_single_run(job):
    tmp, pdf, _, db = job
    r = invoke("ask", str(pdf), "Which law governs the agreement?", "--evidence-only", "--json", "--db", str(db))
    run_id = json.loads(r.stdout)["run_id"]
    data = json.loads(export(db, run_id, "json", tmp / "one.json"))
    assert data["kind"] == "run" and data["documents"][0]["rows"][0]["run_id"] == run_id


def test_unknown_ref_is_one_line(job):
    _, _, _, db = job
    r = CliRunner().invoke(app, ["export", "nope", "--format", "md", "--db", str(db)])
    assert r.exit_code == 1 and r.stderr.startswith("error: no job or run named 'nope'")
