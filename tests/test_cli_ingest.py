"""`docqa ingest`, `docs` and `show` end to end, checked against pypdf's own extraction."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from pypdf import PdfReader
from typer.testing import CliRunner

from docqa.app import cli, ingest
from docqa.app.cli import app

CORPUS = (Path(__file__).resolve().parents[2] / "shared" / "corpus").resolve()
CONTRACT = CORPUS / "pdf" / "contract_IBM_MSL_Outsourcing_Agreement.pdf"
HTML = CORPUS / "html" / "rfc7617_Basic_HTTP_Auth_small.html"
CIVIL_CODE = CORPUS / "zh" / "zh_PRC_Civil_Code_2020.pdf"
DOCQA = Path(sys.executable).with_name("docqa")
SHAPE = {"doc_id", "path", "type", "pages", "sections", "anchors", "segments"}


def run(args: list[str], **env):
    return CliRunner().invoke(app, args, env={"DOCQA_DEBUG": "1", **env})


def pypdf_lines(pdf: Path, page: int) -> list[str]:
    """pipelines/ingest/pdf.py's documented line rule applied to pypdf's own extract_text()."""
    text = PdfReader(pdf).pages[page - 1].extract_text()
    return [ln.rstrip() for ln in text.splitlines() if ln.rstrip()]


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    db = tmp_path_factory.mktemp("cli") / "docqa.db"
    res = run(["ingest", str(CONTRACT), str(HTML), str(CIVIL_CODE), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)
    return db, {Path(r["path"]).name: r for r in rows}


def test_ingest_json_shape_and_counts(ingested):
    db, rows = ingested
    assert set(rows) == {CONTRACT.name, HTML.name, CIVIL_CODE.name}
    for name, r in rows.items():
        assert SHAPE <= set(r), name
        assert r["status"] == "added"
        assert r["pages"] > 0 and r["segments"] > 0
    assert rows[CONTRACT.name]["type"] == "pdf" and rows[HTML.name]["type"] == "html"
    assert rows[CONTRACT.name]["pages"] == len(PdfReader(CONTRACT).pages)
    assert rows[CIVIL_CODE.name]["pages"] == len(PdfReader(CIVIL_CODE).pages)
    listed = {d["doc_id"]: d for d in json.loads(run(["docs", "--json", "--db", str(db)]).stdout)}
    for r in rows.values():
        d = listed[r["doc_id"]]
        assert (d["pages"], d["sections"], d["anchors"], d["segments"]) == (
            r["pages"], r["sections"], r["anchors"], r["segments"])


@pytest.mark.parametrize(
    "pdf,pages", [(CONTRACT, [1, 2, 17, 40, 75]), (CIVIL_CODE, [1, 9, 120, 234])]
)
def test_show_page_lines_agree_with_pypdf(ingested, pdf, pages):
    db, rows = ingested
    doc_id = rows[pdf.name]["doc_id"]
    for n in pages:
        res = run(["show", doc_id, "--page", str(n), "--json", "--db", str(db)])
        assert res.exit_code == 0, res.stderr
        shown = json.loads(res.stdout)
        assert shown["doc_id"] == doc_id and shown["page"] == n
        assert [ln["n"] for ln in shown["lines"]] == list(range(1, len(shown["lines"]) + 1))
        assert [ln["text"] for ln in shown["lines"]] == pypdf_lines(pdf, n), (pdf.name, n)


def test_show_html_unit_is_labelled(ingested):
    db, rows = ingested
    shown = json.loads(run(["show", str(HTML), "--page", "2", "--json", "--db", str(db)]).stdout)
    assert shown["doc_id"] == rows[HTML.name]["doc_id"] and shown["label"]
    assert shown["lines"] and all(ln["text"] for ln in shown["lines"])


def test_show_sections_anchors_and_summary(ingested):
    db, rows = ingested
    doc_id = rows[CONTRACT.name]["doc_id"]
    res = run(["show", doc_id[:6], "--sections", "--anchors", "--json", "--db", str(db)])
    assert res.exit_code == 0, res.stderr
    shown = json.loads(res.stdout)
    assert len(shown["sections"]) == rows[CONTRACT.name]["sections"]
    assert len(shown["anchors"]) == rows[CONTRACT.name]["anchors"]
    # The flat shape of the first release, key for key (sections and anchors hold a Span inside).
    assert list(shown["sections"][0]) == ["id", "number", "title", "level", "parent_id", "char_start", "char_end",
                                          "page_start", "line_start", "page_end", "line_end", "element_id"]
    assert list(shown["anchors"][0]) == ["type", "text", "value", "subtype", "char_start", "char_end", "page", "line",
                                         "section_id", "target_section_id"]
    text = run(["show", str(CONTRACT), "--db", str(db)])
    assert text.exit_code == 0 and doc_id in text.stdout and str(CONTRACT) in text.stdout
    human = run(["show", doc_id, "--sections", "--db", str(db)])
    assert human.exit_code == 0


def test_reingest_is_a_noop_and_new_path_is_recorded(ingested, tmp_path):
    db, rows = ingested
    con = sqlite3.connect(db)
    before = con.execute("SELECT count(*) FROM documents").fetchone()[0]
    res = run(["ingest", str(CONTRACT), "--db", str(db), "--json"])
    assert res.exit_code == 0
    (again,) = json.loads(res.stdout)
    assert again["status"] == "already ingested"
    assert again["doc_id"] == rows[CONTRACT.name]["doc_id"]
    same = SHAPE - {"path"}
    assert {k: again[k] for k in same} == {k: rows[CONTRACT.name][k] for k in same}
    copy = tmp_path / "copy.html"
    shutil.copy(HTML, copy)
    (moved,) = json.loads(run(["ingest", str(copy), "--db", str(db), "--json"]).stdout)
    assert moved["status"] == "new path" and moved["doc_id"] == rows[HTML.name]["doc_id"]
    assert con.execute("SELECT count(*) FROM documents").fetchone()[0] == before
    con.close()
    shown = json.loads(run(["show", str(copy), "--json", "--db", str(db)]).stdout)
    assert str(copy.resolve()) in shown["paths"]


def test_folder_ingest_skips_unsupported_and_hidden(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "notes.md").write_text("# Notes\n\nPayment is due in 30 days.\n")
    (folder / "readme.txt").write_text("Plain text file.\n")
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / ".hidden.md").write_text("# Hidden\n")
    res = run(["ingest", str(folder), "--db", str(tmp_path / "t.db"), "--json"])
    assert res.exit_code == 0, res.stderr
    assert sorted(Path(r["path"]).name for r in json.loads(res.stdout)) == ["notes.md", "readme.txt"]


def test_every_command_help_ends_with_an_example():
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        res = run([name, "--help"])
        assert res.exit_code == 0
        last = [ln.strip() for ln in res.stdout.split("Options:")[0].splitlines() if ln.strip()]
        assert any(ln.startswith("Example: docqa " + name) for ln in last), name


def test_unexpected_errors_are_one_line_for_users_and_raise_in_debug(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(ingest, "build_record", broken)
    note = tmp_path / "n.md"
    note.write_text("# N\n\ntext\n")
    args = ["ingest", str(note), "--db", str(tmp_path / "t.db")]
    res = CliRunner().invoke(app, args, env={"DOCQA_DEBUG": ""})
    assert res.exit_code == cli.EXIT_NOTHING_INGESTED
    assert res.stderr.count("\n") == 1 and "RuntimeError: parser exploded" in res.stderr
    res = CliRunner().invoke(app, args, env={"DOCQA_DEBUG": "1"})
    assert isinstance(res.exception, RuntimeError)


def test_two_processes_write_one_database_at_once(tmp_path):
    db = tmp_path / "shared.db"
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text("# Alpha\n\nThe first document.\n")
    b.write_text("# Beta\n\nThe second document.\n")
    env = {**os.environ, "DOCQA_DEBUG": "1"}
    # Both take the same files in opposite orders: they race on the same content too.
    procs = [
        subprocess.Popen([str(DOCQA), "ingest", *map(str, files), "--db", str(db), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for files in ([a, b, HTML], [HTML, b, a])
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert len(json.loads(out)) == 3
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM documents").fetchone()[0] == 3
    assert con.execute("SELECT count(*) FROM segments").fetchone()[0] == con.execute(
        "SELECT count(DISTINCT doc_id || '/' || idx) FROM segments").fetchone()[0]
    con.close()


@pytest.mark.slow
def test_whole_corpus_ingests(tmp_path):
    files = sorted(p for p in CORPUS.rglob("*") if p.suffix in (".pdf", ".html"))
    res = run(["ingest", *map(str, files), "--db", str(tmp_path / "all.db"), "--json"])
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == len(files) and not [r for r in rows if "error" in r]
    for r in rows:
        if r["type"] == "pdf":
            assert r["pages"] == len(PdfReader(r["path"]).pages)
