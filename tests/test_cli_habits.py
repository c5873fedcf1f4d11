"""Issue 17's CLI habits and bad-input loose ends, through the CLI as users run it (without
DOCQA_DEBUG, which would turn handled errors into tracebacks): each case checks the message,
the exit code and that nothing was lost (the database as before, or the document intact)."""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.app.clikit import EXIT_NOTHING_INGESTED
from docqa.fixtures.make_pdf import write_sample_contract_pdf

USAGE_EXIT = 2  # click's exit code for a usage error


def run(args: list[str], input: str | bytes | None = None):
    # DOCQA_DEBUG unset: the path users take (with it, unexpected errors raise instead).
    return CliRunner().invoke(app, args, input=input, env={"DOCQA_DEBUG": None})


def counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                           " AND name NOT LIKE 'sqlite%'")]
        return {n: con.execute(f"SELECT count(*) FROM [{n}]").fetchone()[0] for n in names}
    finally:
        con.close()


@pytest.fixture
def db(tmp_path) -> Path:
    db = tmp_path / "t.db"
    md = tmp_path / "terms.md"
    md.write_text("# Terms\n\nThe Supplier shall deliver the goods within 30 days.\n", encoding="utf-8")
    assert run(["ingest", str(md), "--db", str(db)]).exit_code == 0
    return db


@pytest.mark.parametrize("as_json", [False, True])
def test_bad_parameter_inside_a_command_is_a_usage_error(db, as_json):
    before = counts(db)
    res = run(["ask", "only-a-question", "--db", str(db)] + (["--json"] if as_json else []))
    assert res.exit_code == USAGE_EXIT
    assert res.stderr.startswith("Usage: docqa ask [OPTIONS]")
    assert "Invalid value: give at least one document and the question" in res.stderr
    assert "unexpected" not in res.stderr and "DOCQA_DEBUG" not in res.stderr
    assert res.stdout == ""
    res = run(["ask", "terms", "--map-reduce", "--evidence-only", "Which?", "--db", str(db)])
    assert res.exit_code == USAGE_EXIT and "--map-reduce needs a model" in res.stderr
    assert counts(db) == before


def test_version_and_completion():
    res = run(["--version"])
    assert res.exit_code == 0 and res.stdout == f"docqa {version('docqa')}\n"
    # `--show-completion` names the shell it finds among its parent processes (a test runner's
    # may have none, e.g. started in the background): run it from bash, as a user does ("; exit"
    # keeps bash from replacing itself with its last command, so it stays the parent)
    cli = f"{shlex.quote(sys.executable)} -c 'from docqa.app.cli import main; main()' --show-completion; exit $?"
    res = subprocess.run(["bash", "-c", cli], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "complete" in res.stdout and "_DOCQA_COMPLETE" in res.stdout, res.stderr
    assert "--install-completion" in run(["--help"]).stdout


def test_dash_ingests_a_document_from_stdin(db):
    text = "Notice\n\nEither party may terminate on 90 days' written notice.\n"
    res = run(["ingest", "-", "--db", str(db), "--json"], input=text)
    assert res.exit_code == 0, res.stderr
    (doc,) = json.loads(res.stdout)
    assert (doc["path"], doc["type"], doc["status"]) == ("<stdin>", "text", "added")
    res = run(["show", doc["doc_id"], "--page", "1", "--json", "--db", str(db)])
    assert [ln["text"] for ln in json.loads(res.stdout)["lines"]] == text.splitlines()
    html = "<!doctype html><html><body><h1>Fees</h1><p>The fee is 10 USD.</p></body></html>"
    res = run(["ingest", "-", "--db", str(db), "--json"], input=html)
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["type"] == "html"
    before = counts(db)
    res = run(["ingest", "-", "--db", str(db)], input="")
    assert res.exit_code == EXIT_NOTHING_INGESTED
    assert res.stderr == "error: <stdin>: empty input (0 bytes)\n"
    assert counts(db) == before


@pytest.mark.parametrize("name,shown", [("a\nb.pdf", "a\\nb.pdf"), ("x\x1b[2Jy.pdf", "x\\x1b[2Jy.pdf"),
                                         ("tab\there\r.md", "tab\\there\\r.md")])
def test_control_characters_in_a_path_are_escaped_on_one_line(db, tmp_path, name, shown):
    before = counts(db)
    bad = tmp_path / name
    bad.write_bytes(b"%PDF-1.4 not really")  # a broken PDF (or text-free markdown) with that name
    missing = tmp_path / ("missing-" + name)
    res = run(["ingest", str(bad), str(missing), "--db", str(db)])
    assert res.exit_code == EXIT_NOTHING_INGESTED
    lines = res.stderr.splitlines()
    assert len(lines) == 2 and "\x1b" not in res.stderr and "\r" not in res.stderr
    assert lines[1] == f"error: {tmp_path}/missing-{shown}: no such file"
    assert lines[0].startswith(f"error: {tmp_path}/{shown}: ")
    assert counts(db) == before


def test_mostly_utf8_text_decodes_as_utf8_and_says_so(db, tmp_path):
    good = "Le délai de préavis est de trente jours — à compter de la réception. Ça coûte 5 €.\n"
    raw = good.encode() * 3
    damaged = raw[:40] + b"\xff" + raw[40:]  # one stray byte, as a truncated copy leaves
    p = tmp_path / "notice.txt"
    p.write_bytes(damaged)
    res = run(["ingest", str(p), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.stderr
    (doc,) = json.loads(res.stdout)
    assert doc["warning"] == "decoded as utf-8 (1 invalid byte sequence replaced by U+FFFD)"
    res = run(["show", doc["doc_id"], "--page", "1", "--json", "--db", str(db)])
    lines = [ln["text"] for ln in json.loads(res.stdout)["lines"]]
    assert lines == damaged.decode("utf-8", errors="replace").splitlines()  # nothing but the byte lost
    assert lines[1:] == [good.rstrip("\n")] * 2
    res = run(["ingest", str(p), "--db", str(db)])  # the human-readable form: a warning line
    assert res.exit_code == 0  # already ingested: no parse, no warning
    p2 = tmp_path / "notice2.txt"
    p2.write_bytes(damaged + b"\n")
    res = run(["ingest", str(p2), "--db", str(db)])
    assert res.stderr == f"warning: {p2}: decoded as utf-8 (1 invalid byte sequence replaced by U+FFFD)\n"


def test_legacy_code_page_text_is_still_detected(db, tmp_path):
    """The UTF-8 rule above must not capture text that has no UTF-8 in it at all."""
    from docqa.pipelines.ingest.text import decode

    text = ("Der Käufer zahlt den Kaufpreis innerhalb von dreißig Tagen nach Übergabe der Ware. "
            "Die Gewährleistung beträgt zwölf Monate ab Lieferung.\n") * 4
    decoded, encoding = decode("x.txt", text.encode("latin-1"))
    assert decoded == text and not encoding.startswith("utf-8")


def test_printed_export_command_is_shell_quoted(tmp_path):
    pdf = write_sample_contract_pdf(tmp_path / "sample_contract.pdf")
    db = tmp_path / "t.db"
    job = "q3 review; echo $HOME"
    res = run(["review", str(pdf), "--checklist", "contract_review", "--job", job, "--evidence-only",
               "--db", str(db)])
    assert res.exit_code == 0, res.stderr
    hint = res.stderr.strip().splitlines()[-1].split("report: ", 1)[1]
    assert shlex.split(hint) == ["docqa", "export", job, "--format", "html", "-o", "report.html"]


def test_markdown_export_neutralises_links_images_and_html(tmp_path):
    """Rendered with markdown-it (CommonMark, what rich uses): document text makes no link,
    image or HTML element, and its words survive as text."""
    from markdown_it import MarkdownIt

    db = tmp_path / "t.db"
    doc = tmp_path / "trap.txt"
    doc.write_text("Payment terms. Pay within 30 days via [our portal](http://evil.example/pay) "
                   "![pixel](http://evil.example/p.gif) <img src=x onerror=alert(1)> "
                   "<http://evil.example/auto> *all* fees_due `now`.\n", encoding="utf-8")
    assert run(["ingest", str(doc), "--db", str(db)]).exit_code == 0
    res = run(["ask", str(doc), "When is payment due?", "--evidence-only", "--json", "--db", str(db)])
    assert res.exit_code == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    res = run(["export", run_id, "--format", "md", "--db", str(db)])
    assert res.exit_code == 0, res.stderr
    html = MarkdownIt("commonmark").render(res.stdout)
    assert "evil.example" in html  # the text is there ...
    for made in ('href="http://evil', "<img", 'src="http://evil', "<em>", "<code>now"):
        assert made not in html  # ... but nothing renders from it
    assert "[our portal](http://evil.example/pay)" in html and "&lt;img src=x" in html
