"""The SQLite store: documents and their structure, anchors, segments and FTS indexes.

It writes the records `pipelines.ingest.record` builds, and reads them back; it makes none
of their contents (passages, titles, index text). Library first (the CLI calls one method
per command). Opened in WAL mode with a busy
timeout so several processes can share one file; every write runs in one IMMEDIATE
transaction, so a document is stored completely or not at all.

Sections, anchors, segments and passages keep the columns they always had: a row is the
structure's flat form (`pipelines.document.Spanned`), which builds its `span` on reading.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Literal

from sqlite_utils import Database

import numpy as np

from ..pipelines.document import Anchor, Chunk, Document, Line, Page, Passage, PassageVectors, Record, Section, Span
from ..pipelines.fulltext import TITLE_WEIGHT, TOKENIZERS, build_match, index_text
from .config import BUSY_TIMEOUT_S
from .errors import AmbiguousDocument, DocumentNotFound, PageOutOfRange, StoreBusy, StoreDamaged, StoreError
from .migrations import FTS_COLUMNS, FTS_UNITS, fts_table, migrate, pending

AddStatus = Literal["added", "already ingested", "new path"]


@dataclass(frozen=True)
class AddResult:
    doc_id: str
    status: AddStatus


@dataclass(frozen=True)
class DocumentInfo:
    doc_id: str
    path: str
    type: str
    title: str | None
    pages: int
    sections: int
    anchors: int
    segments: int
    ingested_at: str
    paths: list[str]


@dataclass(frozen=True)
class Hit:
    """One ranked FTS match. `bm25` is SQLite's score: more negative ranks higher."""

    doc_id: str
    unit: str  # "segments", "pages" or "passages"
    index: int  # segment or passage index (0-based), or page number (1-based)
    span: Span  # pages and lines (a page hit: all its lines)
    bm25: float
    text: str


def _busy(e: sqlite3.OperationalError) -> bool:
    """SQLite gave up waiting for another connection's lock (after the busy timeout)."""
    return getattr(e, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(e)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """The database file, opened. At open SQLite's `quick_check` looks at the whole file: a
    damaged one (`damage` says how) can still be read — the CLI warns — but is never written,
    so a damaged file is not made worse. A write waits up to `timeout_s` for another
    process's write lock, then raises `StoreBusy`."""

    def __init__(self, path: str | Path, *, timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.damage: str | None = None
        try:
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves (see transaction()).
            conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            self.db = Database(conn)
            if str(path) != ":memory:":
                self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            problems = [r[0] for r in self.db.execute("PRAGMA quick_check(3)").fetchall()]
            if problems != ["ok"]:
                self.damage = "; ".join(problems)
                if pending(self.db):
                    raise StoreDamaged(self.path, self.damage)
            else:
                migrate(self.db)
        except StoreError:
            raise
        except sqlite3.OperationalError as e:
            if _busy(e):
                raise StoreBusy(self.path, timeout_s) from None
            raise StoreError(f"cannot use database {path}: {e}") from None
        except sqlite3.DatabaseError as e:
            if "malformed" in str(e):
                raise StoreDamaged(self.path, str(e)) from None
            raise StoreError(f"cannot use database {path}: {e}") from None
        except OSError as e:
            raise StoreError(f"cannot create database {path}: {e.strerror or e}") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        """A write transaction that takes the write lock up front (BEGIN IMMEDIATE): a
        deferred one that reads first can fail with SQLITE_BUSY instead of waiting."""
        if self.damage is not None:
            raise StoreDamaged(self.path, self.damage)
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if _busy(e):
                raise StoreBusy(self.path, self.timeout_s) from None
            raise
        try:
            yield self.db
        except BaseException:
            if self.db.conn.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    # -- writing -----------------------------------------------------------------------

    def add_record(self, record: Record) -> AddResult:
        """Store a document's whole record in one transaction. The same content again is a
        no-op ("already ingested"), or only records the new path it came from ("new path")."""
        doc = record.document
        page_texts = [doc.text[p.start : p.end] for p in doc.pages]
        if "\f".join(page_texts) != doc.text:
            raise ValueError(f"{doc.doc_id}: pages do not tile the text; build it with assemble()")
        with self.transaction() as db:
            row = db.execute(
                "SELECT sha256 FROM documents WHERE doc_id = ?", [doc.doc_id]
            ).fetchone()
            if row is not None:
                if row[0] != doc.content_sha256:
                    raise StoreError(
                        f"{doc.path}: id {doc.doc_id} already belongs to different content"
                    )
                return AddResult(doc.doc_id, self._record_path(db, doc.doc_id, doc.path))
            self._insert(db, record, page_texts)
        return AddResult(doc.doc_id, "added")

    def _insert(self, db: Database, record: Record, page_texts: list[str]) -> None:
        doc = record.document
        did = doc.doc_id
        now = _now()
        db.execute(
            "INSERT INTO documents (doc_id, sha256, path, type, title, pages, chars, metadata,"
            " ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [did, doc.content_sha256, doc.path, doc.type, doc.title, len(doc.pages),
             len(doc.text), json.dumps(doc.metadata, ensure_ascii=False), now],
        )
        db.execute(
            "INSERT INTO document_paths (doc_id, path, added_at) VALUES (?, ?, ?)",
            [did, doc.path, now],
        )
        rowids: dict[str, list[int]] = {"pages": [], "segments": [], "passages": []}
        for p, text in zip(doc.pages, page_texts):
            lines = json.dumps([[ln.n, ln.start, ln.end, ln.role] for ln in p.lines])
            cur = db.execute(
                'INSERT INTO pages (doc_id, n, label, start, "end", text, lines)'
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [did, p.n, p.label, p.start, p.end, text, lines],
            )
            rowids["pages"].append(cur.lastrowid)
        db.conn.executemany(
            "INSERT INTO sections (doc_id, ord, id, number, title, level, parent_id, char_start,"
            " char_end, page_start, line_start, page_end, line_end, element_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (did, i, s.id, s.number, s.title, s.level, s.parent_id, s.span.char_start, s.span.char_end,
                 s.span.page, s.span.line_start, s.span.page_end, s.span.line_end, s.span.element_id)
                for i, s in enumerate(doc.sections)
            ],
        )
        db.conn.executemany(
            "INSERT INTO anchors (doc_id, idx, type, subtype, text, value, char_start, char_end,"
            " page, line, section_id, target_section_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (did, i, a.type, a.subtype, a.text, a.value, a.span.char_start, a.span.char_end, a.span.page,
                 a.span.line_start, a.section_id, a.target_section_id)
                for i, a in enumerate(doc.anchors)
            ],
        )
        for s in doc.segments:
            cur = db.execute(
                "INSERT INTO segments (doc_id, idx, char_start, char_end, page_start, line_start,"
                " page_end, line_end, token_count, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [did, s.index, s.span.char_start, s.span.char_end, s.span.page, s.span.line_start,
                 s.span.page_end, s.span.line_end, s.token_count, s.text],
            )
            rowids["segments"].append(cur.lastrowid)
        for p, titles in zip(record.passages, record.titles):
            cur = db.execute(
                "INSERT INTO passages (doc_id, idx, page, label, line_start, line_end, char_start,"
                " char_end, section_id, text, titles) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [did, p.index, p.span.page, p.span.element_id, p.span.line_start, p.span.line_end,
                 p.span.char_start, p.span.char_end, p.section_id, p.text, titles],
            )
            rowids["passages"].append(cur.lastrowid)
        for (unit, tok), rows in record.search_text.items():
            cols = FTS_COLUMNS[unit]
            db.conn.executemany(f"INSERT INTO {fts_table(unit, tok)} (rowid, {', '.join(cols)})"
                                f" VALUES (?{', ?' * len(cols)})",
                                [(rowid, *cells) for rowid, cells in zip(rowids[unit], rows, strict=True)])
        if record.vectors is not None:
            if len(record.vectors.matrix) != len(record.passages):
                raise ValueError(f"{did}: {len(record.vectors.matrix)} passage vectors for {len(record.passages)} passages")
            self._write_vectors(db, did, record.vectors)

    @staticmethod
    def _write_vectors(db: Database, doc_id: str, vectors: PassageVectors) -> None:
        # float16: half the bytes of float32, and cosine ranks move only between near ties.
        m = np.ascontiguousarray(vectors.matrix, dtype=np.float16)
        db.execute("INSERT OR REPLACE INTO passage_vectors (doc_id, name, rows, dim, vectors) VALUES (?, ?, ?, ?, ?)",
                   [doc_id, vectors.name, m.shape[0], m.shape[1] if m.ndim == 2 else 0, m.tobytes()])

    def set_passage_vectors(self, doc_id: str, vectors: PassageVectors) -> None:
        """Store (or replace) a document's passage vectors, made after it was stored."""
        with self.transaction() as db:
            n = db.execute("SELECT count(*) FROM passages WHERE doc_id = ?", [doc_id]).fetchone()[0]
            if len(vectors.matrix) != n:
                raise ValueError(f"{doc_id}: {len(vectors.matrix)} passage vectors for {n} passages")
            self._write_vectors(db, doc_id, vectors)

    def rename(self, ref: str, title: str) -> str:
        """Give a document a title (what `docs`, reviews and exports show); its doc id."""
        title = " ".join(title.split())
        if not title:
            raise StoreError("a title cannot be empty")
        did = self.resolve(ref)
        with self.transaction() as db:
            db.execute("UPDATE documents SET title = ? WHERE doc_id = ?", [title, did])
        return did

    def remove(self, ref: str) -> dict[str, int]:
        """Delete a document with everything derived from it, in one transaction: its rows
        (pages, sections, anchors, segments, passages, paths, job membership, map results —
        by cascade), its entries in every FTS index, the runs asked of it alone (with their
        citations and job items), and its citations in runs over several documents.
        Returns what was removed (counts)."""
        did = self.resolve(ref)
        with self.transaction() as db:
            # Contentless FTS5 rows are deleted with the exact text they were indexed with.
            pages = db.execute("SELECT id, text FROM pages WHERE doc_id = ?", [did]).fetchall()
            segments = db.execute("SELECT id, text FROM segments WHERE doc_id = ?", [did]).fetchall()
            passages = db.execute("SELECT id, text, titles FROM passages WHERE doc_id = ?", [did]).fetchall()
            for tok in TOKENIZERS:
                for unit, items in (("pages", pages), ("segments", segments)):
                    table = fts_table(unit, tok)
                    db.conn.executemany(f"INSERT INTO {table} ({table}, rowid, text) VALUES ('delete', ?, ?)",
                                        [(rowid, index_text(text, tok)) for rowid, text in items])
                table = fts_table("passages", tok)
                db.conn.executemany(
                    f"INSERT INTO {table} ({table}, rowid, text, titles) VALUES ('delete', ?, ?, ?)",
                    [(rowid, index_text(text, tok), index_text(titles, tok)) for rowid, text, titles in passages])
            runs = [(rid, json.loads(ids)) for rid, ids in db.execute(
                "SELECT id, doc_ids FROM runs WHERE EXISTS (SELECT 1 FROM json_each(runs.doc_ids)"
                " WHERE json_each.value = ?)", [did])]
            alone = [rid for rid, ids in runs if set(ids) <= {did}]
            db.conn.executemany("DELETE FROM runs WHERE id = ?", [(rid,) for rid in alone])
            cited = db.execute("DELETE FROM citations WHERE doc_id = ?", [did]).rowcount
            db.execute("DELETE FROM documents WHERE doc_id = ?", [did])
        return {"pages": len(pages), "passages": len(passages), "runs": len(alone),
                "citations_in_shared_runs": cited}

    # -- reading -----------------------------------------------------------------------

    def resolve(self, ref: str) -> str:
        """The doc id for a doc id, a unique id prefix, or a path that was ingested."""
        ref = ref.strip()
        if not ref:
            raise DocumentNotFound(ref)
        if self.db.execute("SELECT 1 FROM documents WHERE doc_id = ?", [ref]).fetchone():
            return ref
        candidates = {ref}
        try:
            candidates.add(str(Path(ref).expanduser().resolve()))
        except (OSError, RuntimeError):
            pass
        rows = self.db.execute(
            f"SELECT DISTINCT doc_id FROM document_paths WHERE path IN"
            f" ({','.join('?' * len(candidates))})",
            list(candidates),
        ).fetchall()
        if len(rows) == 1:
            return rows[0][0]
        if not rows and all(c in "0123456789abcdef" for c in ref.lower()):
            rows = self.db.execute(
                "SELECT doc_id FROM documents WHERE doc_id LIKE ? ORDER BY doc_id",
                [ref.lower() + "%"],
            ).fetchall()
            if len(rows) == 1:
                return rows[0][0]
        if len(rows) > 1:
            raise AmbiguousDocument(ref, [r[0] for r in rows])
        raise DocumentNotFound(ref)

    def get_document(self, ref: str) -> Document:
        """Rebuild the full `Document` from its rows (equal to the one stored)."""
        did = self.resolve(ref)
        d = next(self.db.query("SELECT * FROM documents WHERE doc_id = ?", [did]))
        pages, texts = [], []
        for r in self.db.query(
            'SELECT n, label, start, "end", text, lines FROM pages WHERE doc_id = ? ORDER BY n',
            [did],
        ):
            pages.append(self._page(r))
            texts.append(r["text"])
        sections, anchors, segments = self.sections(did), self.anchors(did), self.segments(did)
        return Document(
            doc_id=did,
            content_sha256=d["sha256"],
            path=d["path"],
            type=d["type"],
            title=d["title"],
            text="\f".join(texts),
            pages=pages,
            sections=sections,
            anchors=anchors,
            segments=segments,
            metadata=json.loads(d["metadata"]),
        )

    def sections(self, doc_id: str) -> list[Section]:
        return [
            Section(**{k: v for k, v in r.items() if k not in ("doc_id", "ord")})
            for r in self.db.query("SELECT * FROM sections WHERE doc_id = ? ORDER BY ord", [doc_id])
        ]

    def anchors(self, doc_id: str) -> list[Anchor]:
        return [
            Anchor(**{k: v for k, v in r.items() if k not in ("doc_id", "idx")})
            for r in self.db.query("SELECT * FROM anchors WHERE doc_id = ? ORDER BY idx", [doc_id])
        ]

    def segments(self, doc_id: str) -> list[Chunk]:
        return [
            Chunk(index=r.pop("idx"), **{k: v for k, v in r.items() if k not in ("doc_id", "id")})
            for r in self.db.query("SELECT * FROM segments WHERE doc_id = ? ORDER BY idx", [doc_id])
        ]

    def passages(self, doc_id: str) -> list[Passage]:
        return [
            # The column `label` holds the passage's HTML element id (its page's label).
            Passage(index=r.pop("idx"), element_id=r.pop("label"), **{k: v for k, v in r.items() if k not in ("id", "titles")})
            for r in self.db.query("SELECT * FROM passages WHERE doc_id = ? ORDER BY idx", [doc_id])
        ]

    def passage_vectors(self, doc_id: str) -> PassageVectors | None:
        """The document's passage vectors (float32, one row per passage), None if it has none."""
        row = self.db.execute("SELECT name, rows, dim, vectors FROM passage_vectors WHERE doc_id = ?",
                              [doc_id]).fetchone()
        if row is None:
            return None
        name, rows, dim, blob = row
        return PassageVectors(name, np.frombuffer(blob, dtype=np.float16).reshape(rows, dim).astype(np.float32))

    @staticmethod
    def _page(r: dict) -> Page:
        base, text = r["start"], r["text"]
        lines = [
            Line(n=n, text=text[start - base : end - base], start=start, end=end, role=role)
            for n, start, end, role in json.loads(r["lines"])
        ]
        return Page(n=r["n"], label=r["label"], start=base, end=r["end"], lines=lines)

    def metadata(self, doc_id: str) -> dict:
        """The document's parser metadata (PDF info, OCR'd pages, ...) without its text."""
        row = self.db.execute("SELECT metadata FROM documents WHERE doc_id = ?", [doc_id]).fetchone()
        return json.loads(row[0]) if row else {}

    def get_page(self, ref: str, n: int) -> tuple[str, Page]:
        """(doc_id, page n) without loading the rest of the document."""
        did = self.resolve(ref)
        sql = 'SELECT n, label, start, "end", text, lines FROM pages WHERE doc_id = ? AND n = ?'
        row = next(self.db.query(sql, [did, n]), None)
        if row is None:
            raise PageOutOfRange(did, n, self.info(did).pages)
        return did, self._page(row)

    def list_documents(self) -> list[DocumentInfo]:
        return self._infos()

    def info(self, ref: str) -> DocumentInfo:
        return self._infos(self.resolve(ref))[0]

    def has(self, doc_id: str) -> bool:
        row = self.db.execute("SELECT 1 FROM documents WHERE doc_id = ?", [doc_id]).fetchone()
        return row is not None

    def add_path(self, doc_id: str, path: str) -> AddStatus:
        """Record another path for content already stored (ingest skips parsing it)."""
        with self.transaction() as db:
            return self._record_path(db, doc_id, path)

    @staticmethod
    def _record_path(db: Database, doc_id: str, path: str) -> AddStatus:
        cur = db.execute(
            "INSERT OR IGNORE INTO document_paths (doc_id, path, added_at) VALUES (?, ?, ?)",
            [doc_id, path, _now()],
        )
        return "new path" if cur.rowcount else "already ingested"

    def _infos(self, doc_id: str | None = None) -> list[DocumentInfo]:
        sql = """
            SELECT d.doc_id, d.path, d.type, d.title, d.pages, d.ingested_at,
              (SELECT count(*) FROM sections s WHERE s.doc_id = d.doc_id) AS sections,
              (SELECT count(*) FROM anchors a WHERE a.doc_id = d.doc_id) AS anchors,
              (SELECT count(*) FROM segments g WHERE g.doc_id = d.doc_id) AS segments,
              (SELECT json_group_array(path) FROM document_paths p WHERE p.doc_id = d.doc_id)
                AS paths
            FROM documents d {where} ORDER BY d.ingested_at, d.doc_id
        """
        where, params = ("WHERE d.doc_id = ?", [doc_id]) if doc_id else ("", [])
        out = []
        for r in self.db.query(sql.format(where=where), params):
            r["paths"] = sorted(json.loads(r["paths"]))
            out.append(DocumentInfo(**r))
        return out

    def counts(self) -> dict[str, int]:
        """Row count of every table and FTS index (not the FTS shadow tables): what tests
        compare to prove a failed ingest changed nothing."""
        names = [
            r[0]
            for r in self.db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'fts!_%'"
                " ESCAPE '!' ORDER BY name"
            )
        ]
        names += [fts_table(u, t) for u in FTS_UNITS for t in TOKENIZERS]
        return {t: self.db.execute(f"SELECT count(*) FROM [{t}]").fetchone()[0] for t in names}

    # -- search ------------------------------------------------------------------------

    def search(
        self,
        query: str,
        doc_ids: list[str] | None = None,
        limit: int = 10,
        *,
        tokenizer: str = "unicode61",
        unit: str = "segments",
        match: str | None = None,
    ) -> list[Hit]:
        """Passages ranked by SQLite's bm25 for a free-text `query` (made safe by
        `pipelines.fulltext.build_match`), or for a prepared FTS5 `match` expression."""
        if unit not in FTS_UNITS:
            raise ValueError(f"unit must be one of {FTS_UNITS}, not {unit!r}")
        expr = match if match is not None else build_match(query, tokenizer)
        if not expr:
            return []
        fts = fts_table(unit, tokenizer)
        where, params = "", [expr]
        if doc_ids is not None:
            if not doc_ids:
                return []
            where = f" AND u.doc_id IN ({','.join('?' * len(doc_ids))})"
            params += list(doc_ids)
        if unit == "segments":
            cols = "u.idx, u.page_start, u.line_start, u.page_end, u.line_end"
        elif unit == "passages":
            cols = "u.idx, u.page, u.line_start, u.page, u.line_end"
        else:
            cols = "u.n, u.n, 1, u.n, json_array_length(u.lines)"
        rank = f"bm25({fts}, 1.0, {TITLE_WEIGHT})" if unit == "passages" else f"bm25({fts})"
        sql = (
            f"SELECT u.doc_id, {cols}, {rank} AS score, u.text"
            f" FROM {fts} JOIN {unit} u ON u.id = {fts}.rowid"
            f" WHERE {fts} MATCH ?{where} ORDER BY score LIMIT ?"
        )
        params.append(limit)
        return [
            Hit(doc_id=r[0], unit=unit, index=r[1],
                span=Span(page=r[2], line_start=r[3], page_end=r[4], line_end=r[5]), bm25=r[6], text=r[7])
            for r in self.db.execute(sql, params)
        ]
