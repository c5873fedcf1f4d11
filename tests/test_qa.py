"""The answer path with a scripted model: what is shown as verified must be in the source."""

from docqa.pipelines.answer.prompt import build_context
from docqa.pipelines.document import RawLine, RawPage, assemble
from docqa.pipelines.ingest.passages import make_passages
from docqa.pipelines.answer.qa import answer_question, on_subject, subject_words
from docqa.pipelines.textnorm import normalize

PAGES = [
    ["SERVICES AGREEMENT", "", "1. Term. This Agreement begins on the Effective Date and", "continues for five (5) years."],
    ["8. Termination.", "Either party may terminate this Agreement for convenience upon", "ninety (90) days' prior written notice to the other party."],
    ["12. Governing Law. This Agreement is governed by the laws of the", "State of New York, without regard to conflict of laws principles."],
]
DOC = assemble(
    [RawPage(lines=[RawLine(text=t) for t in p]) for p in PAGES],
    doc_id="feedbeef0001", content_sha256="1" * 64, path="agreement.txt", type="text",
)
DOCS = {DOC.doc_id: DOC}
PASSAGES = make_passages(DOC)


def scripted(reply):
    seen = {}

    def generate(messages):
        seen["messages"] = messages
        return reply

    generate.seen = seen
    return generate


def test_passages_cover_body_lines_and_cite_their_own_text():
    assert [(p.span.page, p.span.line_start, p.span.line_end) for p in PASSAGES] == [(1, 1, 4), (2, 1, 3), (3, 1, 2)]
    for p in PASSAGES:
        assert DOC.text[p.span.char_start : p.span.char_end] == p.text


def test_verified_answer_and_prompt_contents():
    gen = scripted('It is "governed by the laws of the State of New York" [PAGE:3, LINE:1-2].')
    ans = answer_question("Which law governs?", DOCS, PASSAGES[::-1], gen)
    assert ans.status == "answered"
    assert ans.answer.endswith("[PAGE:3, LINE:1-2].")
    assert all(c.verified for c in ans.citations)
    user = gen.seen["messages"][-1]["content"]
    assert "[PAGE:3, LINE:1-2]" in user and "Question: Which law governs?" in user
    assert user.index("Governing Law") < user.index("Termination")  # relevance order kept


def test_fabricated_answer_is_not_shown_as_supported():
    gen = scripted('"governed by the laws of Delaware" [PAGE:3, LINE:1-2]')
    ans = answer_question("Which law governs?", DOCS, PASSAGES, gen)
    assert ans.status == "unsupported" and ans.answer is None and not ans.citations
    # Withheld, not lost: the draft keeps the text and its unverified citation.
    assert ans.draft == "\"governed by the laws of Delaware\" [PAGE:3, LINE:1-2]"
    assert [c.verified for c in ans.draft_citations] == [False]
    assert ans.evidence and all(c.verified for c in ans.evidence)  # the fallback


def test_uncited_verbatim_sentence_gets_a_mechanical_citation():
    gen = scripted("Either party may terminate this Agreement for convenience upon ninety (90) days' prior written notice.")
    ans = answer_question("Can it be terminated for convenience?", DOCS, PASSAGES, gen)
    assert ans.status == "answered"
    (c,) = [c for c in ans.citations if c.verified]
    assert (c.span.page, c.span.line_start, c.span.line_end) == (2, 2, 3)


def test_free_text_that_copies_a_clause_cites_the_copied_words():
    """A model server's answer in its own words around a clause copied verbatim (no quotation
    marks, no label): the copied run is cited where it stands; a few shared words are not."""
    gen = scripted("Yes: under the agreement either party may terminate this Agreement for convenience upon "
                   "ninety (90) days' notice, in writing.")
    ans = answer_question("Can it be terminated for convenience?", DOCS, PASSAGES, gen)
    assert ans.status == "answered"
    (c,) = [c for c in ans.citations if c.verified]
    assert (c.span.page, c.span.line_start) == (2, 2) and normalize("terminate this Agreement for convenience") in normalize(c.quote)
    loose = answer_question("Can it be terminated for convenience?", DOCS, PASSAGES,
                            scripted("The parties may end the agreement for convenience, it seems to me."))
    assert not any(c.verified for c in loose.draft_citations) and loose.status == "unsupported"


def test_not_found_and_evidence_only():
    ans = answer_question("Who is the CEO?", DOCS, PASSAGES, scripted("Not found in the document."))
    assert ans.status == "not_found"
    ev = answer_question("Which law governs?", DOCS, PASSAGES, None)
    assert ev.status == "evidence_only" and ev.answer is None and len(ev.evidence) == 3


def test_budget_is_respected():
    ctx = build_context("q", DOCS, PASSAGES, budget_tokens=260)
    assert ctx.tokens <= 260 and 0 < len(ctx.passages) < len(PASSAGES)


def test_evidence_shows_k_distinct_pages():
    """Evidence is checked page by page: each of the first k distinct pages once, by its
    best-ranked passage, in ranking order (issue 29: a list showed "199, 199")."""
    p2, p3, p1 = PASSAGES[1], PASSAGES[2], PASSAGES[0]
    p2b = p2.model_copy(update={"index": 7, "span": p2.span.model_copy(update={
        "line_start": 2, "line_end": 2, "char_start": DOC.page(2).lines[1].start, "char_end": DOC.page(2).lines[1].end})})
    p3b = p3.model_copy(update={"index": 8})
    ranked = [p2, p2b, p3, p3b, p1]
    ev = answer_question("How can it be terminated?", DOCS, ranked, None, evidence_k=3).evidence
    assert [(c.span.page, c.span.line_start) for c in ev] == [(2, 1), (3, 1), (1, 1)]
    assert all(c.verified for c in ev)
    ev = answer_question("How can it be terminated?", DOCS, ranked, None, evidence_k=2).evidence
    assert [(c.span.page, c.span.line_start) for c in ev] == [(2, 1), (3, 1)]


NON_COMPETE = ('Highlight the parts (if any) of this contract related to "Non-Compete" that should be '
               "reviewed by a lawyer. Details: Is there a restriction on the ability of a party to compete?")
TERMINATION = ('Highlight the parts (if any) of this contract related to "Termination For Convenience" that '
               "should be reviewed by a lawyer. Details: Can a party terminate this contract without cause?")


def test_a_verified_quote_that_misses_the_subject_is_not_an_answer():
    """The agreement has no non-compete. A quote of its governing-law clause is on its lines
    (it verifies) but names nothing of the subject: with the subject check the answer is
    "not found", the evidence is still shown and the model's words stay in raw_answer."""
    reply = '"governed by the laws of the State of New York" [PAGE:3, LINE:1-2]'
    plain = answer_question(NON_COMPETE, DOCS, PASSAGES, scripted(reply))
    assert plain.status == "answered"  # without the check: a confident, verified, wrong quote
    ans = answer_question(NON_COMPETE, DOCS, PASSAGES, scripted(reply), support_check=True)
    assert ans.status == "not_found" and ans.answer == "Not found in the document."
    assert ans.citations == [] and ans.raw_answer == reply
    assert ans.evidence and all(c.verified for c in ans.evidence)


def test_a_quote_on_the_subject_is_kept():
    reply = '"Either party may terminate this Agreement for convenience" [PAGE:2, LINE:1-2]'
    ans = answer_question(TERMINATION, DOCS, PASSAGES, scripted(reply), support_check=True)
    assert ans.status == "answered" and [c.span.page for c in ans.citations if c.verified] == [2]
    # Drafting words count for the subject: "without cause" clauses rarely say "convenience".
    assert on_subject("may end this Agreement without cause", subject_words(TERMINATION))
    assert not on_subject("may end this Agreement at the end of the term", subject_words(NON_COMPETE))


def test_questions_about_the_opening_words_are_not_subject_checked():
    q = ('Highlight the parts (if any) of this contract related to "Document Name" that should be '
         "reviewed by a lawyer. Details: The name of the contract")
    assert subject_words(q) is None
    ans = answer_question(q, DOCS, PASSAGES, scripted('"SERVICES AGREEMENT" [PAGE:1, LINE:1]'), support_check=True)
    assert ans.status == "answered"
