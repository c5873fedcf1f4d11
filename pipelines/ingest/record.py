"""The complete record of one document: what the store writes, all of it made here.

`build.build` gives the `Document` (pages, lines, sections, anchors, segments); a record adds
what retrieval needs stored beside it: the passages, each passage's section titles, the
exact text every full-text index holds (`fulltext.index_text`, per tokenizer), and, given
an encoder, each passage's vector for dense retrieval. The store then only writes rows; it
makes none of them (tests/test_layout.py checks its imports).
"""

from __future__ import annotations

from typing import Callable

from ..document import Document, Encoder, Record
from ..fulltext import TOKENIZERS, index_text
from .build import PageProgress, build
from .chunks import SEGMENT_TOKENS
from .passages import make_passages, passage_titles, passage_vectors
from .source import Source


def make_record(doc: Document, encoder: Encoder | None = None, on_page: PageProgress | None = None) -> Record:
    """The record of a finished document (`build.build`). With an `encoder`, the passages'
    vectors too (`on_page("encoding", done, total)` as they are made); without, a first
    question makes them (`app.service`)."""
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
    vectors = None
    if encoder is not None:
        report = (lambda done, total: on_page("encoding", done, total)) if on_page else None
        vectors = passage_vectors(passages, titles, encoder, report)
    return Record(document=doc, passages=passages, titles=titles, search_text=search_text, vectors=vectors)


def build_record(
    source: Source,
    *,
    segment_tokens: int = SEGMENT_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
    on_page: PageProgress | None = None,
    encoder: Encoder | None = None,
) -> Record:
    """Parse a loaded file (`source.load`) into its complete record (see `make_record`)."""
    doc = build(source, segment_tokens=segment_tokens, count_tokens=count_tokens, on_page=on_page)
    return make_record(doc, encoder, on_page)
