"""PDF → pages of lines, with pypdf.

Line rule (what `docqa show --page` displays and citations count): a page's lines are
pypdf's `page.extract_text()` split with `str.splitlines()`, each line stripped of trailing
whitespace, lines that are then empty dropped; leading whitespace is kept (monospaced EDGAR
layouts indent with it). A page without text is kept as a page with zero lines, so physical
page numbers never shift.

Two corrections keep the lines as printed where pypdf's own guesses fail, both decided from
the glyph positions: a line that pypdf ran on into the next printed line
is cut where that line begins, and one it broke where nothing moved is joined again
(`_split_lines`; the pages are listed in `relined_page_numbers`); and on pages whose words
look joined or split (the document's own words pick the pages, not the spaces), each word
space goes where the glyphs leave or draw one (`_respace_words`; `respaced_page_numbers`). Only whitespace changes: the characters and
their order are pypdf's.

On a page detected as two-column the same lines are reordered (and a line that pypdf glued
across the gutter is cut in two): bands separated by full-width lines, in each band the left
column before the right, each column in pypdf's order. Display text is never rewritten:
ligatures and hyphenation stay as printed; `textnorm` deals with them when matching.

On a page holding a table (rows of aligned numbers; `_rebuild_table_page`) the lines are
rebuilt from the text's positions instead: pieces of text on one baseline make one line, in
left-to-right order, so a statement row whose label and values the PDF draws in separate
runs ("Revenue" … "$ 46,298 $ 51,761") is one line; a row with numbers keeps its label with
its values and the column headers above them: "Revenue | January 28, 2023: 46,298 |
January 29, 2022: 51,761". Such a line is still one physical line of its page.

Lines repeated at the top or bottom of many pages (modulo digits) get role "header"/"footer";
they are kept, so line numbers still match what the page shows.
"""

from __future__ import annotations

import io
import logging
import math
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError
from pypdf.generic._font import Font

from ..document import RawLine, RawPage
from ..errors import IngestError
from .ocr import NO_TEXT_LAYER, ocr_pages

# Header/footer detection: how many lines at each edge are candidates, and on how many pages
# (absolute and as a share of pages with text) a normalised line must recur.
_EDGE_LINES = 3
_MIN_REPEAT_PAGES = 3
_MIN_REPEAT_SHARE = 0.25

# on_page(step, done, total): "pages" as each page is read, "ocr" as each page without text
# is recognised (see parse_pdf).
PageProgress = Callable[[str, int, int], None]

_IDENTITY = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
_DIGITS = re.compile(r"\d+")
_ROMAN = re.compile(r"\b[ivxlcdm]+\b")
_SPACES = re.compile(r"\s+")


def parse_pdf(path: str | Path, data: bytes | None = None, *,
              on_page: PageProgress | None = None) -> tuple[list[RawPage], dict]:
    """Read a PDF into one `RawPage` per physical page plus its metadata.

    `data`, when given, is the file's content (so callers that already hashed it need not
    read it twice); otherwise `path` is read. Every failure — unreadable, not a PDF,
    truncated, corrupt, password-protected, no text layer — raises `IngestError(path, reason)`.
    `on_page(step, done, total)` is called after each page is read ("pages": every page;
    "ocr": the pages without a text layer, when they are recognised): a 200-page filing
    takes minutes, and its reader wants to see it move.

    Metadata keys: title, author, subject, creator, producer, creation_date, mod_date (ISO 8601
    or None), pdf_version, page_count, encrypted (the file was encrypted, even if it opened
    with the empty password), blank_pages, two_column_pages, two_column_page_numbers,
    table_page_numbers, relined_lines, relined_page_numbers, respaced_words,
    respaced_page_numbers (page numbers as lists of str), header_lines, footer_lines.
    """
    where = str(path)
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise IngestError(where, f"cannot read file: {e.strerror or e}") from None
    _check_envelope(where, data)
    with _quiet_pypdf():
        try:
            reader, encrypted = _open(where, data)
            reads = []
            for page in reader.pages:
                reads.append(_read_page(page))
                if on_page:
                    on_page("pages", len(reads), len(reader.pages))
            respaced = _respace_words(reader, reads)  # {page index: spaces changed}
            widths = _Widths()  # one per document: its fonts' metrics are read once
            pages = [_lay_out(r, widths) for r in reads]
            meta = _metadata(reader, data)
        except IngestError:
            raise
        except (FileNotDecryptedError, DependencyError) as e:
            raise IngestError(where, f"cannot decrypt PDF: {_one_line(e)}") from None
        except RecursionError:
            raise IngestError(where, "corrupt PDF: object structure nested too deeply") from None
        except MemoryError:
            raise IngestError(where, "PDF too large or pathological to parse in memory") from None
        except Exception as e:  # pypdf raises many types on malformed input; all are bad files
            raise IngestError(where, f"corrupt PDF: {_one_line(e)}") from None
    if not pages:
        raise IngestError(where, "PDF has no pages")
    # Pages without a text layer: OCR them (pipelines/ingest/ocr.py; the `ocr` extra).
    blank = [i for i, p in enumerate(pages) if not p.lines]
    ocr = ocr_pages(where, data, blank, required=len(blank) == len(pages),
                    on_page=(lambda done, total: on_page("ocr", done, total)) if on_page else None) if blank else None
    for i, ocr_lines in (ocr.lines.items() if ocr else ()):
        pages[i].lines = [_Line(text=t) for t in ocr_lines]
    if not any(p.lines for p in pages):
        raise IngestError(where, NO_TEXT_LAYER)

    header_lines, footer_lines = _mark_headers_footers(pages)
    raw_pages = [RawPage(lines=[RawLine(text=ln.text, role=ln.role) for ln in p.lines]) for p in pages]
    meta.update(
        encrypted=encrypted,
        page_count=len(pages),
        blank_pages=sum(1 for p in pages if not p.lines),
        two_column_pages=sum(1 for p in pages if p.two_column),
        two_column_page_numbers=[str(i + 1) for i, p in enumerate(pages) if p.two_column],
        table_page_numbers=[str(i + 1) for i, p in enumerate(pages) if p.table],
        header_lines=header_lines,
        footer_lines=footer_lines,
        respaced_words=sum(respaced.values()),
        respaced_page_numbers=[str(i + 1) for i in sorted(respaced)],
        relined_lines=sum(p.cuts for p in pages),
        relined_page_numbers=[str(i + 1) for i, p in enumerate(pages) if p.cuts],
        **(ocr.metadata() if ocr else {}),
    )
    return raw_pages, meta


# --- opening -------------------------------------------------------------------------------


def _check_envelope(where: str, data: bytes) -> None:
    if not data:
        raise IngestError(where, "empty file (0 bytes)")
    if b"%PDF-" not in data[:1024]:
        raise IngestError(where, "not a PDF (no %PDF- header)")
    # A cut-off download still has its first pages, and pypdf would happily rebuild a partial
    # document from them; refusing it is better than citing a document with pages missing.
    if b"%%EOF" not in data[-2048:]:
        raise IngestError(where, "truncated PDF (no %%EOF marker at the end of the file)")


def _open(where: str, data: bytes) -> tuple[PdfReader, bool]:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
    except PdfReadError as e:
        raise IngestError(where, f"corrupt PDF: {_one_line(e)}") from None
    encrypted = reader.is_encrypted
    if encrypted:
        try:
            result = reader.decrypt("")
        except DependencyError as e:
            raise IngestError(where, f"cannot decrypt PDF: {_one_line(e)}") from None
        if result == PasswordType.NOT_DECRYPTED:
            raise IngestError(where, "password-protected PDF (a user password is required to open it)")
    return reader, encrypted


@contextmanager
def _quiet_pypdf() -> Iterator[None]:
    # pypdf logs a warning for every recoverable defect; unconfigured logging would print them
    # all on stderr, where the CLI promises one clear line per bad file.
    logger = logging.getLogger("pypdf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _one_line(e: BaseException) -> str:
    text = _SPACES.sub(" ", str(e)).strip() or type(e).__name__
    return text[:200]


def _metadata(reader: PdfReader, data: bytes) -> dict:
    info = None
    try:
        info = reader.metadata
    except Exception:  # a broken /Info dictionary should not cost us the text
        pass

    def text(attr: str) -> str | None:
        try:
            value = getattr(info, attr) if info is not None else None
        except Exception:
            return None
        value = str(value).strip() if value is not None else ""
        return value or None

    def date(attr: str) -> str | None:
        try:
            value = getattr(info, attr) if info is not None else None
        except Exception:  # pypdf raises on malformed date strings
            return None
        return value.isoformat() if value is not None else None

    header = re.match(rb"%PDF-(\d\.\d)", data[data.find(b"%PDF-") :])
    return {
        "title": text("title"),
        "author": text("author"),
        "subject": text("subject"),
        "creator": text("creator"),
        "producer": text("producer"),
        "creation_date": date("creation_date"),
        "mod_date": date("modification_date"),
        "pdf_version": header.group(1).decode() if header else None,
    }


# --- one page ------------------------------------------------------------------------------


@dataclass
class _Chunk:
    """One piece of text as pypdf emitted it, with where it starts on the page."""

    text: str
    start: int  # offset in the page's extracted text
    x: float
    y: float
    size: float  # font size in page units
    font: Any
    upright: bool  # horizontal, left to right: the only text that takes part in column layout


@dataclass
class _Line:
    text: str
    chunks: list[_Chunk] = field(default_factory=list)
    role: str = "body"

    @property
    def positioned(self) -> list[_Chunk]:
        return [c for c in self.chunks if c.text.strip()]

    @property
    def x0(self) -> float | None:
        pc = self.positioned
        return pc[0].x if pc else None

    @property
    def y(self) -> float | None:
        pc = self.positioned
        return pc[0].y if pc else None


@dataclass
class _Page:
    lines: list[_Line]
    width: float
    left: float
    two_column: bool = False
    table: bool = False  # lines rebuilt from positions (`_rebuild_table_page`)
    cuts: int = 0  # lines cut or joined where pypdf's line breaks miss the printed lines


def _mult(m: tuple | list, n: tuple | list) -> tuple:
    return (
        m[0] * n[0] + m[1] * n[2],
        m[0] * n[1] + m[1] * n[3],
        m[2] * n[0] + m[3] * n[2],
        m[2] * n[1] + m[3] * n[3],
        m[4] * n[0] + m[5] * n[2] + n[4],
        m[4] * n[1] + m[5] * n[3] + n[5],
    )


class _Collector:
    """Visitors for `extract_text` that record each emitted piece of text and its position.

    pypdf reports text inside a form XObject in the form's own coordinates, so we keep the
    page transformation in force at each `Do`. A frame becomes active only when the form's
    first operator runs: pypdf flushes pending page text between our `Do` callback and then.
    """

    def __init__(self) -> None:
        self.chunks: list[_Chunk] = []
        self.length = 0
        self._frames: list[list] = []  # [matrix, active]

    def _base(self) -> tuple:
        for matrix, active in reversed(self._frames):
            if active:
                return matrix
        return _IDENTITY

    def before(self, op: bytes, args: Any, cm: list, tm: list) -> None:
        if self._frames and not self._frames[-1][1]:
            self._frames[-1][1] = True
        if op == b"Do":
            self._frames.append([_mult(cm, self._base()), False])

    def after(self, op: bytes, args: Any, cm: list, tm: list) -> None:
        if op == b"Do" and self._frames:
            self._frames.pop()

    def text(self, text: str, cm: list, tm: list, font: Any, size: float) -> None:
        if not text:
            return
        m = _mult(_mult(tm, cm), self._base())
        scale = math.hypot(m[2], m[3]) or 1.0
        upright = m[0] > 0 and abs(m[1]) <= 0.01 * m[0]
        self.chunks.append(_Chunk(text, self.length, m[4], m[5], (size or 0.0) * scale, font, upright))
        self.length += len(text)


@dataclass
class _Read:
    """One page as pypdf's `extract_text` reads it, with the position of each piece."""

    text: str
    chunks: list[_Chunk]  # empty when the pieces do not add up to the text
    left: float
    width: float
    rotated: bool
    joined: int = 0  # line breaks pypdf read inside a printed line, taken out (`_respace`)


def _read_page(page: Any) -> _Read:
    collector = _Collector()
    text = page.extract_text(
        visitor_text=collector.text,
        visitor_operand_before=collector.before,
        visitor_operand_after=collector.after,
    )
    try:
        box = page.cropbox
        left, width = float(box.left), float(box.width)
    except Exception:
        left, width = 0.0, 612.0
    positions_ok = "".join(c.text for c in collector.chunks) == text
    return _Read(text, collector.chunks if positions_ok else [], left, abs(width) or 612.0,
                 bool(page.get("/Rotate")))


def _lay_out(read: _Read, widths: _Widths) -> _Page:
    lines, cuts = _split_lines(read.text, read.chunks, widths)
    result = _Page(lines=lines, width=read.width, left=read.left, cuts=cuts + read.joined)
    if read.chunks and not read.rotated:
        # A statement's labels at the left and its figures at the right look like two
        # columns to `_order_columns`; a page that is mostly table rows is a table.
        _rebuild_table_page(result, read.chunks, widths)
        if not result.table:
            _order_columns(result, widths)
    return result


def _split_lines(text: str, chunks: list[_Chunk], widths: _Widths) -> tuple[list[_Line], int]:
    """The line rule, with each line's chunks attached when positions are known; and how
    many lines were cut or joined where pypdf's breaks miss the printed lines."""
    lines: list[_Line] = []
    cuts = 0
    pos = 0
    ci = 0
    for raw in text.splitlines(keepends=True):
        start, pos = pos, pos + len(raw)
        content = raw.rstrip()
        if not content:
            continue
        mine = []
        while ci < len(chunks) and chunks[ci].start + len(chunks[ci].text) <= start:
            ci += 1
        j = ci
        while j < len(chunks) and chunks[j].start < start + len(content):
            mine.append(chunks[j])
            j += 1
        pieces = _cut_at_new_lines(_Line(content, mine), start, widths)
        cuts += len(pieces) - 1
        if lines and _same_printed_line(lines[-1], pieces[0], widths):
            # pypdf broke a printed line where nothing moved ("ITEM 8. FINANC" / "IAL
            # STATEMENTS"): one line again, joined as the glyphs are spaced.
            a, b = lines[-1], pieces.pop(0)
            gap = b.positioned[0].x - widths.line_end(a)
            sep = " " if b.text[:1].isspace() or gap > _GAP_TOUCH * max(b.positioned[0].size, 1.0) else ""
            lines[-1] = _Line(a.text + sep + b.text.lstrip(), a.chunks + b.chunks)
            cuts += 1
        lines.extend(pieces)
    return lines, cuts


def _same_printed_line(a: _Line, b: _Line, widths: _Widths) -> bool:
    """Whether `b` goes on where `a` stops: on its baseline, right of it, less than an em
    past its end."""
    pa, pb = a.positioned, b.positioned
    if not (pa and pb and pa[-1].upright and pb[0].upright):
        return False
    last, first = pa[-1], pb[0]
    if first is last:  # one drawn string: its own line feed says nothing of positions
        return False
    size = max(last.size, first.size, 1.0)
    if abs(last.y - first.y) > 0.2 * size or first.x < last.x:
        return False
    return first.x - widths.end(last) <= size


def _cut_at_new_lines(line: _Line, start: int, widths: _Widths) -> list[_Line]:
    """A line that pypdf ran on into the next printed line, cut where that line begins: a
    piece drawn at least a line lower and starting left of where the piece before it ended
    ("...and Results" / "of Operations..." came out as "...and Resultsof"). Superscripts
    and subscripts shift less than a line; a table cell's wrapped second line is a printed
    line of its own, as it is on the page."""
    out: list[_Line] = []
    cut_from, first = 0, 0
    pcs = [c for c in line.chunks if c.text.strip() and c.upright]
    for prev, cur in zip(pcs, pcs[1:]):
        size = max(prev.size, cur.size, 1.0)
        if prev.y - cur.y > 0.8 * size and cur.x < widths.end(prev) - size:
            k = cur.start - start
            left, right = line.text[cut_from:k].rstrip(), line.text[k:].lstrip()
            if 0 < k < len(line.text) and left.strip() and right:
                i = line.chunks.index(cur)
                out.append(_Line(left, line.chunks[first:i]))
                cut_from, first = k + (len(line.text[k:]) - len(right)), i
    if not out:
        return [line]
    out.append(_Line(line.text[cut_from:], line.chunks[first:]))
    return out


# --- columns -------------------------------------------------------------------------------


class _Widths:
    """Where a chunk's text ends, from its font's /Widths; metrics cached per font object."""

    def __init__(self) -> None:
        self._fonts: dict[int, tuple[Any, dict[str, str], dict[str, float], float]] = {}

    def end(self, chunk: _Chunk) -> float:
        fd = chunk.font
        metrics = self._fonts.get(id(fd))
        if metrics is None or metrics[0] is not fd:
            metrics = self._fonts[id(fd)] = _font_metrics(fd)
        _, reverse, widths, default = metrics
        text = chunk.text.split("\n", 1)[0].rstrip()
        units = sum(widths.get(reverse.get(ch, ch), default) for ch in text)
        return chunk.x + units / 1000.0 * chunk.size

    def line_end(self, line: _Line) -> float:
        return self.end(line.positioned[-1])


def _font_metrics(fd: Any) -> tuple[Any, dict[str, str], dict[str, float], float]:
    # Widths are keyed by character code and the text we hold is Unicode: hence the reverse map.
    try:
        font = Font.from_font_resource(fd)
        widths = {k: float(v) for k, v in font.character_widths.items() if k != "default"}
        default = float(font.character_widths.get("default", 500)) or 500.0
        reverse = {v: k for k, v in font.character_map.items() if isinstance(v, str)}
        if isinstance(font.encoding, dict):
            for code, ch in font.encoding.items():
                reverse.setdefault(ch, chr(code))
    except Exception:  # no usable metrics: half an em per character is a fair guess
        widths, default, reverse = {}, 500.0, {}
    return fd, reverse, widths, default


def _cut_at_gutter(line: _Line, gutter: float, min_gap: float, widths: _Widths) -> list[_Line]:
    """Split a line that pypdf glued together from both columns (same baseline, drawn in a row)."""
    pcs = line.positioned
    for k in range(1, len(pcs)):
        prev, cur = pcs[k - 1], pcs[k]
        if prev.x < gutter <= cur.x and cur.upright and widths.end(prev) <= cur.x - min_gap:
            cut = max(0, min(len(line.text), cur.start - line.chunks[0].start))
            left, right = line.text[:cut].rstrip(), line.text[cut:].strip()
            # Only where pypdf itself saw a word gap, so no word is ever cut in two.
            if left and right and line.text[cut - 1 : cut + 1].strip() != line.text[cut - 1 : cut + 1]:
                i = line.chunks.index(cur)
                rest = _Line(right, line.chunks[i:])
                return [_Line(left, line.chunks[:i]), *_cut_at_gutter(rest, gutter, min_gap, widths)]
    return [line]


def _running(line: _Line, widths: _Widths) -> bool:
    """Whether a line reads as running text: long enough, words rather than figures, and no
    gap wider than an em and a half between its pieces. A 10-K's statement rows ("1,408
    1,532 662"), its two-column lists ("Note 2    Loans and Card Member Receivables",
    "United States    Delaware") and its signature blocks ("/s/ JEFFREY C. CAMPBELL") sit
    right of the page's middle as a column would, but are none of these."""
    text = line.text.strip()
    if len(text) < 20 or len(re.findall(r"[A-Za-z]{2,}", text)) < 3:
        return False
    pcs = line.positioned
    for a, b in zip(pcs, pcs[1:]):
        if a.upright and b.upright and abs(a.y - b.y) <= 2 and b.x - widths.end(a) > 1.5 * (b.size or 8.0):
            return False
    return True


def _order_columns(page: _Page, widths: _Widths) -> None:
    """Detect a two-column page and put each band's left column before its right column."""
    mid = page.left + page.width / 2
    tol = 0.02 * page.width
    if sum(1 for ln in page.lines if ln.positioned) < 6:
        return
    pieces: list[_Line] = []
    for ln in page.lines:
        pieces.extend(_cut_at_gutter(ln, mid - tol, tol, widths) if ln.positioned else [ln])
    placed = [p for p in pieces if p.positioned and p.positioned[0].upright]
    if len(placed) < 12:
        return
    # Only running text counts, so table rows, lists and signature blocks do not.
    right = [p for p in placed if p.x0 >= mid - tol and _running(p, widths)]
    left = [p for p in placed if p.x0 < mid - tol and _running(p, widths)]
    if len(right) < 6 or len(left) < 6:
        return
    right_start = min(p.x0 for p in right)
    # A page's second column starts just past its middle; running text that starts further
    # right is a table's text cell (a service schedule's "Term" and "Fee" columns beside its
    # descriptions), not a column to be read after the left one.
    if right_start > mid + 0.1 * page.width:
        return
    # ... and is set flush left: most of its lines start at one x. Pieces of a sentence that
    # a generated filing draws figure by figure start anywhere.
    xs = [p.x0 for p in right]
    if max(sum(1 for y in xs if abs(y - x) <= 2.0) for x in xs) < 0.5 * len(right):
        return
    # A left column's running text stops short of the right column...
    short = [p for p in left if widths.line_end(p) <= right_start + tol]
    if len(short) < 0.5 * len(left):
        return
    # ... and fills its column: most of its lines end near where the longest one ends (a
    # column's edge), where the entries of a list or a table (a 10-K's subsidiaries beside
    # their jurisdictions) end anywhere.
    edge = max(widths.line_end(p) for p in short)
    near = edge - 0.25 * (edge - min(p.x0 for p in short))
    if sum(1 for p in short if widths.line_end(p) >= near) < 0.5 * len(short):
        return
    top, bottom = max(p.y for p in right), min(p.y for p in right)
    if sum(1 for p in left if bottom - 5 <= p.y <= top + 5) < 6:
        return

    def kind(ln: _Line) -> str:
        if not ln.positioned or not ln.positioned[0].upright:
            return "?"  # rotated margin notes and the like stay after what preceded them
        if ln.x0 >= mid - tol:
            return "R"
        return "S" if widths.line_end(ln) > right_start + tol else "L"

    kinds = [kind(ln) for ln in pieces]
    # Full-width lines cut the page into bands read top to bottom.
    spans = sorted({round(p.y, 1) for p, k in zip(pieces, kinds) if k == "S"}, reverse=True)

    def band(ln: _Line) -> int:
        return sum(1 for s in spans if s >= ln.y - 0.5)

    keys: list[tuple[int, int, int]] = []
    last = (0, 0)
    for i, (ln, k) in enumerate(zip(pieces, kinds)):
        if k != "?":
            b = band(ln)
            last = (b, {"S": 0, "L": 1, "R": 2}[k])
        keys.append((*last, i))
    keys.sort()
    page.lines = [pieces[i] for *_, i in keys]
    page.two_column = True


# --- tables --------------------------------------------------------------------------------

# A value cell: an amount, a percentage, a parenthesised negative, or a dash for nil.
_NUMBER = re.compile(r"^[$€£]?\s*\(?[$€£]?\s*[-+]?\d[\d,]*(?:\.\d+)?\s*%?\)?\s*%?$")
_NIL = re.compile(r"^(?:[-–—]+|#|\*|n\/?m|n\/?a)$", re.IGNORECASE)  # nil, or "not meaningful"
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
_CURRENCY = {"$", "€", "£"}
_MIN_TABLE_ROWS = 3  # rows with two or more values before a page counts as holding a table
_TABLE_SHARE = 0.25  # ... and at least this share of its rows


@dataclass
class _Cell:
    text: str
    x0: float
    x1: float

    @property
    def numeric(self) -> bool:
        t = self.text.replace(" ", "")
        return bool(_NUMBER.match(t) or _NIL.match(t)) and not (_YEAR.fullmatch(t) and "," not in t)

    @property
    def center(self) -> float:
        return (self.x0 + self.x1) / 2


@dataclass
class _Row:
    y: float
    size: float
    chunks: list[_Chunk]
    cells: list[_Cell] = field(default_factory=list)


def _rows(chunks: list[_Chunk]) -> list[_Row] | None:
    """Chunks grouped by baseline, top to bottom, each row's in left-to-right order; None
    when a chunk's position is not known for all of its text (a line break inside it)."""
    placed = []
    for c in chunks:
        body = c.text.rstrip("\n")
        if not body.strip():
            continue
        if "\n" in body or not c.upright:
            return None
        placed.append(c)
    placed.sort(key=lambda c: -c.y)
    rows: list[_Row] = []
    for c in placed:
        tol = max(2.0, 0.35 * (c.size or 8.0))
        if rows and abs(rows[-1].y - c.y) <= tol:
            rows[-1].chunks.append(c)
        else:
            rows.append(_Row(c.y, c.size or 8.0, [c]))
    for row in rows:
        row.chunks.sort(key=lambda c: c.x)
    return rows


def _cut_cells(row: _Row, widths: _Widths) -> None:
    """A row's chunks cut into cells where the gap between them exceeds about an em;
    inside a cell, a space only where the glyphs leave one."""
    cells: list[_Cell] = []
    for c in row.chunks:
        text = c.text.rstrip("\n")
        end = widths.end(c)
        gap = c.x - cells[-1].x1 if cells else 0.0
        # Two figures side by side are two columns even when set close together
        # ("$ 86,392 $ 79,474"); text runs join up to about an em apart.
        figures = _NUMBER.match(cells[-1].text.strip()) if cells else None
        figures = figures and (_NUMBER.match(text.strip()) or text.strip() in _CURRENCY)
        if cells and gap <= 0.9 * row.size and not (figures and gap > 0.25 * row.size):
            sep = "" if gap <= 0.15 * row.size or cells[-1].text[-1:].isspace() or text[:1].isspace() else " "
            cells[-1].text += sep + text
            cells[-1].x1 = max(cells[-1].x1, end)
        else:
            cells.append(_Cell(text, c.x, end))
    for cell in cells:
        cell.text = _SPACES.sub(" ", cell.text.replace("\xa0", " ")).strip()
    row.cells = _merge_currency([cell for cell in cells if cell.text])


def _merge_currency(cells: list[_Cell]) -> list[_Cell]:
    """A lone "$" drawn well left of its amount belongs to it, a lone "%" to the figure
    before it."""
    out: list[_Cell] = []
    for cell in cells:
        if out and out[-1].text in _CURRENCY and cell.numeric:
            out[-1] = _Cell(cell.text, out[-1].x0, cell.x1)
        elif out and cell.text == "%" and out[-1].numeric:
            out[-1] = _Cell(out[-1].text + " %", out[-1].x0, cell.x1)
        else:
            out.append(cell)
    return out


def _values(row: _Row) -> list[_Cell]:
    """The row's value cells: the numeric cells after its label (the first text cell)."""
    cells = row.cells
    i = 0
    while i < len(cells) and not cells[i].numeric:
        i += 1
    rest = cells[i:]
    return rest if rest and all(c.numeric or c.text in _CURRENCY for c in rest) else []


def _is_header(row: _Row) -> bool:
    """A row naming columns by year: "2022 2021 2020", "January 28, 2023 January 29, 2022"."""
    return sum(1 for c in row.cells if _YEAR.search(c.text)) >= 2 and not _values(row)


def _header_for(cell: _Cell, headers: list[_Row]) -> str | None:
    """The nearest header above whose cell spans the value's column (by horizontal overlap,
    else the closest centre within a column's width)."""
    for row in headers:
        best, dist = None, None
        for h in row.cells:
            overlap = min(h.x1, cell.x1) - max(h.x0, cell.x0)
            d = 0.0 if overlap > 0 else abs(h.center - cell.center)
            if dist is None or d < dist:
                best, dist = h, d
        if best is not None and dist <= max(30.0, 1.5 * (cell.x1 - cell.x0)):
            return best.text
    return None


def _rebuild_table_page(page: _Page, chunks: list[_Chunk], widths: _Widths) -> None:
    """On a page with a table, rebuild every line from positions (see the module docstring);
    other pages keep pypdf's lines."""
    rows = _rows(chunks)
    if not rows:
        return
    # Cheap test first (most pages hold no table): rows with two or more numeric pieces.
    rough = sum(1 for r in rows if sum(1 for c in r.chunks if _NUMBER.match(c.text.strip())) >= 2)
    if rough < _MIN_TABLE_ROWS:
        return
    for row in rows:
        _cut_cells(row, widths)
    n_values = sum(1 for r in rows if len(_values(r)) >= 2)
    # Mostly table rows: a two-column paper's small results table leaves its page to
    # `_order_columns`.
    if n_values < _MIN_TABLE_ROWS or n_values < _TABLE_SHARE * len(rows):
        return
    lines: list[_Line] = []
    headers: list[_Row] = []  # year rows seen so far, nearest first
    for row in rows:
        values = _values(row)
        if _is_header(row):
            headers.insert(0, row)
        if values:
            label = " ".join(c.text for c in row.cells[: len(row.cells) - len(values)])
            parts = [label] if label else []
            for v in values:
                h = _header_for(v, headers)
                parts.append(f"{h}: {v.text}" if h and h != v.text else v.text)
            text = " | ".join(parts)
        else:
            text = " ".join(c.text for c in row.cells)
        lines.append(_Line(text, list(row.chunks)))
    page.lines = lines
    page.table = True


# --- words as printed ----------------------------------------------------------------------

# pypdf decides where a space goes from its own estimate of where each piece of text ends,
# and some PDFs defeat it: American Water Works' 10-K draws justified lines as runs cut
# anywhere ("obta" "in permits"), Block's draws words in several runs, and in others a word
# gap is a move the estimate misses ("millionpeople"). Where a space belongs is decided here
# from the glyph positions pypdf's layout mode computes (every string a text operator draws,
# with its start and end after Tc, Tw, Tz and TJ offsets): a space where the glyphs leave a
# gap or draw one, none where they touch, and a line feed drawn inside a string (MGM's 10-K
# draws "PART\nI") is no line break. That pass costs as much as reading the page again, so it
# runs only on pages whose words look wrong (`_suspect_pages`).
_TOKEN = re.compile(r"[A-Za-z]+")
_PAIR = re.compile(r"(?<![A-Za-z'’\-])([A-Za-z]{1,20}) +([A-Za-z]{1,20})(?![A-Za-z'’])")
_GAP_SPACE = 0.15  # a gap of this many ems or more between two runs is a word space
_GAP_TOUCH = 0.05  # ... of this many or fewer (down to a small overlap), none


@dataclass
class _Run:
    """One string drawn by a text operator: its text, where it starts and ends on its
    baseline, and its em (the font's height on the page)."""

    text: str
    x0: float
    x1: float
    y: float
    em: float
    measured: bool  # upright, in a font whose widths pypdf knows: its ends can be trusted


def _suspect_pages(reads: list[_Read]) -> list[int]:
    """Pages whose words look joined or split, judged by the words of the whole document:
    a joined word is found at most twice and is two words that the document also writes
    apart, twice or more ("Resultsof", "Results of"; not "throughout"); a split word is two
    pieces that are no words of the document but make one together ("obta in"); and a page
    of one-word lines is one whose line breaks pypdf took from the words."""
    counts: Counter = Counter()
    pairs: Counter = Counter()
    for r in reads:
        words = [w.lower() for w in _TOKEN.findall(r.text)]
        counts.update(words)
        pairs.update(zip(words, words[1:]))

    def joined(word: str) -> bool:
        w = word.lower()
        if len(w) < 5 or counts[w] > 2:
            return False
        return any(pairs[(w[:k], w[k:])] >= 2 and counts[w[:k]] >= 3 and counts[w[k:]] >= 3
                   for k in range(2, len(w) - 1))

    def split(a: str, b: str) -> bool:
        # a lone capital is an initial ("Mark S."), not a piece of a word
        fragment = lambda w: counts[w.lower()] <= 2 or (len(w) == 1 and w in "bcdefghjklmnopqrstuvwxyz")  # noqa: E731
        return counts[(a + b).lower()] > 0 and (fragment(a) or fragment(b))

    def word_per_line(text: str) -> bool:  # pypdf broke the lines after every word
        lines = [ln for ln in text.splitlines() if ln.strip()]
        words = sum(1 for ln in lines if len(ln.split()) == 1 and re.search(r"[A-Za-z]{2}", ln))
        return len(lines) >= 10 and words >= 0.5 * len(lines)

    return [i for i, r in enumerate(reads)
            if any(joined(w) for w in _TOKEN.findall(r.text))
            or any(split(a, b) for a, b in _PAIR.findall(r.text)) or word_per_line(r.text)]


def _runs(page: Any) -> list[_Run]:
    """Every string the page's text operators draw, in content-stream order (the order
    `extract_text` reads them in). Uses pypdf's layout-mode text state (pinned pypdf)."""
    from pypdf._text_extraction._layout_mode._fixed_width_page import recurse_to_target_op, set_font_operation
    from pypdf._text_extraction._layout_mode._text_state_manager import TextStateManager
    from pypdf.generic import ContentStream

    contents = page.get_contents()
    if contents is None:
        return []
    fonts = page._layout_mode_fonts()
    ops = iter(ContentStream(contents, page.pdf, "bytes").operations)
    state = TextStateManager()
    drawn = []
    for operands, op in ops:
        if op in (b"BT", b"q"):
            _, tjs = recurse_to_target_op(ops, state, b"ET" if op == b"BT" else b"Q", fonts, False)
            drawn.extend(tjs)
        elif op == b"Tf":
            set_font_operation(state, fonts, operands)
        else:
            state.set_state_param(op, operands)
    return [_Run(tj.text, tj.tx, tj.displaced_tx, tj.ty, tj.font_height,
                 not tj.rotated and tj.transform[0] > 0 and tj.font.interpretable) for tj in drawn if tj.text]


def _gaps(runs: list[_Run]) -> tuple[str, list[bool | None], list[bool]]:
    """The drawn characters without whitespace; before each one whether a word space
    precedes it (None: the positions do not tell); and whether it is drawn on the same
    printed line as the one before (a line feed inside a drawn string moves nothing)."""
    chars: list[str] = []
    space: list[bool | None] = []
    same: list[bool] = []
    prev: _Run | None = None
    pending: bool | None = None  # True once whitespace was drawn since the last character
    for run in runs:
        on_line = False
        if prev is not None:
            if pending is not True:
                pending = _gap(prev, run, chars[-1] if chars else "")
            on_line = prev.measured and run.measured and abs(run.y - prev.y) <= 0.5 * max(run.em, prev.em, 1e-6)
        for ch in run.text:
            if ch.isspace():
                pending = True
                continue
            chars.append(ch)
            space.append(pending)
            same.append(on_line)
            pending, on_line = False, True
        if run.text.strip():
            prev = run
    return "".join(chars), space, same


def _gap(prev: _Run, run: _Run, last: str) -> bool | None:
    if not (prev.measured and run.measured):
        return None
    em = max(run.em, prev.em, 1e-6)
    if abs(run.y - prev.y) > 0.5 * em:
        # A new printed line: a word ends there, unless the line ended with a hyphen.
        return None if last in "-‐\xad" else True
    gap = (run.x0 - prev.x1) / em
    return True if gap >= _GAP_SPACE else False if -0.2 <= gap <= _GAP_TOUCH else None


def _respace(text: str, runs: list[_Run]) -> tuple[str, list[int], int, int]:
    """The page text with each word space where the glyphs put it; the new offset of every
    old one (and of the end); how many spaces were added or removed; and how many line
    breaks were between two characters of one printed line (a word space or nothing
    now). Only whitespace changes: every other character stays, in its order."""
    drawn, space, same = _gaps(runs)
    solid = [i for i, ch in enumerate(text) if not ch.isspace()]
    ours = "".join(text[i] for i in solid)
    # Both passes read the content stream in one order, so the characters mostly agree;
    # where they do not (text in form XObjects, which layout mode skips), pypdf's stay.
    if ours == drawn:
        known = {k: (space[k], same[k]) for k in range(len(space))}
    else:
        from difflib import SequenceMatcher

        known = {}
        for a, b, n in SequenceMatcher(None, ours, drawn, autojunk=False).get_matching_blocks():
            known.update((a + k, (space[b + k], same[b + k])) for k in range(1, n))
    out: list[str] = []
    where = [0] * (len(text) + 1)
    size = changed = joined = 0
    after = 0  # just past the previous non-space character
    for k, i in enumerate(solid):
        gap = new = text[after:i]
        want, on_line = known.get(k, (None, False)) if k else (None, False)
        if "\n" in gap:
            if on_line and want is not None and not gap.strip():
                new = " " if want else ""
                joined += 1
        elif want is True and not gap:
            new = " "
        elif want is False and gap and not gap.strip(" "):
            new = ""
        changed += new != gap and "\n" not in gap
        for j in range(after, i):
            where[j] = size + (j - after if new == gap else len(new))
        out.append(new)
        size += len(new)
        where[i] = size
        out.append(text[i])
        size += 1
        after = i + 1
    for j in range(after, len(text) + 1):
        where[j] = size + j - after
    out.append(text[after:])
    return "".join(out), where, changed, joined


def _respace_words(reader: Any, reads: list[_Read]) -> dict[int, int]:
    """Word spaces put where the glyphs show them on the pages that need it (see above);
    the number of spaces added or removed on each page changed."""
    changed = {}
    for i in _suspect_pages(reads):
        read = reads[i]
        try:
            runs = _runs(reader.pages[i])
        except Exception:  # layout mode fails on some pages; their text stays as pypdf reads it
            continue
        text, where, n, joined = _respace(read.text, runs)
        if not n and not joined:
            continue
        for c in read.chunks:
            start, end = where[c.start], where[c.start + len(c.text)]
            c.start, c.text = start, text[start:end]
        read.text = text
        read.joined = joined
        if n:
            changed[i] = n
    return changed


# --- headers and footers -------------------------------------------------------------------


def _edge_key(text: str) -> str:
    key = _SPACES.sub(" ", text).strip().casefold()
    key = _ROMAN.sub("#", _DIGITS.sub("#", key))
    return key


def _edges(lines: list[_Line]) -> tuple[list[_Line], list[_Line]]:
    """The candidate header lines (top of the page) and footer lines (bottom)."""
    if all(ln.y is not None for ln in lines):
        by_y = sorted(lines, key=lambda ln: -ln.y)
        return by_y[:_EDGE_LINES], by_y[::-1][:_EDGE_LINES]
    return lines[:_EDGE_LINES], lines[::-1][:_EDGE_LINES]


def _mark_headers_footers(pages: list[_Page]) -> tuple[int, int]:
    text_pages = [p for p in pages if p.lines]
    need = max(_MIN_REPEAT_PAGES, math.ceil(_MIN_REPEAT_SHARE * len(text_pages)))
    tops, bottoms = Counter(), Counter()
    for p in text_pages:
        head, foot = _edges(p.lines)
        tops.update({_edge_key(ln.text) for ln in head})
        bottoms.update({_edge_key(ln.text) for ln in foot})
    counts = {"header": 0, "footer": 0}
    for p in text_pages:
        head, foot = _edges(p.lines)
        for role, cands, seen in (("header", head, tops), ("footer", foot, bottoms)):
            for ln in cands:
                if ln.role == "body" and seen[_edge_key(ln.text)] >= need:
                    ln.role = role
                    counts[role] += 1
    return counts["header"], counts["footer"]
