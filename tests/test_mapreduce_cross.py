"""Map-reduce over several documents flags where they disagree: generated PDFs with known
facts (a master agreement, an order form that contradicts it, and one that agrees), mapped
by a scripted model that quotes every line of its excerpt."""

import re

import pytest
from docqa.app.mapreduce import map_reduce
from docqa.app.service import Runtime
from docqa.app.store import Store
from docqa.fixtures.make_pdf import pdf_bytes
from docqa.pipelines.answer.conflicts import detect_cross_conflicts
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.textnorm import normalize
from docqa.pipelines.ingest.record import make_record

QUESTION = "What are the fees, the termination notice and the governing law?"


def _contract(title: str, *, fee: str, notice: str, law: str, date: str) -> list[list[str]]:
    return [
        [
            title,
            f'This agreement is entered into as of {date} (the "Effective Date") between',
            "Northwind Analytics Inc. and Bluebird Logistics LLC.",
            "",
            f"1. Fees. Customer shall pay a monthly service fee of {fee}, invoiced monthly.",
            "",
            "2. Term. This agreement continues until all services are complete.",
        ],
        [
            f"3. Termination. Either party may terminate this agreement upon {notice}' written notice.",
            "",
            f"4. Governing Law. This agreement is governed by the laws of the State of {law}.",
            "",
            "5. Notices. Notices are given in writing to the addresses above.",
        ],
    ]


MASTER = _contract("MASTER SERVICES AGREEMENT", fee="$10,000", notice="sixty (60) days",
                   law="Delaware", date="January 15, 2024")
CONFLICTING = _contract("ORDER FORM NO. 1", fee="$12,500", notice="ninety (90) days",
                        law="New York", date="March 1, 2024")
AGREEING = _contract("ORDER FORM NO. 2", fee="$10,000", notice="sixty (60) days",
                     law="Delaware", date="January 15, 2024")


def quote_every_line(messages):
    """A map step that extracts every line of its excerpt, citing the excerpt's lines."""
    excerpt = messages[-1]["content"].split("[EXCERPT]\n", 1)[1].split("\n[END OF EXCERPT]", 1)[0]
    out = []
    for block in excerpt.split("\n\n"):
        head, *lines = block.split("\n")
        m = re.match(r"\[PAGE:(\d+), LINE:(\d+)-(\d+)\]", head)
        out += [f'"{ln}" [PAGE:{m[1]}, LINE:{m[2]}-{m[3]}]' for ln in lines if len(ln) >= 25]
    return "\n".join(out)


@pytest.fixture
def library(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    docs = {}
    for name, pages in (("master", MASTER), ("conflicting", CONFLICTING), ("agreeing", AGREEING)):
        f = tmp_path / f"{name}.pdf"
        f.write_bytes(pdf_bytes(pages))
        doc = ingest_file(f)
        store.add_record(make_record(doc))
        docs[name] = doc
    return store, docs


def _conflict_lines(answer: str) -> list[str]:
    return [ln for ln in answer.splitlines() if ln.startswith("[CONFLICT:")]


def test_disagreeing_documents_are_flagged_with_both_sides_cited(library):
    store, docs = library
    a, b = docs["master"], docs["conflicting"]
    run = map_reduce(Runtime(store), [a.doc_id, b.doc_id], QUESTION, generate=quote_every_line, model_name="scripted")
    assert run.status == "answered"
    flags = _conflict_lines(run.answer)
    tag = f"[CONFLICT: {a.doc_id} vs {b.doc_id}]"
    expected = {
        "governing law": ("Delaware", "New York"),
        "termination notice": ("sixty (60) days", "ninety (90) days"),
        "monthly service fee": ("$10,000", "$12,500"),
        "effective date": ("January 15, 2024", "March 1, 2024"),
    }
    for what, (va, vb) in expected.items():
        (line,) = [ln for ln in flags if what in ln]
        assert line.startswith(tag) and f"{va} in {a.doc_id} but {vb} in {b.doc_id}" in line, line
        labels = re.findall(r"\[DOC:(\w+), PAGE:(\d+), LINE:(\d+)(?:-(\d+))?\]", line)
        assert [d for d, *_ in labels] == [a.doc_id, b.doc_id], line
        # Each side's label points at lines of its own document that hold the value.
        for (doc_id, page, l1, l2), value in zip(labels, (va, vb)):
            doc = docs["master"] if doc_id == a.doc_id else docs["conflicting"]
            assert normalize(value) in normalize(doc.lines_text(int(page), int(l1), int(l2 or l1)))
            (cite,) = [c for c in run.citations if c.doc_id == doc_id and c.span.page == int(page)
                       and c.span.line_start == int(l1) and normalize(value) in normalize(c.quote)][:1]
            assert cite.verified
    # Clauses that say the same thing in both are not flagged.
    assert not [ln for ln in flags if "Notices" in ln or "until all services" in ln]
    assert all(c.verified for c in run.citations)


def test_agreeing_documents_are_not_flagged(library):
    store, docs = library
    run = map_reduce(Runtime(store), [docs["master"].doc_id, docs["agreeing"].doc_id], QUESTION,
                     generate=quote_every_line, model_name="scripted")
    assert run.status == "answered"
    assert "[CONFLICT" not in run.answer


def test_a_value_stated_in_both_documents_is_no_conflict(tmp_path):
    """A document that names both notice periods agrees with one that names either; each
    side is the whole document, so the rules see every sentence."""
    texts = {
        "two": "Supplier may terminate this agreement upon sixty (60) days' written notice.\n\n"
               "Customer may terminate this agreement upon ninety (90) days' written notice.\n",
        "one": "Either party may terminate this agreement upon ninety (90) days' written notice.\n",
        "other": "Either party may terminate this agreement upon thirty (30) days' written notice.\n",
    }
    docs = {}
    for name, text in texts.items():
        f = tmp_path / f"{name}.txt"
        f.write_text(text)
        docs[name] = ingest_file(f)
    whole = lambda *names: {docs[n].doc_id: [(0, len(docs[n].text))] for n in names}
    by_id = {d.doc_id: d for d in docs.values()}
    assert detect_cross_conflicts(by_id, whole("two", "one")) == []
    (f,) = detect_cross_conflicts(by_id, whole("one", "other"))
    assert f.rule == "durations_disagree" and "termination notice" in f.text
    assert f.a.verified and f.b.verified and f.a.doc_id != f.b.doc_id
    # Against a document naming 60 and 90 days, 30 days disagrees with each of them.
    assert len(detect_cross_conflicts(by_id, whole("two", "other"))) == 2


def test_three_documents_are_compared_pairwise(library):
    store, docs = library
    a, b, c = docs["master"], docs["conflicting"], docs["agreeing"]
    run = map_reduce(Runtime(store), [a.doc_id, b.doc_id, c.doc_id], QUESTION, generate=quote_every_line,
                     model_name="scripted")
    flags = _conflict_lines(run.answer)
    pairs = {tuple(re.match(r"\[CONFLICT: (\w+) vs (\w+)\]", ln).groups()) for ln in flags}
    assert pairs == {(a.doc_id, b.doc_id), (b.doc_id, c.doc_id)}
    # the same four disagreements for each pair that involves the order form
    assert len(flags) == 8
