"""A free-text reply that names lines without quoting them (issue 28): the evaluation model
answered corpus questions with a bare `[PAGE:2, LINE:20-20]`, or a label after words of its own.
The lines it names, when they lie in a passage it read, are the quote judged (verified text);
its own words are shown only where the lines back them. On the Virtuoso licence's definitions
(page 2), against the CUAD gold span of its "Effective Date" question."""

import pytest
from docqa.bench.corpus_split import cuad_questions
from docqa.pipelines.answer.qa import NOT_FOUND_ANSWER, check_answer
from docqa.pipelines.ingest.passages import make_passages
from docqa.pipelines.textnorm import normalize

from corpus import CORPUS, first_pages_doc

VIRTUOSO = CORPUS / "pdf/contract_VirtuosoSurgicalInc_20191227_1_A_EX1A_6_MAT_CTRCT_11933379_EX1A_6_MAT_CTRCT_License_Agreement.pdf"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    gold = next(g for g in cuad_questions(CORPUS)
                if g["doc_file"].endswith(VIRTUOSO.name) and g["category"] == "Effective Date")
    doc = first_pages_doc(VIRTUOSO, 2, tmp_path_factory.mktemp("virtuoso"))
    return gold, {doc.doc_id: doc}, make_passages(doc)


def _gold_text(gold) -> str:
    (span,) = gold["gold_spans"]
    return normalize(span["text"].split("<omitted>")[0])


def test_a_bare_label_of_lines_read_is_answered_by_those_lines(case):
    gold, docs, passages = case
    a = check_answer(gold["question"], "[PAGE:2, LINE:20-20]", docs, passages, [])
    assert a.status == "answered"
    (c,) = a.citations
    assert c.verified and c.supports and c.span.page in gold["gold_spans"][0]["pdf_pages_1based"]
    assert _gold_text(gold) in normalize(c.quote)
    assert _gold_text(gold) in normalize(a.answer)  # shown quoted, not as a bare label


def test_a_label_of_lines_not_read_stays_unverified(case):
    gold, docs, passages = case
    read = [p for p in passages if not (p.span.page == 2 and p.span.line_start <= 20 <= p.span.line_end)]
    a = check_answer(gold["question"], "[PAGE:2, LINE:20-20]", docs, read, [])
    assert a.status == "unsupported" and a.answer is None
    assert a.draft == "[PAGE:2, LINE:20-20]"


def test_words_the_cited_lines_do_not_say_are_not_shown(case):
    gold, docs, passages = case
    raw = "The Effective Date is the date the Company paid the license fee. [PAGE:2, LINE:20]"
    a = check_answer(gold["question"], raw, docs, passages, [])
    assert a.status == "answered"
    assert "paid" not in a.answer and _gold_text(gold) in normalize(a.answer)
    assert a.draft == raw


def test_cited_lines_the_model_does_not_confirm_are_withheld(case):
    gold, docs, passages = case

    def confirm(messages):  # the model's verdict: only the definition of the Effective Date answers
        return 2.0 if "EFFECTIVE DATE" in messages[-1]["content"] else -2.0

    a = check_answer(gold["question"], "[PAGE:2, LINE:21]", docs, passages, [], confirm=confirm)
    assert a.status == "not_found" and a.answer == NOT_FOUND_ANSWER
    assert "LICENSED FIELD" in a.draft_citations[0].quote and a.draft == "[PAGE:2, LINE:21]"
    a = check_answer(gold["question"], "[PAGE:2, LINE:20]", docs, passages, [], confirm=confirm)
    assert a.status == "answered" and a.citations[0].confirm_logodds == 2.0


def test_a_quote_that_is_not_on_the_cited_lines_is_not_replaced_by_them(case):
    gold, docs, passages = case
    raw = '"The Effective Date is the date the Company paid the license fee." [PAGE:2, LINE:20]'
    a = check_answer(gold["question"], raw, docs, passages, [])
    assert a.status == "unsupported" and not any(c.verified for c in a.draft_citations)
