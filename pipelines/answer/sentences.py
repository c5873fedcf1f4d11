"""A document's sentences as the conflict rules and the summarizer read them.

A sentence is read from the body lines only (page headers and footers are skipped) and runs
across line breaks and, in a PDF or text file, across a page break where the page ends
mid-sentence (in a lower-case word or a comma, or the next begins in lower case): "…obligations
under this" at the foot of one page and "Agreement." at the top of the next are one sentence. It keeps its
`parts`, one char span per page, so that it can be cited whole: one citation per page, each
quoting what lies on that page's lines.

A sentence ends at `.`, `;` (also U+037E, the Greek question mark that EDGAR filings set for
a semicolon), `!` or `?` before a capital, a digit, an opening quote or bracket ("[Signature
page follows]") or an enumeration such as "(b) " — and at a blank line; not after an initial
or an abbreviation ("F. Hoffmann", "No. 5"). A short heading that ends with a period ("3.2 Termination for
Convenience.") stays with the sentence it introduces. HTML sections never share a sentence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..document import Document

MIN_SENTENCE_CHARS = 25
SEMICOLON = ";\u037e"
_HEADING = re.compile(
    r"^(?:[\dIVXA-Z]+(?:\.\d+)*\.?\s+)?(?:[A-Z][\w'-]*(?:\s+(?:of|for|and|the|to|in|on|or))*\s+){0,6}[A-Z][\w'-]*\.$"
)
_SENTENCE_END = re.compile(
    rf"(?<=[.{SEMICOLON}!?])[\"”')\]]*\s+(?=[\"“(\[]?[A-Z0-9]|\([a-z]{{1,4}}\)\s)|\n\s*\n"
)


@dataclass(frozen=True)
class Sentence:
    start: int  # char offset in Document.text of its first character
    end: int  # and one past its last
    text: str  # its words, whitespace normalised, headers and footers left out
    parts: tuple[tuple[int, int], ...]  # (start, end) on each page it lies on, in order


@dataclass(frozen=True)
class _Flow:
    """The body lines of some pages joined by newlines, with where each line came from."""

    text: str
    lines: tuple[tuple[int, int, int, int], ...]  # (offset in text, doc start, length, page)

    def span(self, a: int, b: int) -> Sentence | None:
        """The sentence at `text[a:b]`, blanks trimmed; None when nothing is left."""
        raw = self.text[a:b]
        a += len(raw) - len(raw.lstrip())
        b -= len(raw) - len(raw.rstrip())
        if b <= a:
            return None
        parts: list[list[int]] = []
        page = None
        for off, start, n, p in self.lines:
            if off + n <= a or off >= b:
                continue
            lo, hi = start + max(0, a - off), start + min(n, b - off)
            if hi <= lo:
                continue
            if p == page:
                parts[-1][1] = hi
            else:
                parts.append([lo, hi])
                page = p
        if not parts:
            return None
        return Sentence(parts[0][0], parts[-1][1], " ".join(self.text[a:b].split()), tuple(map(tuple, parts)))


# A page that ends mid-sentence ends in a lower-case word or a comma ("…obligations under this"),
# or in a word at the end of a full line ("…of any Governmental"); one that ends in a number or
# a short line (a heading, "Confidential Information 24") does not.
_RUNS_ON = re.compile(r"(?:(?<![\w'-])(?![ivxlc]+\s*$)[a-z][\w'’-]+|,)\s*$")  # not a page number "iv"
_PAGE_NUMBER = re.compile(r"^\s*(?:page\s+)?[-–]?\s*(?:\d{1,4}|[ivxlc]{1,6})\s*[-–]?\s*(?:of\s+\d{1,4})?\s*$", re.I)
_ENDS_IN_WORD = re.compile(r"[A-Za-z][\w'’-]*\s*$")


def _runs_on(last: str, nxt: str, width: int) -> bool:
    """Whether the sentence at the foot of a page (its last line `last`) goes on at the top of
    the next (`nxt`); `width` is a typical line's length in these pages."""
    if _RUNS_ON.search(last) or nxt[:1].islower():
        return True
    return bool(_ENDS_IN_WORD.search(last)) and len(last) >= 0.8 * width


def _flow(doc: Document, first: int, last: int) -> _Flow:
    pages = []
    for p in doc.pages[first - 1 : last]:
        body = [ln for ln in p.lines if ln.role == "body"]
        # A page number the footer detection missed (too few pages, or one page only).
        while body and _PAGE_NUMBER.match(body[-1].text):
            body.pop()
        while body and _PAGE_NUMBER.match(body[0].text):
            body.pop(0)
        if body:
            pages.append((p, body))
    # A typical line of the document (not of these pages: a sentence's bounds must not depend
    # on which pages were read around it).
    widths = sorted(len(ln.text) for q in doc.pages for ln in q.lines if ln.role == "body")
    width = widths[len(widths) // 2] if widths else 0
    pieces: list[str] = []
    lines: list[tuple[int, int, int, int]] = []
    pos = 0
    for k, (p, body) in enumerate(pages):
        if k and (doc.type == "html" or not _runs_on(pages[k - 1][1][-1].text, body[0].text, width)):
            pieces.append("")  # a blank line: the sentence before the page break ends there
            pos += 1
        for ln in body:
            lines.append((pos, ln.start, len(ln.text), p.n))
            pieces.append(ln.text)
            pos += len(ln.text) + 1
    return _Flow("\n".join(pieces), tuple(lines))


# "F. Hoffmann-La Roche", "U.S. Patent No. 5": an initial or an abbreviation ends no sentence.
_ABBREVIATION = re.compile(r"(?:(?<![\w.])[A-Z]|\b(?:No|Nos|Inc|Ltd|Corp|Co|Sec|Art|Mr|Mrs|Ms|Dr|St|Jr|vs|etc|cf))\.$")


def _bounds(text: str) -> list[int]:
    bounds = [0]
    for m in _SENTENCE_END.finditer(text):
        if _ABBREVIATION.search(text[max(0, m.start() - 8) : m.start()]):
            continue
        piece = text[bounds[-1] : m.start() + 1].strip()
        # "1." and "3.2 Termination for Convenience." are headings, not sentences: they stay
        # with the sentence that follows (a paragraph break always ends one).
        if "\n\n" in m.group() or (len(piece) >= MIN_SENTENCE_CHARS and not _HEADING.match(piece)):
            bounds.append(m.end())
    bounds.append(len(text))
    return bounds


def sentences(doc: Document, spans: Sequence[tuple[int, int]]) -> list[Sentence]:
    """The whole sentences that overlap any of the char spans, in reading order. A sentence
    that starts on the page before a span or ends on the page after it is still whole."""
    seen: dict[tuple[int, int], Sentence] = {}
    for lo, hi in spans:
        if hi <= lo or not doc.pages:
            continue
        first, last = doc.locate(lo).page, doc.locate(max(lo, hi - 1)).page
        flow = _flow(doc, max(1, first - 1), min(len(doc.pages), last + 1))
        bounds = _bounds(flow.text)
        for a, b in zip(bounds, bounds[1:]):
            s = flow.span(a, b)
            if s is not None and s.start < hi and s.end > lo:
                seen.setdefault((s.start, s.end), s)
    return sorted(seen.values(), key=lambda x: x.start)


def clauses(doc: Document, s: Sentence, max_chars: int) -> list[Sentence]:
    """A sentence longer than `max_chars` cut at its semicolons into runs of whole clauses,
    each run as long as fits in `max_chars` (a single clause still longer stays whole: a
    sentence is never cut at a line end)."""
    if len(s.text) <= max_chars:
        return [s]
    first, last = doc.locate(s.start).page, doc.locate(s.end - 1).page
    flow = _flow(doc, first, last)
    # Where the sentence lies in the flow of its pages.
    a = next(off + (s.start - start) for off, start, n, _ in flow.lines if start <= s.start <= start + n)
    b = next(off + (s.end - start) for off, start, n, _ in reversed(flow.lines) if start <= s.end <= start + n)
    cuts = [a] + [a + m.end() for m in re.finditer(rf"[{SEMICOLON}]\s+", flow.text[a:b])] + [b]
    out, lo = [], a
    for prev, nxt in zip(cuts[1:], cuts[2:]):
        # `prev` ends the run so far; take the next clause into it while the run fits.
        if len(" ".join(flow.text[lo:nxt].split())) > max_chars:
            piece = flow.span(lo, prev)
            if piece is not None:
                out.append(piece)
            lo = prev
    piece = flow.span(lo, b)
    if piece is not None:
        out.append(piece)
    return out or [s]
