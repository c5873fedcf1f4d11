"""The schema, as an ordered list of small named migrations.

Each migration is a function of the `sqlite_utils.Database`; `migrate()` applies the ones
not yet recorded in `_migrations`, each in its own IMMEDIATE transaction so that two
processes opening a fresh file at once cannot both apply it. To change the schema, append
`m00N_what_it_does` to `MIGRATIONS`; never edit one that has shipped.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from sqlite_utils import Database

# Retrieval units and the tokenizers each is indexed with; `pipelines.fulltext` decides
# what text goes into each index and how a question becomes a MATCH expression.
FTS_UNITS = ("segments", "pages", "passages")
# The text columns of each unit's index (`pipelines.ingest.record.Record.search_text`
# holds one value per column, in this order).
FTS_COLUMNS = {"segments": ("text",), "pages": ("text",), "passages": ("text", "titles")}
FTS_TOKENIZERS = {
    "unicode61": "unicode61 remove_diacritics 2",
    "trigram": "trigram",
}


def fts_table(unit: str, tokenizer: str) -> str:
    if unit not in FTS_UNITS or tokenizer not in FTS_TOKENIZERS:
        raise ValueError(f"no FTS index for unit={unit!r} tokenizer={tokenizer!r}")
    return f"fts_{unit}_{tokenizer}"


def _run(db: Database, statements: list[str]) -> None:
    # One statement at a time: executescript() would COMMIT the migration's transaction.
    for sql in statements:
        db.execute(sql)


def m001_initial(db: Database) -> None:
    statements = [
        """CREATE TABLE documents (
            doc_id TEXT PRIMARY KEY,
            sha256 TEXT NOT NULL UNIQUE,
            path TEXT NOT NULL,
            type TEXT NOT NULL,
            title TEXT,
            pages INTEGER NOT NULL,
            chars INTEGER NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            ingested_at TEXT NOT NULL
        )""",
        # Every path the same content was ingested from; `documents.path` is the first.
        """CREATE TABLE document_paths (
            doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
            path TEXT NOT NULL,
            added_at TEXT NOT NULL,
            PRIMARY KEY (doc_id, path)
        )""",
        "CREATE INDEX document_paths_by_path ON document_paths(path)",
        # lines: JSON [[n, start, end, role], ...] with offsets into the document text, so
        # `show --page` is one row read; the line text is text[start - pages.start : ...].
        """CREATE TABLE pages (
            id INTEGER PRIMARY KEY,
            doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
            n INTEGER NOT NULL,
            label TEXT,
            start INTEGER NOT NULL,
            "end" INTEGER NOT NULL,
            text TEXT NOT NULL,
            lines TEXT NOT NULL,
            UNIQUE (doc_id, n)
        )""",
        """CREATE TABLE sections (
            doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
            ord INTEGER NOT NULL,
            id TEXT NOT NULL,
            number TEXT,
            title TEXT NOT NULL,
            level INTEGER NOT NULL,
            parent_id TEXT,
            char_start INTEGER NOT NULL,
            char_end INTEGER NOT NULL,
            page_start INTEGER NOT NULL,
            line_start INTEGER NOT NULL,
            page_end INTEGER NOT NULL,
            line_end INTEGER NOT NULL,
            element_id TEXT,
            PRIMARY KEY (doc_id, id)
        )""",
        """CREATE TABLE anchors (
            doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            type TEXT NOT NULL,
            subtype TEXT,
            text TEXT NOT NULL,
            value TEXT NOT NULL,
            char_start INTEGER NOT NULL,
            char_end INTEGER NOT NULL,
            page INTEGER NOT NULL,
            line INTEGER NOT NULL,
            section_id TEXT,
            target_section_id TEXT,
            PRIMARY KEY (doc_id, idx)
        )""",
        "CREATE INDEX anchors_by_type_value ON anchors(type, value)",
        """CREATE TABLE segments (
            id INTEGER PRIMARY KEY,
            doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            char_start INTEGER NOT NULL,
            char_end INTEGER NOT NULL,
            page_start INTEGER NOT NULL,
            line_start INTEGER NOT NULL,
            page_end INTEGER NOT NULL,
            line_end INTEGER NOT NULL,
            token_count INTEGER NOT NULL,
            text TEXT NOT NULL,
            UNIQUE (doc_id, idx)
        )""",
    ]
    # The indexes are built from normalised text (pipelines.fulltext.index_text), which is
    # never read back, so they are contentless (half the size); rowid = pages.id /
    # segments.id. Removing a row takes the 'delete' command with that same index text.
    for unit in ("segments", "pages"):
        for name, spec in FTS_TOKENIZERS.items():
            statements.append(
                f"CREATE VIRTUAL TABLE {fts_table(unit, name)}"
                f" USING fts5(text, content='', tokenize='{spec}')"
            )
    _run(db, statements)


def m002_passages(db: Database) -> None:
    """Passages (a few lines of one page): the unit retrieval ranks and evidence cites."""
    statements = [
        """CREATE TABLE passages (
            id INTEGER PRIMARY KEY,
            doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            page INTEGER NOT NULL,
            label TEXT,
            line_start INTEGER NOT NULL,
            line_end INTEGER NOT NULL,
            char_start INTEGER NOT NULL,
            char_end INTEGER NOT NULL,
            section_id TEXT,
            text TEXT NOT NULL,
            UNIQUE (doc_id, idx)
        )""",
    ]
    # Passages are indexed with their section titles in a second column (a heading's words
    # count for the clause under it) and, for the word index, with Porter stemming: both
    # measured on the CUAD gold (bench/results/retrieval.md).
    for name, spec in FTS_TOKENIZERS.items():
        if name == "unicode61":
            spec = "porter " + spec
        statements.append(
            f"CREATE VIRTUAL TABLE {fts_table('passages', name)}"
            f" USING fts5(text, titles, content='', tokenize='{spec}')"
        )
    _run(db, statements)


def m003_runs(db: Database) -> None:
    """Questions asked, the answers given and every citation shown, with how they were made."""
    _run(
        db,
        [
            """CREATE TABLE runs (
                id TEXT PRIMARY KEY,
                kind TEXT NOT NULL,
                question TEXT NOT NULL,
                doc_ids TEXT NOT NULL,
                model TEXT,
                settings TEXT NOT NULL DEFAULT '{}',
                status TEXT NOT NULL,
                answer TEXT,
                raw_answer TEXT,
                timings TEXT NOT NULL DEFAULT '{}',
                created_at TEXT NOT NULL,
                job_id TEXT,
                item_id TEXT
            )""",
            "CREATE INDEX runs_by_job ON runs(job_id, item_id)",
            """CREATE TABLE citations (
                run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                ord INTEGER NOT NULL,
                role TEXT NOT NULL,
                doc_id TEXT NOT NULL,
                page INTEGER,
                section_id TEXT,
                line_start INTEGER NOT NULL,
                line_end INTEGER NOT NULL,
                quote TEXT NOT NULL,
                segment_id INTEGER,
                verified INTEGER NOT NULL,
                relocated INTEGER NOT NULL,
                char_start INTEGER,
                char_end INTEGER,
                note TEXT,
                PRIMARY KEY (run_id, role, ord)
            )""",
        ],
    )


def m004_jobs(db: Database) -> None:
    """Review jobs: the checklist and documents of each job, and which (document, item)
    pairs are answered. A `job_items` row is written by a trigger in the same transaction
    as its run, and its primary key refuses a second answer to the same pair, so a job
    killed at any moment and resumed has every pair answered exactly once."""
    _run(
        db,
        [
            """CREATE TABLE jobs (
                id TEXT PRIMARY KEY,
                checklist_name TEXT NOT NULL,
                checklist TEXT NOT NULL,
                checklist_digest TEXT NOT NULL,
                settings TEXT NOT NULL DEFAULT '{}',
                status TEXT NOT NULL,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL
            )""",
            """CREATE TABLE job_documents (
                job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
                doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
                ord INTEGER NOT NULL,
                path TEXT NOT NULL,
                PRIMARY KEY (job_id, doc_id)
            )""",
            """CREATE TABLE job_items (
                job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
                doc_id TEXT NOT NULL,
                item_id TEXT NOT NULL,
                run_id TEXT NOT NULL UNIQUE REFERENCES runs(id) ON DELETE CASCADE,
                PRIMARY KEY (job_id, doc_id, item_id)
            )""",
            """CREATE TRIGGER runs_record_job_item AFTER INSERT ON runs
               WHEN NEW.job_id IS NOT NULL AND NEW.item_id IS NOT NULL
                 AND NEW.kind IN ('review', 'conflict')
               BEGIN
                 INSERT INTO job_items (job_id, doc_id, item_id, run_id)
                 VALUES (NEW.job_id, json_extract(NEW.doc_ids, '$[0]'), NEW.item_id, NEW.id);
               END""",
        ],
    )


def m005_map_results(db: Database) -> None:
    """What the map step extracted from each segment, so an interrupted map-reduce resumes."""
    _run(
        db,
        [
            """CREATE TABLE map_results (
                run_key TEXT NOT NULL,
                doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
                segment INTEGER NOT NULL,
                extraction TEXT NOT NULL,
                PRIMARY KEY (run_key, doc_id, segment)
            )""",
        ],
    )


def m006_summaries(db: Database) -> None:
    """`docqa summarize`: each segment's extraction and each cluster's summary as they are
    made (keyed by a hash of model and settings, so a rerun resumes), and the finished
    summary's structure beside its run."""
    _run(
        db,
        [
            """CREATE TABLE summary_segments (
                settings_key TEXT NOT NULL,
                doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
                segment INTEGER NOT NULL,
                extraction TEXT NOT NULL,
                PRIMARY KEY (settings_key, doc_id, segment)
            )""",
            """CREATE TABLE summary_clusters (
                settings_key TEXT NOT NULL,
                cluster_key TEXT NOT NULL,
                summary TEXT NOT NULL,
                PRIMARY KEY (settings_key, cluster_key)
            )""",
            """CREATE TABLE summaries (
                run_id TEXT PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
                summary TEXT NOT NULL
            )""",
        ],
    )


def m007_citation_supports(db: Database) -> None:
    """Whether each answer citation supports the answer (the quote answers the question),
    beside whether it is verified (its words are on its lines); NULL where not judged."""
    _run(db, ["ALTER TABLE citations ADD COLUMN supports INTEGER"])


def m008_passage_titles(db: Database) -> None:
    """Each passage's section titles, as its FTS row holds them, stored beside it: the record
    (`pipelines.ingest.record`) brings them, and removing a document deletes its FTS rows
    with them instead of working them out again. Filled in here for documents stored before."""
    from ..pipelines.document import Section
    from ..pipelines.ingest.passages import passage_titles

    db.execute("ALTER TABLE passages ADD COLUMN titles TEXT NOT NULL DEFAULT ''")
    doc_ids = [r[0] for r in db.execute("SELECT DISTINCT doc_id FROM passages")]
    for did in doc_ids:
        sections = [Section(**{k: v for k, v in r.items() if k not in ("doc_id", "ord")})
                    for r in db.query("SELECT * FROM sections WHERE doc_id = ? ORDER BY ord", [did])]
        rows = list(db.query("SELECT id, section_id FROM passages WHERE doc_id = ? ORDER BY idx", [did]))
        titles = passage_titles(sections, [_SectionOf(r["section_id"]) for r in rows])
        db.conn.executemany("UPDATE passages SET titles = ? WHERE id = ?",
                            [(t, r["id"]) for t, r in zip(titles, rows)])


def m009_passage_vectors(db: Database) -> None:
    """Each document's passage vectors for dense retrieval, one row per document: the matrix
    (float16, row-major, one row per passage in passage order) and the name of what made it
    (`pipelines.ingest.passages.vectors_name`). Documents stored before have none; their
    first question makes them (`app.service.Library.dense`)."""
    _run(db, ["""CREATE TABLE passage_vectors (
        doc_id TEXT PRIMARY KEY REFERENCES documents(doc_id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        rows INTEGER NOT NULL,
        dim INTEGER NOT NULL,
        vectors BLOB NOT NULL
    )"""])


class _SectionOf:
    """What `passage_titles` reads of a passage: the section it lies in."""

    def __init__(self, section_id: str | None):
        self.section_id = section_id


MIGRATIONS: list[Callable[[Database], None]] = [m001_initial, m002_passages, m003_runs, m004_jobs, m005_map_results,
                                                m006_summaries, m007_citation_supports, m008_passage_titles,
                                                m009_passage_vectors]


def applied(db: Database) -> set[str]:
    if "_migrations" not in db.table_names():
        return set()
    return {row["name"] for row in db.query("SELECT name FROM _migrations")}


def pending(db: Database) -> list[str]:
    """The names of the migrations not yet applied."""
    done = applied(db)
    return [m.__name__ for m in MIGRATIONS if m.__name__ not in done]


def migrate(db: Database) -> list[str]:
    """Apply pending migrations in order; returns the names applied now."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    done_now = []
    for migration in MIGRATIONS:
        name = migration.__name__
        if name in applied(db):
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            # Re-checked under the write lock: another process may have just applied it.
            if name not in applied(db):
                migration(db)
                db.execute(
                    "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)",
                    [name, datetime.now(timezone.utc).isoformat(timespec="seconds")],
                )
                done_now.append(name)
            db.execute("COMMIT")
        except BaseException:
            if db.conn.in_transaction:
                db.execute("ROLLBACK")
            raise
    return done_now
