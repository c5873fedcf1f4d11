"""Segments: contiguous spans of about `target_tokens` tokens that together cover the whole
document text. They are the units the engine's per-document cache and the map-reduce
summariser work in (SPEC §5: segments of e.g. 2048 tokens).

Segments break only between lines, so no line (and so no table row) is ever split, and
prefer, in this order: a section start, a paragraph break (blank line, or a page break
after a finished sentence), a sentence end, and last any line break. Breaking between two
rows of one Markdown table is avoided unless there is no other way.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Callable

from ..document import Chunk, Document, Span
from . import SEGMENT_TOKENS

__all__ = ["SEGMENT_TOKENS", "make_segments", "approx_tokens"]

_CJK_CLASS = r"\u3000-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_CJK = re.compile(f"[{_CJK_CLASS}]")
_WORD = re.compile(r"[A-Za-z]+")
_LONG = re.compile(r"[A-Za-z]{7}(?=[A-Za-z])")
_DIGIT = re.compile(r"\d")
_SPACES = re.compile(r" {2,}")
_PUNCT = re.compile(f"([^\\sA-Za-z\\d{_CJK_CLASS}])\\1{{0,3}}")

# Measured against SmolLM2-135M's byte-level BPE (the default model) on the corpus: see
# tests/test_segments.py. An English word is usually one token when short and splits into
# about one more token per 7 letters when long; digits and punctuation are a token each
# (runs such as "......" merge about four to a token); a CJK character costs about 1.9
# tokens in this English-centred vocabulary.
_CJK_TOKENS = 1.9


def approx_tokens(text: str) -> int:
    """Token count estimate without a tokenizer (for the default model's GPT-2-style BPE):
    one per short word, digit or punctuation mark, one more per 7 letters of a long word,
    ~1.9 per CJK character. On the corpus documents the total is within about ±12% of the
    real count."""
    # Each term is one C-level regex pass: this runs on every line of every document.
    return (len(_WORD.findall(text)) + len(_LONG.findall(text)) + len(_DIGIT.findall(text))
            + len(_SPACES.findall(text)) + len(_PUNCT.findall(text))
            + round(len(_CJK.findall(text)) * _CJK_TOKENS))


# Break priorities: higher is better.
_SECTION, _PARAGRAPH, _SENTENCE, _LINE, _IN_TABLE = 4, 3, 2, 1, 0
_SENTENCE_END = re.compile(r"[.!?:;。！？；：”\"')\]）]\s*$")


def make_segments(
    doc: Document,
    target_tokens: int = 2048,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Cut the document into contiguous segments of about `target_tokens` tokens.

    Every segment but the last holds between ~60% and 100% of `target_tokens`, except that a
    single line longer than the budget becomes a segment of its own (lines are never
    split). Chunk spans are contiguous and cover `doc.text` from 0 to its end; the
    separator after a segment's last line belongs to that segment. `count_tokens` is the
    model's tokenizer; without it `approx_tokens` estimates.
    """
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be positive, not {target_tokens}")
    count = count_tokens or approx_tokens
    text = doc.text
    lines = [(p, ln) for p in doc.pages for ln in p.lines]
    if not lines:
        return []
    starts = [ln.start for _, ln in lines]
    # +1: the separator after each line is a token boundary (newline) in most vocabularies
    cost = [count(ln.text) + 1 if ln.text else 1 for _, ln in lines]
    cum = [0]
    for c in cost:
        cum.append(cum[-1] + c)
    prio = _break_priorities(doc, lines)

    cuts = [0]  # line indices where segments start
    n = len(lines)
    s = 0
    min_fill = 0.6 * target_tokens
    while s < n:
        # the furthest line end that keeps the segment within budget
        e = bisect_right(cum, cum[s] + target_tokens) - 1  # lines s..e-1 fit
        if e >= n:
            break
        if e <= s:
            e = s + 1  # one line over budget: it stands alone
            best = e
            if best >= n:  # ... and it is the last line: the segment ends with the document
                break
        else:
            best, best_p = e, -1
            for b in range(e, s, -1):
                if cum[b] - cum[s] < min_fill:
                    break
                if prio[b] > best_p:
                    best, best_p = b, prio[b]
                    if best_p == _SECTION:
                        break
        cuts.append(best)
        s = best
    cuts.append(n)

    out = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        char_start = 0 if a == 0 else starts[a]
        char_end = len(text) if b == n else starts[b]
        # the approximation is additive over lines; a real tokenizer recounts the text
        tokens = cum[b] - cum[a] if count_tokens is None else None
        out.append(_segment(doc, i, char_start, char_end, count, tokens))
    return out


def _break_priorities(doc: Document, lines) -> list[int]:
    """How good a place the start of line i is to begin a new segment."""
    section_starts = {s.span.char_start for s in doc.sections}
    prio = [_LINE] * (len(lines) + 1)
    for i in range(1, len(lines)):
        page, ln = lines[i]
        prev_page, prev = lines[i - 1]
        if ln.text.lstrip().startswith("|") and prev.text.lstrip().startswith("|"):
            prio[i] = _IN_TABLE
        elif ln.start in section_starts:
            prio[i] = _SECTION
        elif not prev.text.strip() or not ln.text.strip():
            prio[i] = _PARAGRAPH
        elif _SENTENCE_END.search(prev.text):
            prio[i] = _PARAGRAPH if page.n != prev_page.n else _SENTENCE
    return prio


def _segment(doc: Document, index: int, start: int, end: int, count, tokens) -> Chunk:
    text = doc.text[start:end]
    first = doc.locate(start)
    last_char = end
    while last_char > start and doc.text[last_char - 1] in "\n\f":
        last_char -= 1
    last = doc.locate(max(start, last_char - 1))
    return Chunk(index=index, span=Span(page=first.page, page_end=last.page, line_start=first.line,
                                        line_end=last.line, char_start=start, char_end=end),
                 token_count=count(text) if tokens is None else tokens, text=text)
