"""Citations: parsing them out of model answers and verifying them against the source.

A citation names lines of a document — `[PAGE:12, LINE:30-34]` for PDFs and text,
`[SECTION:section-15.5.5, LINE:3-4]` for HTML, optionally prefixed with `DOC:<id>, ` when
an answer draws on several documents — and carries a *quote*: the words the answer claims
are written there. Verification is mechanical (SPEC §4): the quote, normalised by
`textnorm`, must occur inside the cited lines. A quote found elsewhere in the same document
is re-pointed at the lines where it really is and marked `relocated`; anything else stays
unverified and is never shown as verified.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from ..document import Document, Passage, Span, Spanned
from ..textnorm import normalize, normalize_loose

# Quotes shorter than this (after normalisation) prove nothing: "the", "30 days".
MIN_QUOTE_CHARS = 12


class Citation(Spanned):
    """A cited span of a document with its quote and verdict. Read and written flat (the
    runs table's column and `--json`'s shape since the first release): the span's element
    id as "section_id" (also accepted as "element_id"); a citation lies on one page, so its
    span has no `page_end`. Once verified, the span's chars are where the quote lies."""

    doc_id: str
    quote: str
    segment_id: int | None = None
    verified: bool = False
    relocated: bool = False  # the quote was found, but not on the lines the model named
    note: str | None = None  # why a citation did not verify, or why it does not support the answer
    # Whether the quote answers the question (pipelines/answer/support.py): it names the subject and,
    # for a numeric question, holds a figure of the kind and year asked. None: not judged
    # (evidence passages, runs stored before the check existed).
    supports: bool | None = None
    # The model's log-odds that the quote answers the question, asked apart from the answer
    # (support.confirm_messages); None: not asked. Part of the answer's audit, not stored.
    confirm_logodds: float | None = None

    _FLAT = {"page": "page", "section_id": "element_id", "element_id": "element_id", "line_start": "line_start",
             "line_end": "line_end", "char_start": "char_start", "char_end": "char_end"}
    _ORDER = ("doc_id", "page", "section_id", "line_start", "line_end", "quote", "segment_id", "verified",
              "relocated", "char_start", "char_end", "note", "supports", "confirm_logodds")

    def label(self, *, with_doc: bool = False) -> str:
        """`[PAGE:p, LINE:a-b]` (or SECTION for HTML); `with_doc` names the document first,
        as answers over several documents must."""
        return self.span.label(self.doc_id if with_doc else None)


_CITE = re.compile(
    r"\[\s*(?:DOC\s*:\s*(?P<doc>[0-9a-fA-F]{4,64})\s*[,;]\s*)?"
    r"(?:PAGE\s*:\s*(?P<page>\d+)|SECTION\s*:\s*(?P<section>[^,\]\s]+))\s*[,;]\s*"
    r"LINES?\s*:\s*(?P<l1>\d+)(?:\s*[-\u2013\u2014]\s*(?P<l2>\d+))?\s*\]",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"[\"\u201c\u201e]([^\"\u201c\u201d\u201e]{3,}?)[\"\u201d]")
_MARKS = "\"\u201c\u201d\u201e"


class CitedSpan(BaseModel):
    """A citation as written in an answer: where it sits in the answer, and what it claims."""

    model_config = ConfigDict(extra="forbid")

    start: int  # char offsets of the marker in the answer
    end: int
    doc_id: str | None
    span: Span  # the page (or HTML element id) and lines it names
    quote: str
    # Longer readings of the quote, longest first, that take quotation marks inside it as part
    # of it (`"dated as of May 31, 2017 (the "Effective Date")"`): which marks pair up cannot be
    # told from the answer alone, so `verify` tries each against the source before `quote`.
    longer: list[str] = []
    quoted: bool = False  # the quote is in quotation marks: the model claims these exact words


def parse_citations(answer: str) -> list[CitedSpan]:
    """Find every citation marker in `answer` with the quote it backs.

    The quote is the last double-quoted phrase between the previous citation (or the start
    of the sentence) and the marker; failing that, the clause right before the marker.
    """
    spans: list[CitedSpan] = []
    prev_end = 0
    for m in _CITE.finditer(answer):
        before = answer[prev_end : m.start()]
        quoted = _QUOTED.findall(before)
        if quoted:
            quote = _trim(quoted[-1])
        else:
            # The clause before the marker, back to the last sentence boundary.
            clause = re.split(r"(?<=[.!?;:\n])\s+|\n", before.rstrip())
            quote = _trim(clause[-1] if clause else "")
        l1 = int(m["l1"])
        l2 = int(m["l2"]) if m["l2"] else l1
        spans.append(
            CitedSpan(
                start=m.start(),
                end=m.end(),
                doc_id=m["doc"].lower() if m["doc"] else None,
                span=Span(page=int(m["page"]) if m["page"] else None, element_id=m["section"],
                          line_start=min(l1, l2), line_end=max(l1, l2)),
                quote=quote,
                longer=[q for q in _readings(before) if len(q) > len(quote)] if quoted else [],
                quoted=bool(quoted),
            )
        )
        prev_end = m.end()
    return spans


def _trim(quote: str) -> str:
    return quote.strip().strip("-–—:,; ")


def _readings(before: str) -> list[str]:
    """Each reading of the last quoted phrase in `before` that pairs the marks inside it,
    longest first: the phrase ends at the last closing mark and opens at a mark with an even
    number of marks between them."""
    at = [i for i, c in enumerate(before) if c in _MARKS]
    ends = [k for k, i in enumerate(at) if before[i] in '"\u201d']
    if not ends:
        return []
    end = ends[-1]
    return [_trim(before[at[k] + 1 : at[end]]) for k in range(end % 2 ^ 1, end, 2)
            if before[at[k]] != "\u201d" and len(_trim(before[at[k] + 1 : at[end]])) >= 3]


def _page_for(doc: Document, span: Span) -> int | None:
    if span.element_id is not None:
        for p in doc.pages:
            if p.label == span.element_id:
                return p.n
        return None
    if span.page is not None and 1 <= span.page <= len(doc.pages):
        return span.page
    return None


def find_quote(doc: Document, quote: str, lo: int, hi: int) -> tuple[int, int] | None:
    """Char span of `quote` within doc.text[lo:hi], after normalisation; None if absent."""
    for f in (normalize, normalize_loose):
        target = f(quote)
        if len(target) >= MIN_QUOTE_CHARS and target in f(doc.text[lo:hi]):
            return _shrink(doc.text, target, lo, hi, f)
    return None


def find_in_document(doc: Document, quote: str) -> tuple[int, int] | None:
    """Where `quote` lies anywhere in the document: page by page, then across page breaks."""
    pages = doc.pages
    for p in pages:
        hit = find_quote(doc, quote, p.start, p.end)
        if hit:
            return hit
    for p, q in zip(pages, pages[1:]):
        hit = find_quote(doc, quote, p.start, q.end)
        if hit:
            return hit
    return None


def _shrink(text: str, target: str, lo: int, hi: int, f) -> tuple[int, int]:
    """Smallest raw span [a, b) within [lo, hi) whose normalisation contains `target`.

    Containment only drops as a bound moves inward, so each bound is a binary search."""
    a_lo, a_hi = lo, hi  # find the largest a with target in f(text[a:hi])
    while a_lo < a_hi:
        mid = (a_lo + a_hi + 1) // 2
        if target in f(text[mid:hi]):
            a_lo = mid
        else:
            a_hi = mid - 1
    a = a_lo
    b_lo, b_hi = a, hi  # the smallest b with target in f(text[a:b])
    while b_lo < b_hi:
        mid = (b_lo + b_hi) // 2
        if target in f(text[a:mid]):
            b_hi = mid
        else:
            b_lo = mid + 1
    return a, b_lo


def verify(span: CitedSpan, docs: Mapping[str, Document], default_doc: str | None = None) -> Citation:
    """Check a cited span against its document; return the Citation with its verdict. Of the
    quote's readings (see `CitedSpan.longer`), the longest that verifies is the quote."""
    for quote in span.longer:
        c = _verify(span.model_copy(update={"quote": quote}), docs, default_doc)
        if c.verified:
            return c
    return _verify(span, docs, default_doc)


def _doc_id(span: CitedSpan, docs: Mapping[str, Document], default_doc: str | None) -> str | None:
    doc_id = span.doc_id or default_doc
    # Accept an unambiguous prefix of a doc id, as the CLI does.
    if doc_id and doc_id not in docs:
        hits = [d for d in docs if d.startswith(doc_id)]
        doc_id = hits[0] if len(hits) == 1 else doc_id
    return doc_id


def _verify(span: CitedSpan, docs: Mapping[str, Document], default_doc: str | None) -> Citation:
    doc_id = _doc_id(span, docs, default_doc)
    claim = span.span
    doc = docs.get(doc_id) if doc_id else None
    if doc is None:
        return Citation(doc_id=doc_id or "", span=claim, quote=span.quote, note="unknown document")
    if doc.type == "html" and claim.element_id is None and claim.page is not None:
        # HTML has no pages; keep the line claim, look up by quote below
        claim = claim.model_copy(update={"page": None})
    page_n = _page_for(doc, span.span)
    if len(normalize(span.quote)) < MIN_QUOTE_CHARS:
        return Citation(doc_id=doc_id, span=claim, quote=span.quote, note="no quote to check")
    if page_n is not None:
        lines = doc.page(page_n).lines
        if lines and claim.line_start <= len(lines):
            first = lines[max(0, claim.line_start - 1)]
            last = lines[min(len(lines), claim.line_end) - 1]
            hit = find_quote(doc, span.quote, first.start, last.end)
            if hit:
                # Narrowed to the lines the quote actually covers: still inside what was cited.
                a, b = doc.locate(hit[0]), doc.locate(max(hit[0], hit[1] - 1))
                narrow = {"line_start": a.line, "line_end": b.line} if a.page == b.page == page_n else {}
                return Citation(doc_id=doc_id, quote=span.quote, verified=True,
                                span=claim.model_copy(update=narrow | {"char_start": hit[0], "char_end": hit[1]}))
    hit = find_in_document(doc, span.quote)
    if hit is None:
        return Citation(doc_id=doc_id, span=claim, quote=span.quote, note="quote not found in the document")
    return relocate(doc, hit, quote=span.quote)


def cited_lines(span: CitedSpan, docs: Mapping[str, Document], default_doc: str | None,
                within: Sequence[Passage]) -> Citation | None:
    """The lines a citation names, quoted whole, when they lie inside one of the passages `within`
    (those the model read); None otherwise, and None for a quote in quotation marks (words the
    model says are written there and are not: a fabrication, not a pointer). For a bare
    `[PAGE:19, LINE:20-26]`, or a label after the model's own words: the lines it points at are
    then what is judged (verified text), never the words around the marker."""
    if span.quoted:
        return None
    doc_id = _doc_id(span, docs, default_doc)
    doc = docs.get(doc_id) if doc_id else None
    page_n = _page_for(doc, span.span) if doc is not None else None
    if page_n is None:
        return None
    lines = doc.page(page_n).lines
    a, b = span.span.line_start, span.span.line_end
    if not 1 <= a <= b <= len(lines):
        return None
    lo, hi = lines[a - 1].start, lines[b - 1].end
    if not any(p.doc_id == doc_id and p.span.char_start <= lo and hi <= p.span.char_end for p in within):
        return None
    c = cite_lines(doc, page_n, a, b)
    return c if len(normalize(c.quote)) >= MIN_QUOTE_CHARS else None


def relocate(doc: Document, hit: tuple[int, int], *, quote: str) -> Citation:
    """A verified citation for the text at char span `hit` (a quote found by search)."""
    a = doc.locate(hit[0])
    b = doc.locate(max(hit[0], hit[1] - 1))
    if b.page != a.page:  # crosses a page break: cite the page where it starts, to its end
        b_line = len(doc.page(a.page).lines)
    else:
        b_line = b.line
    html = doc.type == "html"
    return Citation(
        doc_id=doc.doc_id,
        span=Span(page=None if html else a.page, element_id=doc.page(a.page).label if html else None,
                  line_start=a.line, line_end=b_line, char_start=hit[0], char_end=hit[1]),
        quote=quote,
        verified=True,
        relocated=True,
    )


def verify_answer(answer: str, docs: Mapping[str, Document], default_doc: str | None = None) -> list[Citation]:
    return [verify(s, docs, default_doc) for s in parse_citations(answer)]


def cite_lines(doc: Document, page: int, line_start: int, line_end: int) -> Citation:
    """A verified citation of whole lines (evidence passages): the quote is the lines' text."""
    p = doc.page(page)
    line_end = min(line_end, len(p.lines))
    text = doc.lines_text(page, line_start, line_end)
    html = doc.type == "html"
    first, last = p.lines[line_start - 1], p.lines[line_end - 1]
    return Citation(
        doc_id=doc.doc_id,
        span=Span(page=None if html else page, element_id=p.label if html else None,
                  line_start=line_start, line_end=line_end, char_start=first.start, char_end=last.end),
        quote=text,
        verified=True,
    )
