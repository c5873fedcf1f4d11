"""Annual reports (10-K) in the corpus: Items and PARTs as sections with their body pages,
statement tables as one line per row, and the figure analysis of questions.

Expected values were read off the PDFs by hand: each Item's heading page is where the
"Item N." heading opens the body (the contents page lists them all on page 2-3); table
rows are the printed statements' rows. The default run uses cut-down filings (first pages,
or single pages, cut with pypdf so page numbers are unchanged); the whole filings are
`slow`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from docqa.pipelines.document import Document, assemble
from docqa.pipelines.answer.figures import analyze_figures, row_matches, statement_of, years_in
from docqa.pipelines.ingest.pdf import parse_pdf
from docqa.pipelines.ingest.sections import detect_sections

from corpus import CORPUS

pytestmark = pytest.mark.skipif(not (CORPUS / "pdf").is_dir(), reason="needs ../shared/corpus (the filings)")

FILINGS = {name: CORPUS / "pdf" / f"filing_{name}_10K.pdf"
           for name in ("AMERICANEXPRESS_2022", "BESTBUY_2023", "BLOCK_2020", "CORNING_2022", "PEPSICO_2022")}


def cut(path: Path, pages: list[int], tmp: Path) -> Document:
    """The given 1-based pages of a PDF; pages not wanted are replaced by blank ones, so
    physical page numbers are unchanged."""
    reader = PdfReader(path)
    if reader.is_encrypted:
        reader.decrypt("")
    writer = PdfWriter()
    last = max(pages)
    for n, page in enumerate(reader.pages[:last], 1):
        if n in pages:
            writer.add_page(page)
        else:
            writer.add_blank_page(width=612, height=792)
    out = tmp / f"{path.stem}_{pages[0]}-{last}.pdf"
    with open(out, "wb") as f:
        writer.write(f)
    raw, meta = parse_pdf(out)
    doc = assemble(raw, doc_id="t", content_sha256="t", path=str(out), type="pdf", metadata=meta)
    doc.sections = detect_sections(doc)
    return doc


def items(doc: Document) -> dict[str, tuple[int, int]]:
    return {s.number: (s.span.page, s.span.page_end) for s in doc.sections if s.number and s.number.startswith("Item ")}


# --- sections ----------------------------------------------------------------------------


def test_bestbuy_items_start_where_their_body_starts(tmp_path):
    # Page 3 is the table of contents ("Item 1. Business. 4" ... "Item 16. Form 10-K Summary.
    # 67"); none of its entries may become a section.
    doc = cut(FILINGS["BESTBUY_2023"], list(range(1, 25)), tmp_path)
    got = items(doc)
    # An Item whose successor opens the next page ends on its own last page.
    assert got == {"Item 1": (4, 8), "Item 1A": (8, 18), "Item 1B": (18, 18), "Item 2": (19, 20),
                   "Item 3": (20, 20), "Item 4": (20, 21), "Item 5": (21, 22), "Item 6": (22, 22),
                   "Item 7": (23, 24)}
    by_number = {s.number: s for s in doc.sections}
    assert by_number["Item 1A"].title == "Risk Factors"  # no "8" kept from the contents
    parts = {s.number: (s.span.page, s.span.page_end) for s in doc.sections if s.level == 1}
    assert parts == {"PART I": (4, 21), "PART II": (21, 24)}
    assert by_number["Item 7"].parent_id == by_number["PART II"].id
    assert not [s for s in doc.sections if s.span.page <= 3]


def test_items_on_a_contents_page_alone_are_not_sections(tmp_path):
    doc = cut(FILINGS["BESTBUY_2023"], [1, 2, 3], tmp_path)
    assert items(doc) == {}


def test_an_item_named_in_running_text_is_not_a_heading():
    from docqa.pipelines.document import RawLine, RawPage

    lines = ["PART I", "Item 1. Business", "We sell things.", "Item 1A. Risk Factors", "Risks.",
             "Item 2. Properties", "PART II", "Item 5. Market", "See the discussion in",
             "Item 8, Financial Statements and Supplementary Data, of this report.",
             "Item 15 of this Annual Report on Form 10-K.", "Item 7. Management's Discussion", "Text."]
    doc = assemble([RawPage(lines=[RawLine(text=t) for t in lines])], doc_id="t", content_sha256="t",
                   path="x", type="text")
    assert [s.number for s in detect_sections(doc)] == [
        "PART I", "Item 1", "Item 1A", "Item 2", "PART II", "Item 5", "Item 7"]


def test_franchise_disclosure_items_in_a_contract_are_not_filing_items():
    from docqa.pipelines.document import RawLine, RawPage

    lines = ["1. GRANT", "The franchisor grants a licence.", "Item 5. Initial Fees", "see the FDD."]
    doc = assemble([RawPage(lines=[RawLine(text=t) for t in lines])], doc_id="t", content_sha256="t",
                   path="x", type="text")
    assert [s.number for s in detect_sections(doc)] == ["1"]


# Each filing's Items with the page where the heading opens the body, read off the PDFs.
EXPECTED_ITEMS = {
    "AMERICANEXPRESS_2022": {"Item 1": 4, "Item 1A": 25, "Item 1B": 40, "Item 2": 40, "Item 3": 40, "Item 4": 40,
                             "Item 5": 41, "Item 6": 42, "Item 7": 43, "Item 7A": 91, "Item 8": 91, "Item 9": 158,
                             "Item 9A": 158, "Item 9B": 158, "Item 9C": 158, "Item 14": 160, "Item 15": 161,
                             "Item 16": 166},
    "BESTBUY_2023": {"Item 1": 4, "Item 1A": 8, "Item 1B": 18, "Item 2": 19, "Item 3": 20, "Item 4": 20,
                     "Item 5": 21, "Item 6": 22, "Item 7": 23, "Item 7A": 33, "Item 8": 35, "Item 9": 64,
                     "Item 9A": 64, "Item 9B": 64, "Item 9C": 64, "Item 10": 64, "Item 11": 64},
    "BLOCK_2020": {"Item 1": 5, "Item 1A": 18, "Item 2": 46, "Item 3": 47, "Item 4": 48, "Item 5": 49,
                   "Item 6": 52, "Item 7": 57, "Item 8": 79, "Item 9A": 140, "Item 9B": 141, "Item 10": 142, "Item 15": 143,
                   "Item 16": 146},
    "CORNING_2022": {"Item 1": 2, "Item 1A": 13, "Item 1B": 20, "Item 2": 20, "Item 3": 20, "Item 4": 20,
                     "Item 5": 21, "Item 6": 22, "Item 7": 23, "Item 7A": 44, "Item 8": 44, "Item 9": 44,
                     "Item 9A": 45, "Item 9B": 45, "Item 9C": 45, "Item 10": 46, "Item 11": 48, "Item 12": 48,
                     "Item 13": 49, "Item 14": 49, "Item 15": 50, "Item 16": 52},
    "PEPSICO_2022": {"Item 1": 4, "Item 1A": 13, "Item 1B": 25, "Item 2": 26, "Item 3": 26, "Item 4": 26,
                     "Item 5": 30, "Item 7": 31, "Item 7A": 118, "Item 8": 118, "Item 9": 118, "Item 9A": 118,
                     "Item 9B": 119, "Item 9C": 119, "Item 10": 119, "Item 11": 119, "Item 12": 120,
                     "Item 13": 120, "Item 14": 120},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_ITEMS))
def test_filing_items_and_their_pages(name):
    raw, meta = parse_pdf(FILINGS[name])
    doc = assemble(raw, doc_id="t", content_sha256="t", path="x", type="pdf", metadata=meta)
    doc.sections = detect_sections(doc)
    got = {k: v[0] for k, v in items(doc).items()}
    for number, page in EXPECTED_ITEMS[name].items():
        assert got.get(number) == page, (number, got)
    # An Item ends where the next begins: no Item spans the filing from its contents page.
    ordered = [s for s in doc.sections if s.number in EXPECTED_ITEMS[name]]
    for a, b in zip(ordered, ordered[1:]):
        assert a.span.page_end in (b.span.page, b.span.page - 1), (a.number, a.span.page_end, b.number, b.span.page)
    parts = [s for s in doc.sections if s.number and s.number.startswith("PART ")]
    assert [s.number for s in parts][:2] == ["PART I", "PART II"]
    assert parts[0].span.page == min(EXPECTED_ITEMS[name].values())


# --- tables ------------------------------------------------------------------------------


def test_statement_rows_keep_label_values_and_years(tmp_path):
    # Best Buy's Consolidated Statements of Earnings (page 40) draws its labels and its three
    # value columns as separate runs; each row must come out as one line.
    doc = cut(FILINGS["BESTBUY_2023"], [40], tmp_path)
    lines = [ln.text for ln in doc.pages[39].lines]
    assert "Revenue | January 28, 2023: 46,298 | January 29, 2022: 51,761 | January 30, 2021: 47,262" in lines
    assert ("Diluted earnings per share | January 28, 2023: 6.29 | January 29, 2022: 9.84 | "
            "January 30, 2021: 6.84") in lines
    assert "Restructuring charges | January 28, 2023: 147 | January 29, 2022: (34) | January 30, 2021: 254" in lines
    assert doc.metadata["table_page_numbers"] == ["40"]


def test_garbled_statement_rows_are_rebuilt_from_positions(tmp_path):
    # Block's statement of operations (page 86): pypdf's text run gives
    # "ed revenue1,539,403  1,031,456  591,706  Hardware revenue".
    doc = cut(FILINGS["BLOCK_2020"], [86], tmp_path)
    lines = [ln.text for ln in doc.pages[85].lines]
    assert "Subscription and services-based revenue | 2020: 1,539,403 | 2019: 1,031,456 | 2018: 591,706" in lines
    assert "Total net revenue | 2020: 9,497,578 | 2019: 4,713,500 | 2018: 3,298,177" in lines
    assert "CONSOLIDATED STATEMENTS OF OPERATIONS" in lines


def test_text_pages_keep_pypdf_lines(tmp_path):
    doc = cut(FILINGS["BESTBUY_2023"], [7], tmp_path)
    reader = PdfReader(FILINGS["BESTBUY_2023"])
    reader.decrypt("") if reader.is_encrypted else None
    ref = [ln.rstrip() for ln in reader.pages[6].extract_text().splitlines() if ln.strip()]
    assert [ln.text for ln in doc.pages[6].lines] == ref
    assert doc.metadata["table_page_numbers"] == []


# --- words split by text runs -------------------------------------------------------------


def test_words_split_by_text_runs_are_rejoined(tmp_path):
    # Block's 10-K: pypdf gives "Qualita tive" (contents, page 3) and "seller s" (page 11),
    # where the glyphs touch; page 77 spells "qualitative" whole.
    doc = cut(FILINGS["BLOCK_2020"], [3, 11, 77], tmp_path)
    text = lambda n: " ".join(ln.text.replace("\xa0", " ") for ln in doc.pages[n - 1].lines)
    assert "Quantitative and Qualitative Disclosures About Market Risk" in text(3)
    assert "enabling sellers to spend" in text(11)
    assert "Qualita tive" not in text(3) and "seller s " not in text(11)
    assert doc.metadata["rejoined_words"] >= 2


# --- figures -----------------------------------------------------------------------------


def test_figure_questions():
    fq = analyze_figures("What were the total revenues in 2022?")
    assert [m.name for m in fq.metrics] == ["revenue"] and fq.years == (2022,) and fq.wanted
    assert "income" in fq.statements
    fq = analyze_figures("What is the FY2022 unadjusted EBITDA less capex for PepsiCo?")
    assert {"capex", "operating income", "depreciation"} <= {m.name for m in fq.metrics}
    assert fq.years == (2022,) and "cash" in fq.statements
    assert analyze_figures("How many employees did Best Buy have at the end of fiscal 2023?").years == (2023,)
    assert years_in("between FY2021 and FY22") == (2021, 2022)
    # A contract's clause question names revenue, but asks for no figure.
    assert not analyze_figures('Highlight the parts related to "Revenue/Profit Sharing". Is one party '
                               "required to share revenue or profit with the counterparty?").wanted


def test_statement_pages_and_rows():
    assert statement_of(["Table of Contents", "CONSOLIDATED STATEMENTS OF INCOME", "Year Ended"]) == "income"
    assert statement_of(["Consolidated Statement of Cash Flows", "PepsiCo, Inc. and Subsidiaries"]) == "cash"
    assert statement_of(["CONSOLIDATED BALANCE SHEETS"]) == "balance"
    assert statement_of(["Consolidated Statements of Comprehensive Income"]) is None
    assert statement_of(["Item 8. Financial Statements", "See the Consolidated Statements of Income on page 62"
                         " and the notes that follow them for the figures we report."]) is None
    fq = analyze_figures("What were the total revenues in 2022?")
    assert row_matches("Total revenues | 2022: 66,608 | 2021: 62,286", fq) == 2
    assert row_matches("Total revenues | 2020: 36,087", fq) == 1
    assert row_matches("Revenues are recognized when control passes.", fq) == 0


# --- evidence previews -------------------------------------------------------------------


def test_preview_centres_on_the_lines_that_match():
    from docqa.pipelines.answer.query import preview

    passage = ("B. Entire Agreement. This Agreement constitutes the entire agreement between the parties with\n"
               "respect to its subject matter and supersedes all prior agreements, understandings and\n"
               "negotiations, whether written or oral, between the parties concerning the same.\n"
               "C. Governing Law. This Agreement shall be governed by the laws of the State of Delaware.\n"
               "D. Notices. All notices shall be in writing.")
    shown = preview(passage, "Which state's law governs?", 160)
    assert "Governing Law" in shown and "Delaware" in shown and len(shown) <= 160
    assert shown.startswith("…")  # the passage's first lines were left out, visibly
    # Nothing matches: the passage's start.
    assert preview(passage, "zebra crossing", 60).startswith("B. Entire Agreement")
    # A long line is cut around its first matching word.
    long = "x " * 200 + "the effective tax rate was 21.6% in 2022 " + "y " * 200
    assert "effective tax rate was 21.6%" in preview(long, "What was the effective tax rate?", 120)
