"""Passages: the retrieval and citation unit — a few consecutive lines of one page.

Segments (~2048 tokens) are what the engine reads; passages (~a paragraph) are what search
ranks and what evidence cites. A passage never crosses a page (or an HTML section), so it
always has one `[PAGE:p, LINE:a-b]` label. Repeated headers/footers are left out: they
match every query and prove nothing.

Each passage also gets a sentence embedding (`passage_vectors`, with an injected encoder)
for dense retrieval: made at ingest and stored with the document.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..document import Document, Encoder, Passage, PassageVectors, Section, Span

TARGET_CHARS = 400  # about a paragraph; long enough for bm25, short enough to cite
MAX_CHARS = 1000


def _ends_paragraph(text: str) -> bool:
    t = text.rstrip()
    return t.endswith((".", ":", ";", "。", "；", "：")) or not t


def make_passages(doc: Document) -> list[Passage]:
    out: list[Passage] = []
    sec_starts = [(s.span.char_start, s.id) for s in doc.sections]
    heading_at = {s.span.char_start for s in doc.sections}
    for page in doc.pages:
        body = [ln for ln in page.lines if ln.role == "body" and ln.text.strip()]
        group: list = []
        size = 0

        def flush():
            nonlocal group, size
            if group:
                a, b = group[0], group[-1]
                sid = None
                for start, s_id in sec_starts:
                    if start <= a.start:
                        sid = s_id
                    else:
                        break
                out.append(
                    Passage(
                        doc_id=doc.doc_id,
                        index=len(out),
                        span=Span(page=page.n, element_id=page.label, line_start=a.n, line_end=b.n,
                                  char_start=a.start, char_end=b.end),
                        text=doc.text[a.start : b.end],
                        section_id=sid,
                    )
                )
            group, size = [], 0

        prev_n = None
        for ln in body:
            # A blank line (or a header) between two lines is a paragraph break.
            gap = prev_n is not None and ln.n != prev_n + 1
            # A clause heading always starts a passage, so evidence is cited clause by clause.
            if group and (ln.start in heading_at or size >= MAX_CHARS
                          or (size >= TARGET_CHARS and (gap or _ends_paragraph(group[-1].text)))):
                flush()
            group.append(ln)
            size += len(ln.text) + 1
            prev_n = ln.n
        flush()
    return out


def passage_titles(sections: Sequence[Section], passages: Sequence[Passage]) -> list[str]:
    """Per passage, the titles of its section and the sections above it: what an FTS
    index stores beside the text, so a heading's words count for the clause under it."""
    by_id = {s.id: s for s in sections}
    out = []
    for p in passages:
        titles, sid = [], p.section_id
        while sid and sid in by_id:
            s = by_id[sid]
            # A "title" that is really the clause's first sentence cut short is not a heading.
            if len(s.title.split()) <= 8:
                titles.append(s.title)
            sid = s.parent_id
        out.append(" / ".join(titles))
    return out


# What of a passage its vector embeds; part of the vectors' name, so that vectors made from
# other text are never compared with a question (they are made again instead).
VECTOR_TEXT = "titles: text"
VECTOR_BATCH = 256  # passages per progress report


def vectors_name(encoder: Encoder) -> str:
    return f"{encoder.name} [{VECTOR_TEXT}]"


def vector_texts(passages: Sequence[Passage], titles: Sequence[str]) -> list[str]:
    """A passage as its vector reads it: its section titles, then its text — a clause under
    its heading, as a reader sees it (the encoder keeps the first 128 tokens)."""
    return [f"{t}: {p.text}" if t else p.text for p, t in zip(passages, titles, strict=True)]


def passage_vectors(passages: Sequence[Passage], titles: Sequence[str], encoder: Encoder,
                    on_progress: Callable[[int, int], None] | None = None) -> PassageVectors:
    """Every passage's embedding, in order; `on_progress(done, total)` after each batch."""
    texts = vector_texts(passages, titles)
    parts = []
    for start in range(0, len(texts), VECTOR_BATCH):
        parts.append(encoder.encode(texts[start : start + VECTOR_BATCH]))
        if on_progress:
            on_progress(min(start + VECTOR_BATCH, len(texts)), len(texts))
    matrix = np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)
    return PassageVectors(vectors_name(encoder), matrix.astype(np.float32, copy=False))
