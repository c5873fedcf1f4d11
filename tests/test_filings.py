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


# Each filing's Items with the page where the heading opens the body, read off the PDFs
# (tests/data/filing_items.tsv; bench/structure.py reads the same table).
def expected_items() -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    with open(Path(__file__).parent / "data" / "filing_items.tsv", encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith(("#", "filing\t")):
                filing, item, page = line.rstrip("\n").split("\t")[:3]
                table.setdefault(filing, {})[item] = int(page)
    return table


EXPECTED_ITEMS = expected_items()
ALL_FILINGS = {name: CORPUS / "pdf" / f"filing_{name}_10K.pdf" for name in EXPECTED_ITEMS}
# Each 10-K's title: the registrant as its cover writes it (in the case its own text uses
# for a name the cover prints in capitals), the form, and the fiscal year the report covers.
TITLES = {
    "AMERICANEXPRESS_2022": "American Express Company — Form 10-K, fiscal year 2022",
    "AMERICANWATERWORKS_2020": "American Water Works Company, Inc. — Form 10-K, fiscal year 2020",
    "BESTBUY_2023": "Best Buy Co., Inc. — Form 10-K, fiscal year 2023",
    "BLOCK_2020": "Square, Inc. — Form 10-K, fiscal year 2020",
    "COCACOLA_2017": "The Coca-Cola Company — Form 10-K, fiscal year 2017",
    "CORNING_2022": "Corning Incorporated — Form 10-K, fiscal year 2022",
    "COSTCO_2021": "Costco Wholesale Corporation — Form 10-K, fiscal year 2021",
    "GENERALMILLS_2019": "General Mills, Inc. — Form 10-K, fiscal year 2019",
    "KRAFTHEINZ_2019": "The Kraft Heinz Company — Form 10-K, fiscal year 2019",
    "LOCKHEEDMARTIN_2020": "Lockheed Martin Corporation — Form 10-K, fiscal year 2020",
    "MGMRESORTS_2018": "MGM Resorts International — Form 10-K, fiscal year 2018",
    "MICROSOFT_2016": "Microsoft Corporation — Form 10-K, fiscal year 2016",
    "NETFLIX_2015": "Netflix, Inc. — Form 10-K, fiscal year 2015",
    "NIKE_2018": "NIKE, Inc. — Form 10-K, fiscal year 2018",
    "PEPSICO_2022": "PepsiCo, Inc. — Form 10-K, fiscal year 2022",
    "WALMART_2020": "Walmart Inc. — Form 10-K, fiscal year 2020",
}
MAIN_ITEMS = ("Item 1", "Item 1A", "Item 7", "Item 7A", "Item 8")


def whole(path: Path) -> Document:
    raw, meta = parse_pdf(path)
    doc = assemble(raw, doc_id="t", content_sha256="t", path=str(path), type="pdf", metadata=meta)
    doc.sections = detect_sections(doc)
    return doc


def test_every_corpus_filing_has_its_items_checked():
    assert set(EXPECTED_ITEMS) == {p.stem.removeprefix("filing_").removesuffix("_10K")
                                   for p in (CORPUS / "pdf").glob("filing_*.pdf")}
    assert set(TITLES) == set(EXPECTED_ITEMS)
    for name, want in EXPECTED_ITEMS.items():
        assert {"Item 1", "Item 1A", "Item 7", "Item 8"} <= set(want), name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_ITEMS))
def test_filing_items_and_their_pages(name):
    doc = whole(ALL_FILINGS[name])
    got = {k: v[0] for k, v in items(doc).items()}
    assert {k: got.get(k) for k in EXPECTED_ITEMS[name]} == EXPECTED_ITEMS[name]
    # The main Items carry their titles as printed.
    titled = {s.number: s.title for s in doc.sections if s.number in MAIN_ITEMS}
    assert all(titled.get(k) for k in MAIN_ITEMS if k in EXPECTED_ITEMS[name]), titled
    # An Item ends where the next begins: no Item spans the filing from its contents page.
    ordered = [s for s in doc.sections if s.number in EXPECTED_ITEMS[name]]
    for a, b in zip(ordered, ordered[1:]):
        assert a.span.page_end in (b.span.page, b.span.page - 1), (a.number, a.span.page_end, b.number, b.span.page)
    # PART II opens with Item 5 (Walmart's body prints no "PART I" above Item 1).
    parts = {s.number: s.span.page for s in doc.sections if s.number and s.number.startswith("PART ")}
    assert parts["PART II"] == EXPECTED_ITEMS[name]["Item 5"]
    assert parts.get("PART I", EXPECTED_ITEMS[name]["Item 1"]) == EXPECTED_ITEMS[name]["Item 1"]
    assert build_title(doc) == TITLES[name]


def build_title(doc: Document) -> str | None:
    from docqa.pipelines.ingest.build import cover_title

    return cover_title(doc)


@pytest.mark.parametrize("name", sorted(TITLES))
def test_filing_titles_from_the_cover(name, tmp_path):
    # The cover (pages 1-2) names the registrant, the form and the period; the case of a
    # name in capitals (and the spaces of one in small capitals, "MGM R ESORTS") and a name
    # drawn as a picture come from the rest of the filing, so here only the letters are
    # compared (the whole filings: the slow test above).
    title = build_title(cut(ALL_FILINGS[name], [1, 2], tmp_path))
    letters = lambda t: "".join(t.split()).casefold()  # noqa: E731
    if name == "COCACOLA_2017":  # its cover prints the name as a logo; the signatures page has it
        assert title is None
    else:
        assert title is not None and letters(title) == letters(TITLES[name])


def test_fiscal_year_is_the_year_reported_on():
    from docqa.pipelines.document import RawLine, RawPage
    from docqa.pipelines.ingest.build import cover_title

    def title(period: str, name: str = "JOHNSON & JOHNSON") -> str | None:
        lines = ["UNITED STATES", "FORM 10-K", f"For the fiscal year ended {period}", name,
                 "(Exact name of registrant as specified in its charter)", "Johnson & Johnson reports."]
        doc = assemble([RawPage(lines=[RawLine(text=t) for t in lines])], doc_id="t", content_sha256="t",
                       path="x", type="pdf")
        return cover_title(doc)

    # A 52/53-week year closed on the Sunday nearest 31 December is named for that December.
    assert title("January 1, 2023") == "Johnson & Johnson — Form 10-K, fiscal year 2022"
    assert title("January 28, 2023") == "Johnson & Johnson — Form 10-K, fiscal year 2023"
    assert title("December 31, 2022") == "Johnson & Johnson — Form 10-K, fiscal year 2022"
    # No mixed-case spelling in the text: the name stays as the cover prints it.
    assert title("May 31, 2018", "CVS HEALTH CORPORATION") == "CVS HEALTH CORPORATION — Form 10-K, fiscal year 2018"
    # A file number above the caption is no name.
    assert title("May 31, 2018", "Commission File Number 001-02217") is None


def test_accession_number_is_no_title():
    from docqa.pipelines.ingest.build import usable_title

    assert usable_title("0000004962-23-000006") is None
    assert usable_title(" Annual Report 2022 ") == "Annual Report 2022"


def test_body_page_of_short_items_is_not_a_contents_page():
    # Costco's page 66 holds Items 9B-15 from PARTs II, III and IV (each a line or two,
    # "incorporated herein by reference"): body, not a second contents page. A contents page
    # lists Items that come again further on.
    from docqa.pipelines.document import RawLine, RawPage

    numbers = ["1", "1A", "2", "5", "7", "8", "9", "9A", "9B", "10", "11", "15"]
    contents = ["TABLE OF CONTENTS", "PART I"] + [f"Item {n}—Heading {n}" for n in numbers[:3]] + ["PART II"] + [
        f"Item {n}—Heading {n}" for n in numbers[3:9]] + ["PART III"] + [f"Item {n}—Heading {n}" for n in numbers[9:11]] + [
        "PART IV", "Item 15—Heading 15"]
    body = [["PART I", "Item 1—Business", "We sell things."], ["Item 1A—Risk Factors", "Risks."],
            ["Item 2—Properties", "Warehouses.", "PART II", "Item 5—Market", "Shares."],
            ["Item 7—Management's Discussion", "Text."], ["Item 8—Financial Statements", "Figures."],
            ["Item 9—Changes in Accountants", "None.", "Item 9A—Controls and Procedures", "Effective."],
            ["Item 9B—Other Information", "None.", "PART III", "Item 10—Directors", "See the Proxy Statement.",
             "Item 11—Executive Compensation", "See the Proxy Statement.", "PART IV", "Item 15—Exhibits", "Listed."]]
    pages = [RawPage(lines=[RawLine(text=t) for t in lines]) for lines in [contents, *body]]
    doc = assemble(pages, doc_id="t", content_sha256="t", path="x", type="pdf")
    got = {s.number: s.span.page for s in detect_sections(doc) if s.number.startswith("Item")}
    assert got == {"Item 1": 2, "Item 1A": 3, "Item 2": 4, "Item 5": 4, "Item 7": 5, "Item 8": 6, "Item 9": 7,
                   "Item 9A": 7, "Item 9B": 8, "Item 10": 8, "Item 11": 8, "Item 15": 8}


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
    assert doc.metadata["respaced_words"] >= 2


def test_words_and_lines_as_printed(tmp_path):
    # American Water Works' 10-K draws justified lines in runs cut anywhere; pypdf reads
    # "Resultsof" (p.3: "Results" ends a printed line, "of" opens the next), "obta in" (p.4)
    # and breaks "ITEM 8.    FINANC" / "IAL STATEMENTS ..." on one baseline (p.79).
    doc = cut(ALL_FILINGS["AMERICANWATERWORKS_2020"], [3, 4, 79], tmp_path)
    lines = lambda n: [ln.text for ln in doc.pages[n - 1].lines]  # noqa: E731
    assert any(t.endswith("Analysis of Financial Condition and Results") for t in lines(3))
    assert any(t.startswith("of Operations, and in other sections of this Form 10-K") for t in lines(3))
    assert any("the Company’s ability to obtain permits and other approvals" in t for t in lines(4))
    assert "ITEM 8.    FINANCIAL STATEMENTS AND SUPPLEMENTARY DATA" in lines(79)
    assert {"3", "4", "79"} <= set(doc.metadata["relined_page_numbers"])
    assert {"3", "4"} <= set(doc.metadata["respaced_page_numbers"])
    assert doc.metadata["respaced_words"] >= 10


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
