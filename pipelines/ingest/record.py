"""The complete record of one document: what the store writes, all of it made here.

`build.build` gives the `Document` (pages, lines, sections, anchors, segments); a record adds
what retrieval needs stored beside it: the passages, each passage's section titles, and the
exact text every full-text index holds (`fulltext.index_text`, per tokenizer). The store
then only writes rows; it makes none of them (tests/test_layout.py checks its imports).
"""

from __future__ import annotations

from typing import Callable

from ..document import Document, Record
from ..fulltext import TOKENIZERS, index_text
from .build import PageProgress, build
from .chunks import SEGMENT_TOKENS
from .passages import make_passages, passage_titles
from .source import Source


def make_record(doc: Document) -> Record:
    """The record of a finished document (`build.build`)."""
    passages = make_passages(doc)
    titles = passage_titles(doc.sections, passages)
    texts = {
        "pages": [(doc.text[p.start : p.end],) for p in doc.pages],
        "segments": [(s.text,) for s in doc.segments],
        "passages": [(p.text, t) for p, t in zip(passages, titles)],
    }
    search_text = {
        (unit, tok): [tuple(index_text(col, tok) for col in row) for row in rows]
        for unit, rows in texts.items()
        for tok in TOKENIZERS
    }
    return Record(document=doc, passages=passages, titles=titles, search_text=search_text)


def build_record(
    source: Source,
    *,
    segment_tokens: int = SEGMENT_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
    on_page: PageProgress | None = None,
) -> Record:
    """Parse a loaded file (`source.load`) into its complete record."""
    return make_record(build(source, segment_tokens=segment_tokens, count_tokens=count_tokens, on_page=on_page))
