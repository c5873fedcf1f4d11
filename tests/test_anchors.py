"""pipelines.ingest.anchors on hand-written sentences and on facts checked by hand in the corpus.

Corpus documents are the first N pages of a PDF (cut with pypdf, so page numbers are
unchanged), parsed once per module.
"""

from __future__ import annotations

import json

import pytest

from docqa.pipelines.ingest.anchors import (definition_term_span, normalize_date, normalize_duration,
                                     normalize_money, tag_anchors, words_to_int)
from docqa.pipelines.document import Document, RawLine, RawPage, assemble
from docqa.pipelines.ingest.sections import detect_sections, section_key

from corpus import ARRAY, CIVIL_CODE, GOLD, GOOSEHEAD, IBM, PAPER, first_pages_doc


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict[str, Document]:
    tmp = tmp_path_factory.mktemp("cut")
    return {
        "array": first_pages_doc(ARRAY, 22, tmp, anchors=True),
        "goosehead": first_pages_doc(GOOSEHEAD, 6, tmp, anchors=True),
        "ibm": first_pages_doc(IBM, 5, tmp, anchors=True),
        "paper": first_pages_doc(PAPER, 2, tmp, anchors=True),
        "civil": first_pages_doc(CIVIL_CODE, 65, tmp, anchors=True),
    }


def text_doc(*lines: str) -> Document:
    doc = assemble([RawPage(lines=[RawLine(text=t) for t in lines])], doc_id="x",
                   content_sha256="x", path="x.txt", type="text")
    doc.sections = detect_sections(doc)
    return doc


def entities(doc: Document, subtype: str) -> list[tuple[str, str]]:
    return [(a.text, a.value) for a in tag_anchors(doc)
            if a.type == "ENTITY" and a.subtype == subtype]


# --- normalisation on hand-written text -------------------------------------------------


@pytest.mark.parametrize("text, iso", [
    ("May 31, 2017", "2017-05-31"), ("31 May 2017", "2017-05-31"), ("2017-05-31", "2017-05-31"),
    ("2020年5月28日", "2020-05-28"), ("2021 年 1 月 1 日", "2021-01-01"),
    ("二〇二〇年五月二十八日", "2020-05-28"), ("Sept. 3, 1999", "1999-09-03"),
    ("1st day of June, 1998", "1998-06-01"), ("February 30, 2017", None),
    ("December 2021", "2021-12"),
])
def test_dates(text, iso):
    assert normalize_date(text) == iso


@pytest.mark.parametrize("text, value", [
    ("$1,000,000", "USD 1000000"), ("US$5 million", "USD 5000000"), ("$1.5 million", "USD 1500000"),
    ("$2,500.50", "USD 2500.5"), ("¥3,500,000,000", "JPY 3500000000"), ("€200", "EUR 200"),
    ("10,000 dollars", "USD 10000"), ("5万元", "CNY 50000"),
])
def test_money(text, value):
    assert normalize_money(text) == value


@pytest.mark.parametrize("text, value", [
    ("thirty (30) days", "P30D"), ("five years", "P5Y"), ("twelve (12) months", "P12M"),
    ("forty-five (45) Business Days", "P45D"), ("2 weeks", "P2W"),
    ("one hundred and twenty (120) days", "P120D"), ("六个月", "P6M"), ("三年", "P3Y"),
])
def test_durations(text, value):
    assert normalize_duration(text) == value


def test_number_words():
    assert words_to_int("one hundred twenty-five") == 125
    assert words_to_int("ninety") == 90 and words_to_int("banana") is None


def test_entities_in_a_sentence():
    doc = text_doc("The Licensee shall pay $250,000 (the “Fee”) within thirty (30) days after "
                   "May 31, 2017, and fifty percent (50%) of Net Sales for five years.")
    assert entities(doc, "MONEY") == [("$250,000", "USD 250000")]
    assert ("thirty (30) days", "P30D") in entities(doc, "DURATION")
    assert ("five years", "P5Y") in entities(doc, "DURATION")
    assert entities(doc, "DATE") == [("May 31, 2017", "2017-05-31")]
    assert entities(doc, "PERCENT") == [("50%", "50%")]
    # "May" as a verb is no date, and section numbers are no money
    doc = text_doc("The Party may terminate under Section 5.2 at any time.")
    assert entities(doc, "DATE") == [] and entities(doc, "MONEY") == []


def test_definition_encoding():
    doc = text_doc("Terms. “Licensed Product” means any product covered by a Valid Claim. "
                   "Other text.")
    d = [a for a in tag_anchors(doc) if a.type == "DEFINITION"]
    assert len(d) == 1 and d[0].text == "Licensed Product" and d[0].value == "licensed product"
    assert doc.text[d[0].span.char_start:d[0].span.char_end] == (
        "“Licensed Product” means any product covered by a Valid Claim.")
    ts, te = definition_term_span(d[0])
    assert doc.text[ts:te] == "Licensed Product"


def test_clause_references_and_logic():
    doc = text_doc("1. Definitions", "Words.", "2. Payment",
                   "Subject to Sections 1 and 2, and notwithstanding Section 9.9, "
                   "pursuant to Section 365(n) of the Bankruptcy Code, however, nothing.")
    an = tag_anchors(doc)
    refs = {(a.text, a.target_section_id, a.subtype) for a in an if a.type == "CLAUSE"}
    s1 = next(s.id for s in doc.sections if s.number == "1")
    s2 = next(s.id for s in doc.sections if s.number == "2")
    assert ("Sections 1", s1, None) in refs and ("2", s2, None) in refs
    assert ("Section 9.9", None, None) in refs  # no such section: unresolved, still tagged
    assert ("Section 365(n)", None, "external") in refs
    logic = [a.value for a in an if a.type == "LOGIC"]
    assert logic == ["subject to", "notwithstanding", "pursuant to", "however"]
    zh = text_doc("第一条 为了保护民事主体的合法权益。", "第二条 依照本法第一条的规定，但是法律另有规定的除外。")
    an = tag_anchors(zh)
    ref = [a for a in an if a.type == "CLAUSE"]
    assert [(a.text, a.value, a.target_section_id) for a in ref] == [("本法第一条", "第1条", "s1")]
    assert {a.value for a in an if a.type == "LOGIC"} >= {"依照", "但是"}


# --- the corpus ---------------------------------------------------------------------------


def test_every_anchor_is_located(docs):
    for doc in docs.values():
        ids = {s.id for s in doc.sections}
        for a in doc.anchors:
            loc = doc.locate(a.span.char_start)
            assert (a.span.page, a.span.line_start) == (loc.page, loc.line)
            assert a.section_id is None or a.section_id in ids
            if a.type != "DEFINITION" and a.type != "PAPER":
                assert doc.text[a.span.char_start:a.span.char_end] == a.text


def test_array_parties_date_and_definitions(docs):
    # Page 1 (checked by hand): "... dated as of May 31, 2017 (the “Effective Date”), is made
    # ... by and between Array BioPharma Inc., ... (“Array”) and Ono Pharmaceutical Co., Ltd.,
    # ... (“Ono”)." CUAD's gold parties for this contract are exactly these names.
    doc = docs["array"]
    orgs = {(a.text, a.value) for a in doc.anchors if a.subtype == "ORG" and a.span.page == 1}
    assert ("Array BioPharma Inc.", "Array BioPharma Inc.") in orgs
    assert ("Ono Pharmaceutical Co., Ltd.", "Ono Pharmaceutical Co., Ltd.") in orgs
    assert ("Array", "Array BioPharma Inc.") in orgs
    assert ("Ono", "Ono Pharmaceutical Co., Ltd.") in orgs
    dates = [(a.text, a.value, a.span.page) for a in doc.anchors if a.subtype == "DATE"]
    assert ("May 31, 2017", "2017-05-31", 1) in dates
    terms = {a.text: a for a in doc.anchors if a.type == "DEFINITION"}
    assert {"Agreement", "Effective Date", "Affiliate", "Annual Net Sales"} <= set(terms)
    eff = terms["Effective Date"]
    assert doc.text[eff.span.char_start:].startswith("THIS LICENSE, DEVELOPMENT AND COMMERCIALIZATION")
    assert doc.text[:eff.span.char_end].endswith("(“Ono”).")


def test_a_gold_defined_term_of_each_contract(docs):
    # CUAD's gold "Parties" answers quote each contract's own defined names.
    gold = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines()]
    parties = {r["doc_file"]: {s["text"] for s in r["gold_spans"]} for r in gold
               if r["category"] == "Parties"}
    expect = {"array": ("contract_ArrayBioPharma", "Array"),
              "ibm": ("contract_IBM", "IBM"),
              "goosehead": ("contract_Goosehead", "Franchisee")}
    for name, (prefix, term) in expect.items():
        spans = next(v for k, v in parties.items() if prefix in k)
        assert any(term in s for s in spans), (term, spans)
        defs = [a for a in docs[name].anchors if a.type == "DEFINITION" and a.text == term]
        assert defs, f"{term} not defined in {name}"
        assert defs[0].span.page in {1, 3}  # the preamble: IBM/Array page 1, Goosehead page 3
    ibm_alias = [a for a in docs["ibm"].anchors if a.subtype == "ORG" and a.text == "IBM"]
    assert ibm_alias and ibm_alias[0].value == "International Business Machines Corporation"


def test_durations_and_money_in_the_contracts(docs):
    # Goosehead page 5 (gold "Expiration Date"): "... will expire ten (10) years from the
    # Effective Date"; page 4: "... a fee of $500"; IBM page 4 (gold "Renewal Term"):
    # "... renewed for periods of twelve (12) months unless either Party gives six (6) months".
    g = [(a.text, a.value, a.span.page) for a in docs["goosehead"].anchors if a.type == "ENTITY"]
    assert ("ten (10) years", "P10Y", 5) in g
    assert ("$500", "USD 500", 4) in g
    i = [(a.text, a.value, a.span.page) for a in docs["ibm"].anchors if a.subtype == "DURATION"]
    assert ("twelve (12) months", "P12M", 4) in i and ("six (6) months", "P6M", 4) in i
    assert ("three (3) years", "P3Y", 4) in i


def test_clause_references_resolve(docs):
    # Array page 2: "... but subject to Section 2.4 (Future Third Party Partners), ..." and
    # the heading "2.4 Future Third Party Partners." is on page 21.
    doc = docs["array"]
    secs = {s.id: s for s in doc.sections}
    ref = [a for a in doc.anchors if a.type == "CLAUSE" and a.text == "Section 2.4" and a.span.page == 2]
    assert ref and secs[ref[0].target_section_id].title == "Future Third Party Partners"
    assert secs[ref[0].target_section_id].span.page == 21
    # IBM page 4: "... unless terminated as provided in Section 5.0." -> SECTION 5.0 TERMINATION
    ibm = docs["ibm"]
    ref = [a for a in ibm.anchors if a.type == "CLAUSE" and a.value == "Section 5.0"]
    assert ref
    assert {s.title for s in ibm.sections if s.id == ref[0].target_section_id} == {"TERMINATION"}
    # Civil Code page 65: "土地承包经营权人有权依据本法第二百四十三条的规定..." -> the
    # article on page 48
    civil = docs["civil"]
    secs = {s.id: s for s in civil.sections}
    ref = [a for a in civil.anchors if a.type == "CLAUSE" and a.text == "本法第二百四十三条"
           and a.span.page == 65]
    assert ref and ref[0].value == "第243条"
    target = secs[ref[0].target_section_id]
    assert target.number == "第二百四十三条" and target.span.page == 48
    # every resolved reference points at a section with the referenced number ("Article 7"
    # may be numbered "7" in a document, and "Section 13" may be "ARTICLE XIII")
    n = 0
    for d in docs.values():
        secs = {s.id: s for s in d.sections}
        for a in d.anchors:
            if a.type == "CLAUSE" and a.target_section_id:
                want = section_key(a.value.split("(")[0])
                have = section_key(secs[a.target_section_id].number)
                assert as_num(want) == as_num(have), (a.value, secs[a.target_section_id].number)
                n += 1
    assert n > 20


def as_num(key: tuple) -> tuple:
    return ("num", (key[1],)) if key[0] in {"article", "chapter", "条"} else key


def test_external_references_do_not_resolve(docs):
    # Array page 4: "Section 13(d) and 14(d) of the United States Securities Exchange Act"
    ext = [a for a in docs["array"].anchors if a.type == "CLAUSE" and a.span.page == 4
           and a.value.startswith(("Section 13", "Section 14"))]
    assert ext and all(a.subtype == "external" and a.target_section_id is None for a in ext)


def test_civil_code_date(docs):
    # Page 1: "（2020年5月28日第十三届全国人民代表大会第三次会议通过）"
    d = [(a.text, a.value, a.span.page) for a in docs["civil"].anchors if a.subtype == "DATE"]
    assert ("2020年5月28日", "2020-05-28", 1) in d


def test_topics_per_section(docs):
    doc = docs["array"]
    topics = [a for a in doc.anchors if a.type == "TOPIC"]
    assert topics and all(a.subtype == a.section_id for a in topics)
    per = {}
    for a in topics:
        per.setdefault(a.subtype, []).append(a.value)
    assert all(len(v) <= 3 for v in per.values())
    # 2.2 "Sublicensees and Distributors" is about sublicensing
    s22 = next(s.id for s in doc.sections if s.number == "2.2")
    assert any(v.startswith("sublicens") for v in per[s22])


def test_paper_metadata(docs):
    doc = docs["paper"]
    paper = [a for a in doc.anchors if a.type == "PAPER"]
    title = [a.value for a in paper if a.subtype == "TITLE"]
    authors = [a.value for a in paper if a.subtype == "AUTHOR"]
    years = [a.value for a in paper if a.subtype == "YEAR"]
    assert title == ["Lost in the Middle: How Language Models Use Long Contexts"]
    assert authors[0] == "Nelson F. Liu"
    # two-column layout may interleave the author lines; the set is what matters
    assert sorted(authors) == sorted(["Nelson F. Liu", "Kevin Lin", "John Hewitt",
                                      "Ashwin Paranjape", "Michele Bevilacqua", "Fabio Petroni",
                                      "Percy Liang"])
    assert years == ["2023"]
    # contracts are not papers
    assert not [a for a in docs["array"].anchors if a.type == "PAPER"]
