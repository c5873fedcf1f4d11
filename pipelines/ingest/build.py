"""One loaded file (`source.load`) in, one finished `Document` out: parsing, structure,
anchors, chunks. Pure: it reads the file once and touches no database."""

from __future__ import annotations

import re
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
    title = metadata.get("title")
    doc = assemble(
        raw_pages,
        doc_id=source.doc_id,
        content_sha256=source.sha256,
        path=str(source.path),
        type=source.type,
        title=title.strip() if isinstance(title, str) and title.strip() else None,
        metadata=metadata,
    )
    # A filing's PDF title is often its SEC accession number; its cover page says what it is.
    doc.title = cover_title(doc) or doc.title
    doc.sections = detect_sections(doc, raw_sections)
    doc.anchors = tag_anchors(doc)
    doc.segments = make_segments(doc, target_tokens=segment_tokens, count_tokens=count_tokens)
    return doc


_FORM = re.compile(r"^\s*FORM\s+(10-K|10-Q|20-F|40-F|8-K|S-1|10-KT)\b", re.IGNORECASE)
_PERIOD = re.compile(r"for the (fiscal year|quarterly period|fiscal quarter) ended:?\s*"
                     r"([A-Z][a-z]+\.?\s+\d{1,2},?\s+((?:19|20)\d\d))", re.IGNORECASE)
_REGISTRANT = re.compile(r"\(?\s*exact name of (?:the )?registrant", re.IGNORECASE)
_COVER_LINES = 60  # the cover's facts sit on its first page, in its first lines


def cover_title(doc: Document) -> str | None:
    """"Company — Form 10-K, fiscal year 2022" from an SEC filing's cover page (the form
    line, "For the fiscal year ended …", and the line above "(Exact name of registrant as
    specified in its charter)"); None for anything else."""
    if doc.type != "pdf":
        return None
    lines = [ln.text.strip() for p in doc.pages[:2] for ln in p.lines][:_COVER_LINES]
    form = next((m.group(1).upper() for t in lines if (m := _FORM.match(t))), None)
    company = None
    for i, t in enumerate(lines):
        m = _REGISTRANT.search(t)
        if m:
            before = t[: m.start()].strip(" _")
            if not before and i:
                before = next((x.strip(" _") for x in reversed(lines[:i]) if x.strip(" _")), "")
            company = before or None
            break
    if not form or not company or len(company) > 80:
        return None
    if company.upper() == company:
        company = company.title().replace("'S", "'s").replace("’S", "’s")
    period = _PERIOD.search(" ".join(lines))
    if period and period.group(1).lower() == "fiscal year":
        return f"{company} — Form {form}, fiscal year {period.group(3)}"
    if period:
        return f"{company} — Form {form}, quarter ended {period.group(2)}"
    return f"{company} — Form {form}"


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
