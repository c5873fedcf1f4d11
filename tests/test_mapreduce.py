"""Map-reduce over the sample contract with a scripted model: only quotes that are really in
a segment survive, the reduce groups and de-duplicates them, and an interrupted run resumes."""

import re

import pytest

from docqa.app.mapreduce import map_reduce
from docqa.app.service import Runtime
from docqa.app.store import Store
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.textnorm import normalize
from docqa.pipelines.ingest.record import make_record

QUESTION = "List every termination right."
REAL = [
    "Customer may terminate this Agreement for convenience upon ninety (90) days' prior written notice",
    "Either party may terminate this Agreement if the other party materially breaches it",
]
FAKE = "Licensor may terminate this Agreement at any time without notice"


class Scripted:
    """Answers each map prompt with whichever real quotes its excerpt holds, plus a fabrication."""

    def __init__(self, fail_after=None):
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, messages):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.calls += 1
        excerpt = messages[-1]["content"]
        header = re.search(r"\[PAGE:(\d+), LINE:(\d+)-(\d+)\]", excerpt)
        flat = normalize(excerpt)
        out = [f'"{q}" [PAGE:{header[1]}, LINE:{header[2]}-{header[3]}]' for q in REAL if normalize(q) in flat]
        out.append(f'"{FAKE}" [PAGE:{header[1]}, LINE:{header[2]}]')
        return "\n".join(out)


@pytest.fixture
def store(tmp_path):
    pdf = write_sample_contract_pdf(tmp_path / "c.pdf")
    doc = ingest_file(pdf, segment_tokens=150)  # several segments, so there is something to map
    assert len(doc.segments) >= 4
    s = Store(tmp_path / "db.sqlite")
    s.add_record(make_record(doc))
    return s, doc


def test_map_reduce_keeps_only_verified_quotes_grouped_by_section(store):
    s, doc = store
    gen = Scripted()
    run = map_reduce(Runtime(s), [doc.doc_id], QUESTION, generate=gen, model_name="scripted")
    assert gen.calls == len(doc.segments)
    assert run.status == "answered" and run.kind == "mapreduce"
    assert FAKE.lower() not in run.answer.lower()
    assert all(c.verified for c in run.citations)
    for q in REAL:
        (c,) = [c for c in run.citations if normalize(q) in normalize(c.quote)]
        # the cited lines really hold the quote
        assert normalize(q) in normalize(doc.lines_text(c.span.page, c.span.line_start, c.span.line_end))
    assert "3.2 Termination for Convenience:" in run.answer or "Termination for Convenience" in run.answer
    assert run.timings["rejected_citations"] >= len(doc.segments)  # every fabrication was refused


def test_interrupted_map_resumes_without_rereading(store):
    s, doc = store
    with pytest.raises(KeyboardInterrupt):
        map_reduce(Runtime(s), [doc.doc_id], QUESTION, generate=Scripted(fail_after=2), model_name="scripted")
    second = Scripted()
    run = map_reduce(Runtime(s), [doc.doc_id], QUESTION, generate=second, model_name="scripted")
    assert second.calls == len(doc.segments) - 2
    assert run.timings["resumed_segments"] == 2
    assert run.status == "answered"


def test_nothing_relevant_is_not_found(store):
    s, doc = store
    run = map_reduce(Runtime(s), [doc.doc_id], "What colour is the sky?", generate=lambda m: "NONE", model_name="scripted")
    assert run.status == "not_found" and not run.citations
