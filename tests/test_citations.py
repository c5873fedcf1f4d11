"""Citation parsing and mechanical verification (SPEC §4)."""

from docqa.pipelines.answer.citations import Citation, cite_lines, parse_citations, verify, verify_answer
from docqa.pipelines.document import Passage, RawLine, RawPage, Span, assemble


def _doc(pages, type="pdf", labels=None, doc_id="abc123def456"):
    raw = [
        RawPage(lines=[RawLine(text=t) for t in lines], label=(labels[i] if labels else None))
        for i, lines in enumerate(pages)
    ]
    return assemble(raw, doc_id=doc_id, content_sha256="0" * 64, path="x", type=type)


CONTRACT = _doc(
    [
        ["MASTER AGREEMENT", "", "1. Definitions"],
        [
            "8.3 Termination for Convenience. Either party may termi-",
            "nate this Agreement upon ninety (90) days\u2019 prior written",
            "notice to the other party.",
            "8.4 Effect of Termination. Upon termination, each party shall",
            "return all Con\ufb01dential Information.",
        ],
        [],  # a blank page stays a page
        ["Page 4 text about the ﬁnal payment of $1,000,000."],
    ]
)


def test_parse_markers_and_quotes():
    answer = (
        'Either party may end it: "upon ninety (90) days\' prior written notice" [PAGE:2, LINE:2-3]. '
        "Confidential information must be returned [page: 2; lines: 5]."
    )
    spans = parse_citations(answer)
    assert [(s.span.page, s.span.line_start, s.span.line_end) for s in spans] == [(2, 2, 3), (2, 5, 5)]
    assert spans[0].quote == "upon ninety (90) days' prior written notice"
    assert spans[1].quote == "Confidential information must be returned"


def test_html_and_multi_doc_markers():
    spans = parse_citations('"x y z" [DOC:abc123, SECTION:section-15.5.5, LINE:3-4]')
    assert spans[0].doc_id == "abc123" and spans[0].span.element_id == "section-15.5.5"
    assert spans[0].span.page is None and (spans[0].span.line_start, spans[0].span.line_end) == (3, 4)


def test_verifies_across_hyphenation_ligatures_quotes_case():
    docs = {CONTRACT.doc_id: CONTRACT}
    c = verify_answer(
        '"Either party may terminate this agreement upon ninety (90) days\' prior written notice" [PAGE:2, LINE:1-3]'
        ' and "return all confidential information" [PAGE:2, LINE:5]',
        docs,
        default_doc=CONTRACT.doc_id,
    )
    assert [x.verified for x in c] == [True, True]
    assert not any(x.relocated for x in c)
    a, b = c[0].span.char_start, c[0].span.char_end
    assert CONTRACT.text[a:b].startswith("Either party") and CONTRACT.text[a:b].endswith("notice")


def test_wrong_lines_are_relocated_not_trusted():
    docs = {CONTRACT.doc_id: CONTRACT}
    (c,) = verify_answer('"return all Confidential Information" [PAGE:1, LINE:1]', docs, CONTRACT.doc_id)
    assert c.verified and c.relocated and (c.span.page, c.span.line_start, c.span.line_end) == (2, 5, 5)


def test_fabricated_quote_never_verifies():
    docs = {CONTRACT.doc_id: CONTRACT}
    (c,) = verify_answer('"either party may terminate at will without notice" [PAGE:2, LINE:1-3]', docs, CONTRACT.doc_id)
    assert not c.verified and c.note
    (short,) = verify_answer('"90 days" [PAGE:2, LINE:2]', docs, CONTRACT.doc_id)
    assert not short.verified  # too short to prove anything
    (nopage,) = verify_answer('"return all confidential information" [PAGE:99, LINE:1]', docs, CONTRACT.doc_id)
    assert nopage.relocated and nopage.span.page == 2  # the quote is real; the page was not
    (unknown,) = verify_answer('"return all confidential information" [DOC:ffff99, PAGE:2, LINE:5]', docs)
    assert not unknown.verified and unknown.note == "unknown document"


def test_html_section_citation():
    html = _doc(
        [["Intro text."], ["The origin server did not find a current representation", "for the target resource."]],
        type="html",
        labels=[None, "section-15.5.5"],
    )
    (c,) = verify_answer(
        '"did not find a current representation for the target resource" [SECTION:section-15.5.5, LINE:1-2]',
        {html.doc_id: html},
        html.doc_id,
    )
    assert c.verified and c.span.page is None and c.span.element_id == "section-15.5.5"
    assert c.label() == "[SECTION:section-15.5.5, LINE:1-2]"


def test_cite_lines_quotes_exact_text():
    c = cite_lines(CONTRACT, 2, 4, 5)
    assert c.verified and c.quote.startswith("8.4 Effect of Termination")
    assert CONTRACT.text[c.span.char_start : c.span.char_end] == c.quote
    # and such a citation verifies when fed back through the parser
    (again,) = verify_answer(f'"{c.quote}" {c.label()}', {CONTRACT.doc_id: CONTRACT}, CONTRACT.doc_id)
    assert again.verified and not again.relocated


def test_quote_across_a_page_break_relocates_to_its_start():
    doc = _doc([["alpha beta gamma delta epsilon"], ["zeta eta theta iota kappa"]])
    hit = verify(parse_citations('"delta epsilon zeta eta" [PAGE:1, LINE:1]')[0], {doc.doc_id: doc}, doc.doc_id)
    assert hit.verified and hit.relocated and hit.span.page == 1


def test_a_broad_citation_is_narrowed_to_the_quoted_lines():
    (c,) = verify_answer('"return all Confidential Information" [PAGE:2, LINE:1-5]', {CONTRACT.doc_id: CONTRACT}, CONTRACT.doc_id)
    assert c.verified and not c.relocated and (c.span.page, c.span.line_start, c.span.line_end) == (2, 5, 5)


def test_one_label_for_every_span():
    # The label formats the answer parser reads (`_CITE`), written out by hand.
    assert Span(page=12, line_start=30, line_end=34).label() == "[PAGE:12, LINE:30-34]"
    assert Span(page=3, line_start=7, line_end=7).label() == "[PAGE:3, LINE:7]"
    assert Span(page=3, line_start=7, line_end=7).label(line_range=True) == "[PAGE:3, LINE:7-7]"
    assert Span(page=4, element_id="section-15.5.5", line_start=3, line_end=4).label("abc123") == \
        "[DOC:abc123, SECTION:section-15.5.5, LINE:3-4]"
    c = Citation(doc_id="abc123", page=None, element_id="sec-2", line_start=5, line_end=5, quote="q")
    assert c.label() == "[SECTION:sec-2, LINE:5]" and c.label(with_doc=True) == "[DOC:abc123, SECTION:sec-2, LINE:5]"
    p = Passage(doc_id="abc123", index=0, page=2, element_id=None, line_start=9, line_end=9, char_start=0, char_end=1,
                text="x", section_id="s4")
    assert p.cite_label() == "[PAGE:2, LINE:9-9]" and p.span.char_end == 1
    # Each label parses back to the span it came from.
    (back,) = parse_citations(f'"q" {c.label(with_doc=True)}')
    assert (back.doc_id, back.span.element_id, back.span.line_start, back.span.line_end) == ("abc123", "sec-2", 5, 5)


def test_a_citation_keeps_its_stored_and_json_field_names():
    """A citation holds one Span; the runs table and `--json` still see the flat shape of the
    first release (the span's element id as section_id), key for key and in that order."""
    c = Citation(doc_id="d", page=None, section_id="intro", line_start=1, line_end=2, quote="q")
    assert c.span == Span(element_id="intro", line_start=1, line_end=2)
    assert Citation(doc_id="d", page=None, element_id="intro", line_start=1, line_end=2, quote="q") == c
    # A run stored before the span, as the runs table's JSON holds it (written by hand).
    old = ('{"doc_id":"d","page":null,"section_id":"intro","line_start":1,"line_end":2,"quote":"q",'
           '"segment_id":null,"verified":false,"relocated":false,"char_start":null,"char_end":null,'
           '"note":null,"supports":null}')
    # Written back the same, key for key, with the fields added since at the end.
    assert Citation.model_validate_json(old) == c and c.model_dump_json() == old[:-1] + ',"confirm_logodds":null}'
    assert list(c.model_dump(exclude={"char_start", "char_end"})) == [
        "doc_id", "page", "section_id", "line_start", "line_end", "quote", "segment_id", "verified", "relocated",
        "note", "supports", "confirm_logodds"]
