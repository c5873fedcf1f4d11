"""Quotes that run through the source's own quotation marks, on a real CUAD contract's opening
sentence (ArrayBioPharma–Ono licence, page 1, curly marks as the PDF prints them):

    THIS LICENSE, DEVELOPMENT AND COMMERCIALIZATION AGREEMENT (this “Agreement”) dated as of
    May 31, 2017 (the “Effective Date”), is made and entered into by and between Array ...

Contracts define their terms in quotes, so a quote that stops at the first mark (`... (the`)
cuts most clauses short. The constrained decoder must write such a quote whole, and the
citation parser must read it back and verify it."""

import pytest
import torch
from docqa.engine.generate import Engine
from docqa.pipelines.answer.citations import parse_citations, verify
from docqa.pipelines.answer.quote_constraint import QuoteDecoder, TokenTable, plan_for
from docqa.pipelines.ingest.passages import make_passages
from docqa.pipelines.textnorm import normalize

from corpus import ARRAY, first_pages_doc
from test_quote_constraint import run

DATED = "dated as of May 31, 2017 (the \u201cEffective Date\u201d), is made and entered into by and between Array BioPharma Inc."


@pytest.fixture(scope="module")
def array(tmp_path_factory):
    doc = first_pages_doc(ARRAY, 1, tmp_path_factory.mktemp("array"))
    return doc, make_passages(doc)


@pytest.fixture(scope="module")
def table():
    return TokenTable.from_tokenizer(Engine.load_tokenizer())  # the default model's; no weights are read


def _copying(table, target: str, then: list[str]):
    """A model that copies `target` (longest matching token first), then wants `then` in order
    (one string a step, e.g. the closing mark), then to end once its label is written."""
    def score(step, out):
        written = "".join(table.texts[i] for i in out)
        logits = torch.zeros(len(table.texts))
        if len(written) < len(target) + 1:  # the opening mark, then the target
            rest = ('"' + target)[len(written):]
            for t, ids in table.by_text.items():
                if rest.startswith(t):
                    logits[ids] = 10.0 + len(t)
            return logits
        after, k = written[len(target) + 1:], 0
        while k < len(then) and after.startswith(then[k]):
            after, k = after[len(then[k]):], k + 1
        if k < len(then) and not after:
            logits[table.by_text[then[k]]] = 30.0
        else:  # after the label: end here rather than quote again
            logits[list(table.stop_ids)] = 30.0
        return logits
    return score


def _run(decoder, score, max_tokens=120):
    """The decoded text, driven as Engine.generate does (test_quote_constraint.run)."""
    return "".join(decoder.table.texts[i] for i in run(decoder, score, max_tokens))


@pytest.mark.parametrize("marks", ["curly", "straight"])
def test_a_quote_runs_through_the_marks_the_source_has_and_verifies(array, table, marks):
    doc, passages = array
    target = DATED if marks == "curly" else DATED.replace("\u201c", '"').replace("\u201d", '"')
    decoder = QuoteDecoder(plan_for(passages), table, max_tokens=120)
    text = _run(decoder, _copying(table, target, ['"']))
    (quote, label), = decoder.cited
    assert normalize(quote) == normalize(target), text  # not cut at "(the"
    (span,) = parse_citations(text)
    c = verify(span, {doc.doc_id: doc}, doc.doc_id)
    assert c.verified and not c.relocated, (text, c.note)
    assert normalize(c.quote) == normalize(target)
    assert doc.text[c.span.char_start:c.span.char_end].startswith("dated as of")
    assert doc.text[c.span.char_start:c.span.char_end].endswith("Array BioPharma Inc.")


def test_a_mark_closes_only_where_the_source_does_not_continue_with_one(array, table):
    """The model tries to close right after "Effective Date": the source has a mark there, so it
    is the defined term's closing mark and the quote goes on; the next mark, after ")", is one
    the source does not continue with, so it closes."""
    doc, passages = array
    decoder = QuoteDecoder(plan_for(passages), table, max_tokens=120)
    text = _run(decoder, _copying(table, "dated as of May 31, 2017 (the \u201cEffective Date", ['"', ")", '"']))
    (quote, _), = decoder.cited
    assert quote == "dated as of May 31, 2017 (the \u201cEffective Date\")"
    (span,) = parse_citations(text)
    c = verify(span, {doc.doc_id: doc}, doc.doc_id)
    assert c.verified and normalize(c.quote) == normalize(quote)


def test_parsing_reads_a_quote_with_inner_marks_back_whole(array):
    doc, _ = array
    docs = {doc.doc_id: doc}
    for answer in ['"dated as of May 31, 2017 (the \u201cEffective Date\u201d)" [PAGE:1, LINE:7-8]',
                   '\u201cdated as of May 31, 2017 (the "Effective Date")\u201d [PAGE:1, LINE:7-8]',
                   'It is dated: "May 31, 2017 (the "Effective Date"), is made" [PAGE:1, LINE:8]']:
        (span,) = parse_citations(answer)
        c = verify(span, docs, doc.doc_id)
        assert c.verified and not c.relocated, (answer, c.note)
        assert normalize(c.quote) in normalize(answer) and '"effective date"' in normalize(c.quote), c.quote


def test_two_quoted_phrases_before_one_marker_still_cite_the_last(array):
    """A free-text answer that quotes twice before a marker: the marks are two pairs, and the
    one that verifies is the last phrase, as before."""
    doc, _ = array
    answer = 'Array is "a company organized under Delaware law" and Ono is "a company duly organized and existing under the laws of Japan" [PAGE:1, LINE:10]'
    (span,) = parse_citations(answer)
    c = verify(span, {doc.doc_id: doc}, doc.doc_id)
    assert c.verified and c.quote == "a company duly organized and existing under the laws of Japan"
