"""`docqa chat`: several questions in one session over the project's sample contract, whose
page/line layout is known by construction (fixtures/make_pdf.py)."""

import json

import pytest
from typer.testing import CliRunner

from docqa.app.service import AskSettings
from docqa.app.chat import ChatSession, questions
from docqa.app.cli import app
from docqa.app.store import Store
from docqa.fixtures.make_pdf import write_sample_contract_pdf


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    pdf = write_sample_contract_pdf(tmp / "sample_contract.pdf")
    db = tmp / "docqa.db"
    r = CliRunner().invoke(app, ["ingest", str(pdf), "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    return pdf, db


def test_questions_skip_blanks_and_stop_at_quit():
    assert list(questions(["a?\n", "\n", "  b?  \n", "quit\n", "c?\n"])) == ["a?", "b?"]


def test_chat_answers_each_line_and_stores_runs(ingested):
    pdf, db = ingested
    stdin = "How much notice must the Customer give to terminate for convenience?\n\nWhich law governs?\nexit\nignored?\n"
    r = CliRunner().invoke(app, ["chat", str(pdf), "--db", str(db), "--evidence-only", "--json"], input=stdin)
    assert r.exit_code == 0, r.output
    answers = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert [a["question"] for a in answers] == ["How much notice must the Customer give to terminate for convenience?",
                                                "Which law governs?"]
    # The termination clause sits on page 2, lines 7-8 of the sample contract (test_ask_cli).
    top = answers[0]["citations"][0]
    assert (top["page"], top["line_start"], top["line_end"]) == (2, 7, 8)
    with Store(db) as store:
        kinds = [row["kind"] for row in store.db.query("SELECT kind FROM runs WHERE id IN (?, ?)",
                                                        [a["run_id"] for a in answers])]
    assert kinds == ["chat", "chat"]


def test_session_loads_documents_and_model_once(ingested, monkeypatch):
    """The engine is loaded when the session opens, and the documents once: later questions
    neither reload the model nor re-read the store."""
    pdf, db = ingested
    with Store(db) as store:
        session = ChatSession(store, [str(pdf)], AskSettings(max_tokens=24, budget_tokens=600))
        assert session.model_s > 0
        calls = []
        real = store.get_document
        monkeypatch.setattr(store, "get_document", lambda ref: calls.append(ref) or real(ref))
        runs = [session.ask(q) for q in ("Which law governs?", "How long do the confidentiality obligations survive?")]
    assert calls == []
    assert all(r.timings["load_model_s"] < 0.5 for r in runs)
    assert all(r.model.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") for r in runs)
