"""pipelines.ingest.pdf against pypdf's own extraction and facts checked by hand in the corpus."""

from __future__ import annotations

import csv
import io
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from docqa.pipelines.errors import IngestError
from docqa.pipelines.ingest.pdf import NO_TEXT_LAYER, parse_pdf

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus"
PDFS = sorted(CORPUS.glob("pdf/*.pdf")) + sorted(CORPUS.glob("zh/*.pdf"))
PAPER = CORPUS / "pdf/paper_arXiv_2307.03172_Lost_in_the_Middle.pdf"
ARRAY = CORPUS / "pdf/contract_ArrayBioPharma_Ono_License_Development_Commercialization_Agreement.pdf"
GOOSEHEAD = CORPUS / "pdf/contract_GooseheadInsurance_Franchise_Agreement.pdf"
CIVIL_CODE = CORPUS / "zh/zh_PRC_Civil_Code_2020.pdf"
# Checked by eye: the paper is two-column on pages 1-16; 17-18 are full-width appendix tables.
# These 10-Ks are single-column throughout. The pages once taken for two columns are statement
# tables (AmEx p.57: labels left, figures right), two-column lists ("Note 2   Loans and Card
# Member Receivables", AmEx p.105; subsidiaries beside their jurisdictions, AmEx pp.252-254,
# PepsiCo pp.482-494), signature blocks (AmEx p.167) and Block's table pages (pp.64-66, 113,
# 143): none has running text in a right column.
SINGLE_COLUMN = ("filing_AMERICANEXPRESS_2022_10K.pdf", "filing_BLOCK_2020_10K.pdf", "filing_PEPSICO_2022_10K.pdf")
TWO_COLUMN_PAGES = {PAPER.name: set(range(1, 17)), **{name: set() for name in SINGLE_COLUMN}}


_parsed: dict[Path, tuple] = {}


def parsed(path: Path):
    if path not in _parsed:
        _parsed[path] = parse_pdf(path)
    return _parsed[path]


def reference_lines(text: str) -> list[str]:
    """The documented line rule applied to pypdf's own extract_text()."""
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def manifest_pages() -> dict[str, int]:
    with open(CORPUS / "MANIFEST.tsv", newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t")
        return {Path(r["local_file"]).name: int(r["pdf_pages"]) for r in rows if r["pdf_pages"]}


def sample_pages(n: int) -> list[int]:
    rng = random.Random(1234)
    return sorted({1, (n + 1) // 2, n, *rng.sample(range(1, n + 1), min(3, n))})


# A 10-K takes 5-55 s to parse whole (sixteen of them: five minutes), so the default run reads
# a sample of each filing's pages (`test_sampled_filing_pages`) and the whole-file checks of
# filings are `slow`; every other corpus PDF is read whole in the default run.
WHOLE = [pytest.param(p, marks=pytest.mark.slow) if p.name.startswith("filing_") else p for p in PDFS]
FILINGS = [p for p in PDFS if p.name.startswith("filing_")]


@pytest.mark.parametrize("path", WHOLE, ids=lambda p: p.name[:30])
def test_page_count_matches_manifest(path):
    pages, meta = parsed(path)
    assert len(pages) == meta["page_count"] == manifest_pages()[path.name]


@pytest.mark.parametrize("path", WHOLE, ids=lambda p: p.name[:30])
def test_two_column_pages_are_the_real_ones(path):
    _, meta = parsed(path)
    flagged = {int(n) for n in meta["two_column_page_numbers"]}
    expected = TWO_COLUMN_PAGES.get(path.name)
    if expected is not None:
        assert flagged == expected
    else:
        # Single-column documents; at most two odd pages (a formula or index table) flagged.
        assert len(flagged) <= 2


@pytest.mark.parametrize("path", WHOLE, ids=lambda p: p.name[:30])
def test_lines_agree_with_pypdf(path):
    pages, meta = parsed(path)
    flagged = {int(n) for n in meta["two_column_page_numbers"]}
    tables = {int(n) for n in meta["table_page_numbers"]}
    relined = {int(n) for n in meta["relined_page_numbers"]}
    respaced = {int(n) for n in meta["respaced_page_numbers"]}
    numbers = sorted({*sample_pages(len(pages)), *flagged, *sorted(tables)[:3]})
    check_lines(PdfReader(path), {n: pages[n - 1] for n in numbers}, flagged, tables, relined, respaced)


@pytest.mark.parametrize("path", FILINGS, ids=lambda p: p.name[:30])
def test_sampled_filing_pages(path, tmp_path):
    """A filing's sampled pages, cut out with pypdf and parsed: none taken for two columns
    (the corpus's 10-Ks are single-column throughout) and each page's lines as pypdf reads
    them, by the same rules as the whole-file test."""
    reader = PdfReader(path)
    if reader.is_encrypted:
        reader.decrypt("")
    n = len(reader.pages)
    assert n == manifest_pages()[path.name]
    rng = random.Random(path.name)
    numbers = sorted({*sample_pages(n), *rng.sample(range(1, n + 1), 6)})
    writer = PdfWriter()
    for k in numbers:
        writer.add_page(reader.pages[k - 1])
    cut = tmp_path / path.name
    with open(cut, "wb") as f:
        writer.write(f)
    pages, meta = parse_pdf(cut)
    assert len(pages) == len(numbers)
    flagged = {numbers[int(i) - 1] for i in meta["two_column_page_numbers"]}
    tables = {numbers[int(i) - 1] for i in meta["table_page_numbers"]}
    relined = {numbers[int(i) - 1] for i in meta["relined_page_numbers"]}
    respaced = {numbers[int(i) - 1] for i in meta["respaced_page_numbers"]}
    assert not flagged
    check_lines(reader, dict(zip(numbers, pages)), flagged, tables, relined, respaced)


def check_lines(reader: PdfReader, pages: dict, flagged: set[int], tables: set[int], relined: set[int],
                respaced: set[int]) -> None:
    """Our lines of the given pages (by 1-based number) against pypdf's extraction of them."""
    for n, page in pages.items():
        ref = reference_lines(reader.pages[n - 1].extract_text())
        ours = [ln.text for ln in page.lines]
        if n in flagged:
            if n in respaced:  # the same characters, with word spaces where the glyphs put them
                assert Counter(_solid(ours)) == Counter(_solid(ref)), n
            else:
                assert Counter(" ".join(ours).split()) == Counter(" ".join(ref).split()), n
        elif n in tables:
            # Rebuilt from positions: every figure pypdf saw, none it did not (column
            # headers repeat years already on the page).
            # pypdf may glue a figure to the next one ("31,2017" for "31, 2017"), so "none
            # lost" is checked on digit counts (ours repeat the header years per cell).
            got, want = _figures(ours), _figures(ref)
            assert not _digits(ref) - _digits(ours) and set(got) <= set(want) | set(_figures(ref, split=True)), n
        elif n in relined:
            # Lines cut or joined where pypdf's breaks miss the printed lines: the same
            # characters in the same order.
            assert _solid(ours) == _solid(ref), n
        elif n in respaced:
            # Only the word spaces differ, where the glyph positions show them.
            assert [ln.replace(" ", "") for ln in ours] == [ln.replace(" ", "") for ln in ref], n
        else:
            assert ours == ref, n


def _solid(lines: list[str]) -> str:
    return "".join("".join(lines).split())


def _figures(lines: list[str], split: bool = False) -> Counter:
    text = " ".join(lines)
    if split:  # "31,2017" -> "31, 2017": a day and a year pypdf wrote without their space
        text = re.sub(r"(\d),((?:19|20)\d\d)\b", r"\1, \2", text)
    return Counter(re.findall(r"\d[\d,.]*\d|\d", text))


def _digits(lines: list[str]) -> Counter:
    return Counter(c for c in " ".join(lines) if c.isdigit())


def test_blank_pages_kept_as_empty_pages():
    pages, meta = parsed(ARRAY)
    assert len(pages) == 107
    blank = [i + 1 for i, p in enumerate(pages) if not p.lines]
    assert len(blank) == 16 == meta["blank_pages"]
    reader = PdfReader(ARRAY)
    assert all(not reader.pages[n - 1].extract_text().strip() for n in blank)


def test_two_column_sentence_reads_in_order():
    pages, _ = parsed(PAPER)
    # Page 2, checked by eye: the left column ends mid-sentence and the right one goes on.
    texts = [ln.text for ln in pages[1].lines]
    i = texts.index("text, GPT-3.5-Turbo’s performance on the multi-")
    assert texts[i + 1 : i + 3] == [
        "document question task is lower than its perfor-",
        "mance when predicting without any documents (i.e.,",
    ]
    # Page 1: the abstract and the introduction's first column precede the right column.
    p1 = [ln.text for ln in pages[0].lines]
    assert p1.index("future long-context language models.") < p1.index("1 Introduction")
    assert p1.index("els are augmented with external information (e.g.,") < p1.index(
        "relevant documents from a search engine, database"
    )


def _page_pdf(content: bytes, *, font: bool = True) -> bytes:
    writer = PdfWriter()
    page = writer.add_blank_page(612, 792)
    if font:
        helv = DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
                NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
            }
        )
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(helv)})}
        )
    stream = DecodedStreamObject()
    stream.set_data(content)
    page[NameObject("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


LEFT = [f"Left column line {i:02d} of the first text" for i in range(10)]
RIGHT = [f"Right column line {i:02d} of other text" for i in range(10)]


def test_interleaved_columns_are_separated():
    # Drawn row by row, as some word processors do: pypdf glues each left line to its right
    # neighbour at the same baseline.
    ops = []
    for i, (a, b) in enumerate(zip(LEFT, RIGHT)):
        y = 700 - 14 * i
        ops.append(f"BT /F1 10 Tf 72 {y} Td ({a}) Tj ET BT /F1 10 Tf 320 {y} Td ({b}) Tj ET")
    data = _page_pdf("\n".join(ops).encode())
    glued = reference_lines(PdfReader(io.BytesIO(data)).pages[0].extract_text())
    assert glued[0] == f"{LEFT[0]} {RIGHT[0]}"  # the failure this guards against
    pages, meta = parse_pdf("interleaved.pdf", data)
    assert meta["two_column_pages"] == 1
    assert [ln.text for ln in pages[0].lines] == LEFT + RIGHT


# A 10-K's list of subsidiaries: names left, jurisdictions right, each row drawn as two runs.
SUBSIDIARIES = [
    ("Harbor Street Holdings LLC", "United States, Delaware"),
    ("Northwind Payments Ltd.", "United Kingdom, England"),
    ("Clearwater Card Funding Corporation of the Americas II", "United States, New York"),
    ("Alder Travel Co. Inc.", "United States, New York"),
    ("Bluebird Receivables Trust", "United States, Delaware"),
    ("Meridian Insurance Agency of Massachusetts and Rhode Island, Inc.", "United States, Massachusetts"),
    ("Orchard Global Holdings B.V.", "The Netherlands, Amsterdam"),
    ("Summit Card Pty Limited", "Australia, New South Wales"),
    ("Quayside Holdings, LLC", "United States, Delaware"),
    ("Pine Ridge Bank of Utah", "United States, Utah State"),
    ("Greystone Credit Corp.", "United States, Delaware"),
    ("Lakeview Travel Limited", "Hong Kong, Kowloon City"),
]


def test_a_list_beside_its_jurisdictions_is_not_two_columns():
    # Both sides sit either side of the middle as columns would, and are text; but the names
    # end anywhere, not at a column's edge, so the page keeps pypdf's lines (PepsiCo's and
    # American Express's subsidiaries pages were read as two columns).
    ops = []
    for i, (name, where) in enumerate(SUBSIDIARIES):
        y = 700 - 14 * i
        ops.append(f"BT /F1 10 Tf 72 {y} Td ({name}) Tj ET BT /F1 10 Tf 400 {y} Td ({where}) Tj ET")
    data = _page_pdf("\n".join(ops).encode())
    pages, meta = parse_pdf("subsidiaries.pdf", data)
    assert meta["two_column_pages"] == 0
    ref = reference_lines(PdfReader(io.BytesIO(data)).pages[0].extract_text())
    assert [ln.text for ln in pages[0].lines] == ref
    assert ref[0].startswith("Harbor Street Holdings LLC") and "Delaware" in ref[0]


def test_single_column_page_is_left_alone():
    ops = [f"BT /F1 10 Tf 72 {700 - 14 * i} Td ({LEFT[i % 10]} {RIGHT[i % 10]}) Tj ET" for i in range(20)]
    pages, meta = parse_pdf("single.pdf", _page_pdf("\n".join(ops).encode()))
    assert meta["two_column_pages"] == 0
    assert len(pages[0].lines) == 20


def test_civil_code_page_numbers_are_footers():
    pages, meta = parsed(CIVIL_CODE)
    # The printed number equals the physical page number (checked by eye); it is drawn at the
    # bottom centre of the page (y ~ 50 of 842), although pypdf emits it first.
    for n in (1, 2, 100, 234):
        numbered = [ln for ln in pages[n - 1].lines if ln.text.strip() == str(n)]
        assert numbered and all(ln.role == "footer" for ln in numbered), n
    assert meta["footer_lines"] >= 234
    assert all(ln.role == "body" for ln in pages[99].lines if "第五百二十二条" in ln.text)


def test_contract_headers_and_footers():
    pages, _ = parsed(ARRAY)
    notice = "[ * ] = Certain confidential information contained in this document"
    for n in (1, 2, 50):
        lines = [ln for ln in pages[n - 1].lines if ln.text.startswith(notice)]
        assert lines and all(ln.role == "header" for ln in lines), n
    # Page 50 ends with its printed page number 40.
    assert (pages[49].lines[-1].text.strip(), pages[49].lines[-1].role) == ("40", "footer")
    pages, _ = parsed(GOOSEHEAD)
    last = pages[59].lines[-1]
    assert (last.text, last.role) == ("Page 58 of 80", "footer")
    assert sum(ln.role != "body" for p in pages for ln in p.lines) < 3 * len(pages)


# --- bad input -----------------------------------------------------------------------------

SMALL = CORPUS / "pdf/spec_NIST_FIPS_197_AES_2001.pdf"


def _encrypted(user_password: str, algorithm: str) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(SMALL))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize("algorithm", ["AES-128", "AES-256"])
def test_empty_user_password_opens(algorithm):
    pages, meta = parse_pdf("enc.pdf", _encrypted("", algorithm))
    assert meta["encrypted"] is True
    ref = reference_lines(PdfReader(SMALL).pages[4].extract_text())
    assert [ln.text for ln in pages[4].lines] == ref


def _raises(data: bytes, fragment: str) -> None:
    with pytest.raises(IngestError) as info:
        parse_pdf("bad.pdf", data)
    assert info.value.path == "bad.pdf"
    assert fragment in info.value.reason and "\n" not in str(info.value)


def test_real_password_is_refused():
    _raises(_encrypted("s3cret", "AES-256"), "password-protected")


def test_truncated_pdf():
    data = SMALL.read_bytes()
    _raises(data[: len(data) // 2], "truncated")


def test_random_bytes():
    _raises(random.Random(7).randbytes(4096), "not a PDF")


def test_garbage_after_pdf_header():
    _raises(b"%PDF-1.7\n" + random.Random(8).randbytes(4096) + b"\n%%EOF\n", "corrupt PDF")


def test_zero_bytes(tmp_path):
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    with pytest.raises(IngestError, match="empty file"):
        parse_pdf(empty)


def test_missing_file(tmp_path):
    with pytest.raises(IngestError, match="cannot read"):
        parse_pdf(tmp_path / "nope.pdf")


def test_no_text_layer():
    _raises(_page_pdf(b"0 0 m 100 100 l S", font=False), NO_TEXT_LAYER)
