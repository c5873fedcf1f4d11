"""`docqa rename` and `docqa rm` through the CLI and the store, and the `docs` / `review`
tables at 80 columns."""

from __future__ import annotations

import json
from types import SimpleNamespace

from rich.console import Console
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.app.store import Store
from docqa.app.tables import docs_table, review_table

A = """# Supply Agreement

## 1. Termination

Either party may terminate this Agreement for convenience on ninety (90) days notice.

## 2. Governing Law

This Agreement is governed by the laws of the State of Delaware.
"""

B = """# Licence Agreement

## 1. Governing Law

This Licence is governed by the laws of England and Wales.
"""


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def test_rm_removes_a_document_and_its_runs_cleanly(tmp_path):
    db = tmp_path / "d.db"
    a, b = tmp_path / "supply.md", tmp_path / "licence.md"
    a.write_text(A)
    b.write_text(B)
    id_b = json.loads(_cli("ingest", b, "--db", db, "--json").stdout)[0]["doc_id"]
    with Store(db) as s:
        before = s.counts()
    id_a = json.loads(_cli("ingest", a, "--db", db, "--json").stdout)[0]["doc_id"]
    only_a = json.loads(_cli("ask", a, "Which law governs?", "--evidence-only", "--json", "--db", db).stdout)
    both = json.loads(_cli("ask", a, b, "Which law governs?", "--evidence-only", "--json", "--db", db).stdout)
    assert {c["doc_id"] for c in both["citations"]} == {id_a, id_b}

    r = _cli("rm", id_a, "--json", "--db", db)
    removed = json.loads(r.stdout)["removed"]
    assert removed["runs"] == 1 and removed["pages"] >= 1 and removed["citations_in_shared_runs"] >= 1

    with Store(db) as s:
        after = s.counts()
        # Every table and FTS index is back to what it held before `a` was ingested, except
        # the run over both documents, which keeps its citations of `b`.
        assert {k: v for k, v in after.items() if k not in ("runs", "citations")} == \
            {k: v for k, v in before.items() if k not in ("runs", "citations")}
        runs = s.db.execute("SELECT id FROM runs").fetchall()
        assert [r[0] for r in runs] == [both["run_id"]]
        cited = {r[0] for r in s.db.execute("SELECT DISTINCT doc_id FROM citations")}
        assert cited == {id_b}
        assert not s.search("Delaware") and s.search("England")
    assert only_a["run_id"] not in _cli("runs", "--db", db).stdout
    assert [d["doc_id"] for d in json.loads(_cli("docs", "--json", "--db", db).stdout)] == [id_b]
    r = CliRunner().invoke(app, ["rm", id_a, "--db", str(db)])
    assert r.exit_code == 1 and id_a in r.output


def test_rename_sets_the_title_docs_shows(tmp_path):
    db = tmp_path / "d.db"
    a = tmp_path / "supply.md"
    a.write_text(A)
    did = json.loads(_cli("ingest", a, "--db", db, "--json").stdout)[0]["doc_id"]
    _cli("rename", a, "Acme–Beta supply agreement, 2021", "--db", db)
    docs = json.loads(_cli("docs", "--json", "--db", db).stdout)
    assert docs[0]["doc_id"] == did and docs[0]["title"] == "Acme–Beta supply agreement, 2021"
    r = CliRunner().invoke(app, ["rename", a, "   ", "--db", str(db)])
    assert r.exit_code == 1


def _render(table) -> str:
    console = Console(width=80, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def test_docs_table_wraps_long_names_at_80_columns():
    long = "contract_GooseheadInsurance_Franchise_Agreement_with_Addenda_and_Exhibits.pdf"
    infos = [SimpleNamespace(doc_id="3f2a9c01b7de", type="pdf", pages=115, sections=499, title=None,
                             path=f"/x/{long}"),
             SimpleNamespace(doc_id="aa11bb22cc33", type="pdf", pages=260, sections=76,
                             title="American Express Company — Form 10-K, fiscal year 2022",
                             path="/x/filing_AMERICANEXPRESS_2022_10K.pdf")]
    text = _render(docs_table(infos))
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = "".join(line.strip() for line in text.splitlines())
    assert long in flat.replace(" ", "")  # folded over lines, never cut
    assert "American Express Company" in text and "3f2a9c01b7de" in text and "aa11bb22cc33" in text


def test_review_table_keeps_the_item_column_at_80_columns():
    rows = [("termination_for_convenience", "answered",
             "[PAGE:12, LINE:3-5] Either party may terminate this Agreement for convenience on ninety (90) "
             "days written notice to the other party, without cause."),
            ("governing_law", "not_found", "")]
    text = _render(review_table(rows))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "termination_for_convenience" in text and "governing_law" in text
    assert "without cause." in text


def test_rm_drops_the_documents_cached_kv(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = tmp_path / "d.db"
    a = tmp_path / "supply.md"
    a.write_text(A)
    did = json.loads(_cli("ingest", a, "--db", db, "--json").stdout)[0]["doc_id"]
    with Store(db) as s:
        sha = s.get_document(did).content_sha256
    kv = tmp_path / "cache" / "docqa" / "kv" / "ab"
    kv.mkdir(parents=True)
    t = {"kmin": torch.zeros(1)}
    save_file(t, str(kv / "ab1.safetensors"), metadata={"namespace": json.dumps([sha, "model", "s", [1]])})
    save_file(t, str(kv / "ab2.safetensors"), metadata={"namespace": json.dumps(["f" * 64, "model", "s", [1]])})
    removed = json.loads(_cli("rm", did, "--json", "--db", db).stdout)["removed"]
    assert removed["kv_files"] == 1
    assert not (kv / "ab1.safetensors").exists() and (kv / "ab2.safetensors").exists()
