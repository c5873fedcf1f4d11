"""One loaded file (`source.load`) in, one finished `Document` out: parsing, structure,
anchors, chunks. Pure: it reads the file once and touches no database."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable

from ..document import Document, DocType, assemble
from .chunks import SEGMENT_TOKENS
from .source import DEFAULT_MAX_BYTES, Source, load

# on_page(step, done, total) while a PDF's pages are read (`pdf.PageProgress`; not imported
# from there, so that loading this module does not load pypdf).
PageProgress = Callable[[str, int, int], None]


def _parse(kind: DocType, path: Path, data: bytes, on_page: PageProgress | None = None):
    """(raw_pages, raw_sections | None, metadata). Parsers are imported on first use so that
    `docqa --help` and the store do not pay for pypdf/lxml. Only the PDF parser reports its
    pages (`on_page`, see `pdf.parse_pdf`): the others take well under a second a file."""
    if kind == "pdf":
        from .pdf import parse_pdf

        raw_pages, metadata = parse_pdf(path, data=data, on_page=on_page)
        return raw_pages, None, metadata
    if kind == "html":
        from .html import parse_html

        return parse_html(path, data=data)
    from .text import parse_text

    return parse_text(path, data=data, markdown=kind == "markdown")


def build(
    source: Source,
    *,
    segment_tokens: int = SEGMENT_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
    on_page: PageProgress | None = None,
) -> Document:
    """Parse a loaded file into a complete `Document` (pages, sections, anchors, segments)."""
    raw_pages, raw_sections, metadata = parse(source, on_page=on_page)
    return finish(source, raw_pages, raw_sections, metadata, segment_tokens=segment_tokens,
                  count_tokens=count_tokens)


def parse(source: Source, *, on_page: PageProgress | None = None):
    """The parser's output for a loaded file: (raw_pages, raw_sections | None, metadata)."""
    return _parse(source.type, source.path, source.data, on_page)


def finish(
    source: Source,
    raw_pages,
    raw_sections,
    metadata: dict | None,
    *,
    segment_tokens: int = SEGMENT_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
) -> Document:
    """Structure, anchors and segments on top of a parser's output (`parse`)."""
    from .anchors import tag_anchors
    from .sections import detect_sections
    from .chunks import make_segments

    metadata = dict(metadata or {})
    doc = assemble(
        raw_pages,
        doc_id=source.doc_id,
        content_sha256=source.sha256,
        path=str(source.path),
        type=source.type,
        title=usable_title(metadata.get("title")),
        metadata=metadata,
    )
    # A filing's PDF title is often its SEC accession number; its cover page says what it is.
    doc.title = cover_title(doc) or doc.title
    doc.sections = detect_sections(doc, raw_sections)
    doc.anchors = tag_anchors(doc)
    doc.segments = make_segments(doc, target_tokens=segment_tokens, count_tokens=count_tokens)
    return doc


_FORM = re.compile(r"^\s*FORM\s+(10-K|10-Q|20-F|40-F|8-K|S-1|10-KT)\b", re.IGNORECASE)
_MONTHS = ("january february march april may june july august september october november december").split()
_PERIOD = re.compile(r"for\s+the\s+(fiscal\s+year|quarterly\s+period|fiscal\s+quarter)\s+ended:?\s*"
                     r"([A-Z][a-z]+)\.?\s+(\d{1,2}),?\s+((?:19|20)\d\d)", re.IGNORECASE)
_REGISTRANT = re.compile(r"\(?\s*exact\s+name\s+of\s+(?:the\s+)?registrant", re.IGNORECASE)
_SIGNED = re.compile(r"^(.{3,80}?)\s*\(\s*registrant\s*\)$", re.IGNORECASE)
_ACCESSION = re.compile(r"^\d{10}-\d{2}-\d{6}$")
_COVER_LINES = 60  # the cover's facts sit on its first page, in its first lines


def cover_title(doc: Document) -> str | None:
    """"Company — Form 10-K, fiscal year 2022" from an SEC filing's cover page; None for
    anything else.

    The registrant is the line above "(Exact name of registrant as specified in its
    charter)" (without that caption, the line after "Commission File Number"), or where the
    cover prints its name as a picture, the name signed above "(Registrant)"; a name in capitals is written as the filing's own text writes it when it
    does ("CVS HEALTH CORPORATION" is "CVS Health Corporation" there), never re-cased by
    rule. The fiscal year is the one the report covers, from "For the fiscal year ended …":
    a year that ends in the first days of January (a 52/53-week year closed on the Sunday
    nearest 31 December) is named for the year before."""
    if doc.type != "pdf":
        return None
    lines = [ln.text.strip() for p in doc.pages[:2] for ln in p.lines][:_COVER_LINES]
    form = next((m.group(1).upper() for t in lines if (m := _FORM.match(t))), None)
    if not form:
        return None
    company = _registrant(lines) or _after_file_number(lines) or _signed_name(doc)
    if not company:
        return None
    # "NIKE, Inc ." : a space drawn before a stop or a comma is no part of a name
    company = _as_written(re.sub(r"\s+([.,])", r"\1", company), doc)
    period = _PERIOD.search(" ".join(lines))
    if period and period.group(2).lower() in _MONTHS:
        kind = " ".join(period.group(1).lower().split())
        month, day, year = _MONTHS.index(period.group(2).lower()) + 1, int(period.group(3)), int(period.group(4))
        if kind == "fiscal year":
            return f"{company} — Form {form}, fiscal year {year - 1 if (month, day) <= (1, 7) else year}"
        return f"{company} — Form {form}, quarter ended {period.group(2)} {day}, {year}"
    return f"{company} — Form {form}"


def _is_name(text: str) -> bool:
    """A company name: words, not a file number, a date or a form caption."""
    return (3 <= len(text) <= 80 and len(re.findall(r"[A-Za-z]", text)) >= 3
            and not re.search(r"commission|file\s+number|\d{3}-\d{5}|\(|for the|act of 1934", text, re.I))


def _registrant(lines: list[str]) -> str | None:
    for i, t in enumerate(lines):
        m = _REGISTRANT.search(t)
        if m:
            before = t[: m.start()].strip(" _")
            if not before and i:
                before = next((x.strip(" _") for x in reversed(lines[:i]) if x.strip(" _")), "")
            return before if _is_name(before) else None
    return None


def _after_file_number(lines: list[str]) -> str | None:
    """A cover without the caption: the name on the line after "Commission File Number"."""
    for t, nxt in zip(lines, lines[1:]):
        if re.search(r"commission\s+file\s+n(?:o\b|umber)", t, re.I):
            return nxt.strip(" _") if _is_name(nxt.strip(" _")) else None
    return None


def _signed_name(doc: Document) -> str | None:
    """The name on the signatures page: "THE COCA-COLA COMPANY" / "(Registrant)"."""
    prev = ""
    for p in doc.pages:
        for ln in p.lines:
            t = ln.text.strip()
            m = _SIGNED.match(t)
            if m and _is_name(m.group(1).strip(" _")):
                return m.group(1).strip(" _")
            if re.fullmatch(r"\(\s*registrant\s*\)", t, re.I) and _is_name(prev):
                return prev
            if t:
                prev = t.strip(" _")
    return None


def _as_written(name: str, doc: Document) -> str:
    """A name printed in capitals, as the filing's text writes it in mixed case (the most
    frequent spelling); otherwise as printed."""
    if name.upper() != name:
        return name
    # Spaces are not compared: a cover in small capitals reads "MGM R ESORTS I NTERNATIONAL".
    pattern = r"\s*".join(re.escape(ch) for ch in name if not ch.isspace())
    seen = Counter(" ".join(m.group(0).split()) for m in re.finditer(pattern, doc.text, re.IGNORECASE))
    mixed = [(n, s) for s, n in seen.items() if s.upper() != s]
    return max(mixed)[1] if mixed else name


def usable_title(title: str | None) -> str | None:
    """A PDF's own title, unless it is empty or an SEC accession number ("0000004962-23-000006")."""
    title = title.strip() if isinstance(title, str) else None
    return title if title and not _ACCESSION.match(title) else None


def ingest_file(
    path: str | Path,
    *,
    segment_tokens: int = SEGMENT_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Document:
    """Parse one file into a complete `Document`.

    Raises `IngestError` for anything wrong with the file: missing, unreadable, empty,
    larger than `max_bytes`, of an unsupported type, or rejected by its parser.
    """
    source = load(path, max_bytes=max_bytes)
    return build(source, segment_tokens=segment_tokens, count_tokens=count_tokens)
