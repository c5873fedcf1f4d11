"""pipelines.ingest.sections against headings checked by hand in the corpus PDFs.

To keep the file fast, each test document is the first N pages of a corpus PDF (cut with
pypdf, so physical page numbers are unchanged) parsed once per module with `parse_pdf`.
"""

from __future__ import annotations


from pathlib import Path

import pytest

from docqa.pipelines.document import Document, RawLine, RawPage, RawSection, assemble
from docqa.pipelines.ingest.sections import chinese_to_int, detect_sections, roman_to_int, section_key

from corpus import ARRAY, CIVIL_CODE, GOOSEHEAD, IBM, RISCV, first_pages_doc


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict[str, Document]:
    tmp = tmp_path_factory.mktemp("cut")
    out = {
        "civil": first_pages_doc(CIVIL_CODE, 35, tmp),
        "array": first_pages_doc(ARRAY, 22, tmp),
        "goosehead": first_pages_doc(GOOSEHEAD, 8, tmp),
        "ibm": first_pages_doc(IBM, 8, tmp),
        "riscv": first_pages_doc(RISCV, 45, tmp),
    }
    for d in out.values():
        d.sections = detect_sections(d)
    return out


def by_number(doc: Document, number: str):
    found = [s for s in doc.sections if s.number == number]
    assert found, f"no section {number!r}; have {[s.number for s in doc.sections][:40]}"
    return found[0]


def test_chinese_numerals():
    assert chinese_to_int("一百四十三") == 143
    assert chinese_to_int("十二") == 12
    assert chinese_to_int("一千二百六十") == 1260
    assert chinese_to_int("一千零六十三") == 1063
    assert chinese_to_int("二〇二〇") == 2020
    assert roman_to_int("XVIII") == 18 and roman_to_int("IN") is None
    assert section_key("第一百四十三条") == ("条", 143)
    assert section_key("ARTICLE VII") == section_key("Article 7") == ("article", 7)
    assert section_key("5.0") == section_key("Section 5") == ("num", (5,))


def test_civil_code_article_143_on_its_page(docs):
    # Checked by hand: physical page 31 (printed page number 31 at its top) holds
    # "第一百四十三条 具备下列条件的民事法律行为有效：", in 第六章 第三节 民事法律行为的效力.
    doc = docs["civil"]
    s = by_number(doc, "第一百四十三条")
    assert s.span.page == 31
    assert doc.text[s.span.char_start:].startswith("第一百四十三条 具备下列条件的民事法律行为有效")
    assert section_key(s.number) == ("条", 143)
    parent = next(p for p in doc.sections if p.id == s.parent_id)
    assert parent.number == "第三节" and parent.title == "民事法律行为的效力"
    chapter = next(p for p in doc.sections if p.id == parent.parent_id)
    assert chapter.number == "第六章"
    assert s.level == parent.level + 1 == chapter.level + 2
    # 第一百四十二条 (the last article of 第二节) ends where the heading 第三节 begins
    prev = by_number(doc, "第一百四十二条")
    assert prev.span.char_end == parent.span.char_start and prev.span.page == 31


def test_civil_code_contents_pages_yield_no_sections(docs):
    # Pages 1-7 are the 目录 (book/chapter/section titles without page numbers); the body
    # begins on page 7 after "附则" with "第一编 总则", "第一章 基本规定", "第一条 ...".
    doc = docs["civil"]
    assert all(s.span.page >= 7 for s in doc.sections)
    first = doc.sections[:3]
    assert [s.number for s in first] == ["第一编", "第一章", "第一条"]
    assert first[0].title == "总则" and first[0].span.page == 7
    # every article 1..146 (the last whole one on page 35 is 第一百四十六条) is found, once
    articles = [section_key(s.number)[1] for s in doc.sections if s.number.endswith("条")]
    assert articles[:146] == list(range(1, 147))


@pytest.mark.parametrize(
    "name, number, title, page",
    [
        # Checked by hand in each PDF:
        ("array", "ARTICLE II", "GRANT OF LICENSE", 19),
        ("array", "2.1", "Licenses", 19),
        ("array", "2.4", "Future Third Party Partners", 21),
        ("goosehead", "2", "TERM AND RENEWAL", 5),
        ("goosehead", "2.1", "Term", 5),
        ("ibm", "5.0", "TERMINATION", 4),
        ("ibm", "5.1", "Breach", 4),
    ],
)
def test_contract_clause_at_its_page(docs, name, number, title, page):
    s = by_number(docs[name], number)
    assert s.title == title
    assert s.span.page == page


def test_contract_tree(docs):
    array = docs["array"]
    art2 = by_number(array, "ARTICLE II")
    s21 = by_number(array, "2.1")
    assert s21.parent_id == art2.id and s21.level == art2.level + 1
    assert art2.span.char_start <= s21.span.char_start < s21.span.char_end <= art2.span.char_end
    # a definition clause is titled by its term
    assert by_number(array, "1.2").title == "Annual Net Sales"
    ibm = docs["ibm"]
    assert by_number(ibm, "5.1").parent_id == by_number(ibm, "5.0").id


def test_cross_references_in_running_text_are_not_headings(docs):
    # Page 4 of Array has a line beginning "Section 13(d) and 14(d) of the United States
    # Securities Exchange Act"; Goosehead page 7 a line "Section 13 below."; IBM page 4
    # "Section 5.0. This Agreement will automatically be renewed".
    assert not any(s.span.page == 4 and s.number.startswith("13") for s in docs["array"].sections)
    assert not any(s.number == "13" for s in docs["goosehead"].sections)
    starts = [s for s in docs["ibm"].sections if s.number == "5.0"]
    assert len(starts) == 1


def test_toc_pages_yield_no_sections(docs):
    # Goosehead page 2 is a contents table ("1 Grant 2", "2 Term And Renewal 3", ...);
    # IBM page 2 lists "SECTION 1.0 DEFINITIONS.......  Page 4" before the real heading.
    assert not any(s.span.page == 2 for s in docs["goosehead"].sections)
    ibm_defs = [s for s in docs["ibm"].sections if s.number == "1.0"]
    assert len(ibm_defs) == 1 and ibm_defs[0].title == "DEFINITIONS"
    # RISC-V: pages 5-14 are contents, lists of figures and tables
    assert not any(5 <= s.span.page <= 14 for s in docs["riscv"].sections)


def test_riscv_chapters_and_numbered_sections(docs):
    # Checked by hand: "Chapter 3 / Machine-Level ISA, Version 1.12" opens page 29,
    # "3.1.6 Machine Status Registers (mstatus and mstatush)" is on page 34 and
    # "3.1.6.5 Virtualization Support in mstatus Register" on page 38.
    doc = docs["riscv"]
    ch3 = by_number(doc, "Chapter 3")
    assert ch3.span.page == 29 and ch3.title == "Machine-Level ISA, Version 1.12"
    s316 = by_number(doc, "3.1.6")
    assert s316.span.page == 34
    assert s316.title == "Machine Status Registers (mstatus and mstatush)"
    s3165 = by_number(doc, "3.1.6.5")
    assert s3165.span.page == 38 and s3165.title == "Virtualization Support in mstatus Register"
    assert s3165.parent_id == s316.id
    assert by_number(doc, "3.1").parent_id == ch3.id
    # 3.1.6 ends where 3.1.7 starts (page 43)
    s317 = by_number(doc, "3.1.7")
    assert s316.span.char_end == s317.span.char_start and s317.span.page == 43
    # running headers such as "28 Volume II: RISC-V Privileged Architectures" are not
    # sections, and no bare table row ("4 E RV32E base ISA") became one
    assert all("Volume II" not in s.title for s in doc.sections)
    assert all(s.number.startswith(("Chapter", "1", "2", "3")) for s in doc.sections)


def test_spans_are_consistent(docs):
    for doc in docs.values():
        ids = {s.id for s in doc.sections}
        for s in doc.sections:
            assert s.parent_id is None or s.parent_id in ids
            assert 0 <= s.span.char_start < s.span.char_end <= len(doc.text)
            loc = doc.locate(s.span.char_start)
            assert (loc.page, loc.line) == (s.span.page, s.span.line_start)
            assert (s.span.page_end, s.span.line_end) >= (s.span.page, s.span.line_start)


def test_html_raw_sections_become_sections():
    pages = [RawPage(lines=[RawLine(text="Intro text")], label="intro"),
             RawPage(lines=[RawLine(text="2. Terms"), RawLine(text="body")], label="section-2"),
             RawPage(lines=[RawLine(text="2.1. Sub")], label="section-2.1"),
             RawPage(lines=[RawLine(text="3. Next")], label="section-3")]
    doc = assemble(pages, doc_id="h", content_sha256="h", path="x.html", type="html")
    raw = [RawSection(number="2", title="Terms", level=1, page=2, element_id="section-2"),
           RawSection(number="2.1", title="Sub", level=2, page=3, element_id="section-2.1"),
           RawSection(number="3", title="Next", level=1, page=4, element_id="section-3")]
    secs = detect_sections(doc, raw)
    assert [(s.id, s.number, s.level, s.parent_id, s.span.element_id) for s in secs] == [
        ("s1", "2", 1, None, "section-2"), ("s2", "2.1", 2, "s1", "section-2.1"),
        ("s3", "3", 1, None, "section-3")]
    assert secs[0].span.char_start == doc.pages[1].start and secs[0].span.char_end == doc.pages[3].start
    assert secs[1].span.char_end == doc.pages[3].start
    assert secs[2].span.char_end == len(doc.text) and secs[0].span.page_end == 3


# A services agreement written for this test (fixtures/mixed_numbering_contract.txt) in two
# numbering schemes at once, as drafted contracts often are: clauses "1." ... "9." (clause 4
# without its dot), with plain-numbered lists inside clauses 3 ("1 Service Desk" ... "4
# Backup and Recovery") and 6 ("1 Standards." ... "8 Sub-Contractors."), lettered
# sub-paragraphs "(a)"-"(c)", recitals "A."/"B." and a schedule that numbers again from 1.
# Taken by number alone, the lists were clauses: "4 Backup and Recovery" took clause 4's
# place (losing "4 CHARGES AND PAYMENT" and 3.2) and "8 Sub-Contractors" swallowed
# "7. TERMINATION". Expected tree written by hand from the file: (number, title or None
# for a sub-clause, level, parent's number, first line).
MIXED = Path(__file__).resolve().parents[1] / "fixtures" / "mixed_numbering_contract.txt"
MIXED_TREE = [
    ("1", "DEFINITIONS AND INTERPRETATION", 1, None, 19),
    ("1.1", None, 2, "1", 21), ("1.2", None, 2, "1", 29), ("1.3", None, 2, "1", 31),
    ("2", "COMMENCEMENT AND DURATION", 1, None, 34),
    ("2.1", None, 2, "2", 36), ("2.2", None, 2, "2", 39),
    ("3", "SUPPLY OF SERVICES", 1, None, 42),
    ("3.1", None, 2, "3", 44), ("3.2", None, 2, "3", 55),
    ("4", "CHARGES AND PAYMENT", 1, None, 63),
    ("4.1", None, 2, "4", 65), ("4.2", None, 2, "4", 68),
    ("5", "CUSTOMER'S OBLIGATIONS", 1, None, 71),
    ("5.1", None, 2, "5", 73), ("5.2", None, 2, "5", 76),
    ("6", "SUPPLIER'S OBLIGATIONS", 1, None, 79),
    ("7", "TERMINATION", 1, None, 101),
    ("7.1", None, 2, "7", 103), ("7.2", None, 2, "7", 107), ("7.3", None, 2, "7", 108),
    ("8", "LIMITATION OF LIABILITY", 1, None, 110),
    ("8.1", None, 2, "8", 112), ("8.2", None, 2, "8", 115),
    ("9", "GOVERNING LAW", 1, None, 118),
    ("SCHEDULE 1", "CHARGES AND SERVICE LEVELS", 1, None, 123),
    ("1", "Monthly Charges", 2, "SCHEDULE 1", 125), ("1.1", None, 3, "1", 127),
    ("2", "Service Levels", 2, "SCHEDULE 1", 129), ("2.1", None, 3, "2", 131),
]


def _text_doc(text: str) -> Document:
    pages = [RawPage(lines=[RawLine(text=t) for t in text.split("\n")])]
    doc = assemble(pages, doc_id="m", content_sha256="m", path="mixed.txt", type="text")
    doc.sections = detect_sections(doc)
    return doc


def _tree(doc: Document, expected: list[tuple]) -> list[tuple]:
    """The doc's tree in MIXED_TREE's shape; a sub-clause's title (its first words, however
    they read) is compared only where `expected` gives one."""
    by_id = {s.id: s for s in doc.sections}
    want_title = {(n, line) for n, title, _, _, line in expected if title is not None}
    return [(s.number, s.title if (s.number, s.span.line_start) in want_title else None, s.level,
             by_id[s.parent_id].number if s.parent_id else None, s.span.line_start)
            for s in doc.sections]


def test_mixed_numbering_schemes_nest_by_position():
    doc = _text_doc(MIXED.read_text(encoding="utf-8").rstrip("\n"))
    assert _tree(doc, MIXED_TREE) == MIXED_TREE
    # 7. TERMINATION spans its own clause only, and clause 6 ends where it starts, its list
    # (through "8 Sub-Contractors") inside it
    s6, s7 = by_number(doc, "6"), [s for s in doc.sections if s.number == "7"][0]
    assert s6.span.char_end == s7.span.char_start
    assert "8 Sub-Contractors" in doc.text[s6.span.char_start:s6.span.char_end]


def test_clause_after_a_list_that_ends_the_previous_clause():
    # Without 3.2 the list "1 Service Desk" ... "4 Backup and Recovery" runs straight into
    # "4 CHARGES AND PAYMENT": both continue a sequence (the list's 3 -> 4 would be a fifth
    # item, the clauses' 3 -> 4 the next clause); written like the clauses (capitals, a line
    # of its own) rather than like the list, it is clause 4.
    text = MIXED.read_text(encoding="utf-8").rstrip("\n")
    lines = text.split("\n")
    cut = lines[:53] + lines[62:]  # drop lines 54-62 (3.2 and its sub-paragraphs)
    doc = _text_doc("\n".join(cut))
    tops = [(s.number, s.title, s.span.line_start) for s in doc.sections if s.level == 1]
    assert tops[2:5] == [("3", "SUPPLY OF SERVICES", 42), ("4", "CHARGES AND PAYMENT", 54),
                         ("5", "CUSTOMER'S OBLIGATIONS", 62)]
    assert [s.number for s in doc.sections if s.parent_id == by_number(doc, "3").id] == ["3.1"]
