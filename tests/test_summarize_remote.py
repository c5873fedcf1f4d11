"""`docqa summarize --model openai:…` against `docqa serve` on 127.0.0.1 (started and stopped
inside the test, as in test_serve.py): the map step sends the free-writing prompt to the
server and keeps what it replied — the engine's own greedy text for the same messages is the
reference — and only statements whose quotes verify reach the summary."""

import socket

import pytest
from typer.testing import CliRunner

from docqa.app.service import Runtime
from docqa.app.cli import app
from docqa.app.store import Store
from docqa.app.summarize import SummarizeSettings, _extractions, settings_key, summarize
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.answer.citations import parse_citations
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.answer.summarize import LENGTHS, candidates, map_messages
from docqa.pipelines.textnorm import normalize
from docqa.pipelines.ingest.record import make_record

from test_serve import serving


@pytest.fixture(scope="module")
def engine():
    return Runtime().engine(None).engine


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    from docqa.engine.prefix_cache import PrefixCache

    with serving(engine, PrefixCache.for_engine(engine, cache_dir=tmp_path_factory.mktemp("kv"))) as srv:
        yield srv


@pytest.fixture
def contract(tmp_path):
    pdf = write_sample_contract_pdf(tmp_path / "sample_contract.pdf")
    doc = ingest_file(pdf)
    store = Store(tmp_path / "db.sqlite")
    store.add_record(make_record(doc))
    yield pdf, doc, store
    store.close()


def test_summarize_through_docqa_serve(server, engine, contract):
    pdf, doc, store = contract
    settings = SummarizeSettings(model=f"openai:{server.url}", length="brief", max_tokens=24, cluster="section")
    run, summ = summarize(store, [doc.doc_id], settings)
    model = f"openai:{server.url}#smollm2-test"  # the server's model, asked for by the client
    assert run.model == model
    # A server sends text, not logits: the map ran the free-writing prompt (quote=False) ...
    free = SummarizeSettings(model=settings.model, length="brief", max_tokens=24, quote=False)
    stored = _extractions(store, settings_key(model, free), [doc.doc_id])
    assert sorted(stored) == [(doc.doc_id, s.index) for s in doc.segments]
    for seg in doc.segments:
        ext = stored[(doc.doc_id, seg.index)]
        messages = map_messages(doc, candidates(doc, seg, LENGTHS["brief"].candidates), LENGTHS["brief"].per_segment,
                                None, quote=False)
        ids = engine.chat_prompt(messages[1]["content"], system=messages[0]["content"])
        # ... and kept the server's reply, which is the engine's greedy text for those messages.
        assert ext.raw == engine.generate(ids, max_new_tokens=24).text
        assert len(ext.statements) + ext.rejected <= max(1, len(parse_citations(ext.raw)))
    # Whatever is shown cites lines that hold its quote.
    for c in summ.citations():
        assert c.verified and normalize(c.quote) in normalize(doc.lines_text(c.span.page, c.span.line_start, c.span.line_end))
    assert all(s.citations for s in summ.sentences())


def test_summarize_server_down_is_one_line_error(contract):
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pdf, _, store = contract
    r = CliRunner().invoke(app, ["summarize", str(pdf), "--db", str(store.path),
                                 "--model", f"openai:http://127.0.0.1:{port}/v1"], env={"DOCQA_DEBUG": "0"})
    assert r.exit_code == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and f"127.0.0.1:{port}" in lines[0]
    assert "not reachable" in lines[0]
