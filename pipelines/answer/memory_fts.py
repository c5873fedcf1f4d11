"""In-memory FTS5 indexes with the store's contract (`retrieval.Fts`, `retrieval.PageFts`).

`retrieve()` builds them when it is given no index of the store's (review and map-reduce rank
pages in memory; tests and benchmarks rank everything in memory). They index what the store
indexes (`fulltext.index_text`; a passage's section titles in a second column weighted
`TITLE_WEIGHT`), so a benchmark over them measures what `docqa ask` runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

from ..document import Document, Passage
from ..fulltext import TITLE_WEIGHT, index_text
from ..ingest.passages import passage_titles


class MemoryFts:
    """An in-memory FTS5 index over passages (text, and section titles when `docs` are
    given), with the same contract as the store's."""

    def __init__(self, passages: Mapping[str, Sequence[Passage]], docs: Mapping[str, Document] | None = None,
                 tokenize: str = "porter unicode61"):
        self.con = sqlite3.connect(":memory:")
        self.con.execute(
            "CREATE VIRTUAL TABLE p USING fts5(text, titles, doc_id UNINDEXED, idx UNINDEXED, "
            f"tokenize='{tokenize}')"
        )
        rows = []
        for doc_id, ps in passages.items():
            doc = docs.get(doc_id) if docs else None
            titles = passage_titles(doc.sections, ps) if doc is not None else [""] * len(ps)
            rows += [(index_text(p.text, "unicode61"), index_text(t, "unicode61"), doc_id, p.index)
                     for p, t in zip(ps, titles)]
        self.con.executemany("INSERT INTO p(text, titles, doc_id, idx) VALUES (?, ?, ?, ?)", rows)

    def __call__(self, expression: str, doc_ids: list[str], limit: int) -> list[tuple[str, int, float]]:
        marks = ",".join("?" * len(doc_ids))
        rank = f"bm25(p, 1.0, {TITLE_WEIGHT})"
        rows = self.con.execute(
            f"SELECT doc_id, idx, {rank} FROM p WHERE p MATCH ? AND doc_id IN ({marks}) ORDER BY {rank} LIMIT ?",
            (expression, *doc_ids, limit),
        ).fetchall()
        return [(d, int(i), float(s)) for d, i, s in rows]


class MemoryPageFts:
    """Whole pages in an in-memory FTS5 index, tokenized as the store's `fts_pages_unicode61`
    (no stemming), so the benchmark measures what `docqa ask` runs."""

    def __init__(self, docs: Mapping[str, Document] | Sequence[Document], tokenize: str = "unicode61 remove_diacritics 2"):
        self.con = sqlite3.connect(":memory:")
        self.con.execute(f"CREATE VIRTUAL TABLE pg USING fts5(text, doc_id UNINDEXED, n UNINDEXED, tokenize='{tokenize}')")
        docs = docs.values() if isinstance(docs, Mapping) else docs
        self.con.executemany("INSERT INTO pg VALUES (?, ?, ?)", [
            (index_text(d.text[p.start : p.end], "unicode61"), d.doc_id, p.n) for d in docs for p in d.pages])

    def __call__(self, expression: str, doc_ids: list[str], limit: int) -> list[tuple[str, int, float]]:
        marks = ",".join("?" * len(doc_ids))
        rows = self.con.execute(
            f"SELECT doc_id, n, bm25(pg) FROM pg WHERE pg MATCH ? AND doc_id IN ({marks}) ORDER BY bm25(pg) LIMIT ?",
            (expression, *doc_ids, limit),
        ).fetchall()
        return [(d, int(n), float(s)) for d, n, s in rows]
