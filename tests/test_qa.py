"""The answer path with a scripted model: what is shown as verified must be in the source."""

from docqa.pipelines.context import build_context
from docqa.pipelines.document import RawLine, RawPage, assemble
from docqa.pipelines.passages import make_passages
from docqa.pipelines.qa import answer_question

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
    assert [(p.page, p.line_start, p.line_end) for p in PASSAGES] == [(1, 1, 4), (2, 1, 3), (3, 1, 2)]
    for p in PASSAGES:
        assert DOC.text[p.char_start : p.char_end] == p.text


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
    assert ans.status == "unsupported" and ans.answer is None
    assert [c.verified for c in ans.citations] == [False]
    assert ans.evidence and all(c.verified for c in ans.evidence)  # the fallback


def test_uncited_verbatim_sentence_gets_a_mechanical_citation():
    gen = scripted("Either party may terminate this Agreement for convenience upon ninety (90) days' prior written notice.")
    ans = answer_question("Can it be terminated for convenience?", DOCS, PASSAGES, gen)
    assert ans.status == "answered"
    (c,) = [c for c in ans.citations if c.verified]
    assert (c.page, c.line_start, c.line_end) == (2, 2, 3)


def test_not_found_and_evidence_only():
    ans = answer_question("Who is the CEO?", DOCS, PASSAGES, scripted("Not found in the document."))
    assert ans.status == "not_found"
    ev = answer_question("Which law governs?", DOCS, PASSAGES, None)
    assert ev.status == "evidence_only" and ev.answer is None and len(ev.evidence) == 3


def test_budget_is_respected():
    ctx = build_context("q", DOCS, PASSAGES, budget_tokens=260)
    assert ctx.tokens <= 260 and 0 < len(ctx.passages) < len(PASSAGES)
