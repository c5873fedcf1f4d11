"""A withheld answer falls back to the sentence of the best passages that the model itself
confirms (qa.confirmed_sentence): the sentence is cited on its own lines and verified, only
sentences the rules pass are asked about, and nothing is shown when the model says no."""

from docqa.pipelines.answer.citations import parse_citations, verify
from docqa.pipelines.answer.qa import NOT_FOUND_ANSWER, answer_question
from docqa.pipelines.answer.support import CONFIRM_MARGIN
from docqa.pipelines.document import RawLine, RawPage, assemble
from docqa.pipelines.ingest.passages import make_passages
from docqa.pipelines.textnorm import normalize

PAGES = [
    ["LICENSE AGREEMENT", "", "1. Term. This Agreement begins on the Effective Date and continues for",
     "five (5) years unless terminated earlier as provided below."],
    ["12. Governing Law. This Agreement will be governed in all respects by the laws of the",
     "State of Ohio, without regard to its conflict of laws principles. Notices shall be sent",
     "by courier to the addresses first written above."],
]
DOC = assemble([RawPage(lines=[RawLine(text=t) for t in p]) for p in PAGES],
               doc_id="feedbeef0003", content_sha256="3" * 64, path="licence.txt", type="text")
DOCS = {DOC.doc_id: DOC}
PASSAGES = make_passages(DOC)
QUESTION = "Which state's law governs this agreement?"


def _ranked():
    """The governing-law passage first, as retrieval ranks it."""
    return sorted(PASSAGES, key=lambda p: "Governing" not in p.text)


def _confirm_if(word, asked):
    def confirm(messages):
        quote = messages[-1]["content"].split("Quoted passage:", 1)[1]
        asked.append(quote)
        return 3.0 if word in quote else -3.0
    return confirm


def test_the_sentence_the_model_confirms_is_shown_verified_when_its_own_answer_is_withheld():
    asked = []
    ans = answer_question(QUESTION, DOCS, _ranked(), lambda m, p: NOT_FOUND_ANSWER, quote=True,
                          support_check=True, confirm=_confirm_if("Ohio", asked))
    assert ans.status == "answered", ans
    assert ans.raw_answer == NOT_FOUND_ANSWER  # what the model itself wrote stays on record
    (c,) = ans.citations
    assert c.verified and c.supports and c.confirm_logodds >= CONFIRM_MARGIN
    assert "governed in all respects by the laws of the State of Ohio" in c.quote
    assert "Notices" not in c.quote  # the sentence, not the passage
    # the shown answer parses back to the same verified citation on the lines the clause is on
    (span,) = parse_citations(ans.answer)
    again = verify(span, DOCS, DOC.doc_id)
    assert again.verified and not again.relocated and (again.span.page, again.span.line_start) == (2, 1)
    assert normalize(DOC.lines_text(2, again.span.line_start, again.span.line_end)).find("state of ohio") >= 0
    # a sentence that does not name the subject (the notice clause) is never put to the model
    assert not any("courier" in q for q in asked)


def test_nothing_is_shown_when_the_model_confirms_no_sentence():
    asked = []
    ans = answer_question(QUESTION, DOCS, _ranked(), lambda m, p: NOT_FOUND_ANSWER, quote=True,
                          support_check=True, confirm=_confirm_if("no such words", asked))
    assert asked and ans.status == "not_found" and not ans.citations
    assert not ans.draft_citations and ans.draft is None  # the model said "Not found": no draft of its own
    assert len(ans.asked) == len(asked) and not any(c.supports for c in ans.asked)  # kept for measuring the margin


def test_a_confirmed_answer_of_the_model_itself_is_kept():
    """The fallback runs only for a withheld answer: a quote of the model's own that the model
    confirms is shown as written, and no sentence is asked about."""
    asked = []
    honest = '"governed in all respects by the laws of the State of Ohio" [PAGE:2, LINE:1-2]'
    ans = answer_question(QUESTION, DOCS, _ranked(), lambda m, p: honest, quote=True, support_check=True,
                          confirm=_confirm_if("Ohio", asked))
    assert ans.status == "answered" and ans.answer.startswith('"governed in all respects')
    assert len(asked) == 1  # the model's own quote only
