"""`docqa summarize --model DIR --device D`: an HF checkpoint directory and a device reach the
engine through the same `Engine.load` path as `ask` (a tiny random Llama: the words are
nonsense, but under the quote plan every statement is still a verified quote)."""

import json

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.textnorm import normalize

pytest.importorskip("transformers", reason="tiny checkpoints are built with transformers' config classes")
from test_engine_vs_hf import make_tiny_hf_dir  # noqa: E402


def test_summarize_with_an_hf_dir_on_a_device(tmp_path):
    import torch

    from docqa.app.store import Store

    model = tmp_path / "tiny_llama"
    model.mkdir()
    make_tiny_hf_dir(model, "llama")
    pdf = write_sample_contract_pdf(tmp_path / "c.pdf")
    db = str(tmp_path / "t.db")
    assert CliRunner().invoke(app, ["ingest", str(pdf), "--db", db]).exit_code == 0
    r = CliRunner().invoke(app, ["summarize", str(pdf), "--model", str(model), "--device", "cpu", "--length", "brief",
                                 "--json", "--db", db], env={"DOCQA_DEBUG": "1"})
    assert r.exit_code == 0, r.output
    value = json.loads(r.stdout)
    assert value["model"] == str(model) and value["stats"]["segments"] >= 1
    with Store(db) as store:
        doc = store.get_document(value["documents"][0]["doc_id"])
    cites = [c for b in value["blocks"] for s in b["sentences"] for c in s["citations"]]
    assert cites and value["dropped_sentences"] == 0
    for c in cites:
        assert normalize(c["quote"]) in normalize(doc.lines_text(c["page"], c["line_start"], c["line_end"]))
    if not torch.cuda.is_available():  # the device is the engine's: no GPU here is one error line
        r = CliRunner().invoke(app, ["summarize", str(pdf), "--model", str(model), "--device", "cuda", "--db", db],
                               env={"DOCQA_DEBUG": "0"})
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error:") and "cuda" in lines[0].lower()
