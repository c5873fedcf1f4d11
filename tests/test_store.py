"""The store: migrations, exact round trips, one-transaction adds, id resolution, safe FTS."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from docqa.app.errors import AmbiguousDocument, DocumentNotFound, PageOutOfRange, StoreError
from docqa.app.migrations import MIGRATIONS
from docqa.app.store import Store
from docqa.pipelines.document import Section
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.fulltext import TOKENIZERS, build_match
from docqa.pipelines.ingest.record import make_record

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
CONTRACT = CORPUS / "pdf" / "contract_IBM_MSL_Outsourcing_Agreement.pdf"

MARKDOWN = """# Master Agreement

## 1. Definitions

"Goods" means the products listed in Exhibit A.

## 2. Termination

Either party may terminate this Agreement for convenience on ninety (90) days notice.

## 3. 合同的解除

当事人协商一致，可以解除合同。
"""


@pytest.fixture(scope="module")
def contract_doc():
    return ingest_file(CONTRACT)


@pytest.fixture
def md_doc(tmp_path):
    p = tmp_path / "agreement.md"
    p.write_text(MARKDOWN, encoding="utf-8")
    return ingest_file(p)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        yield s


def test_migrations_applied_once_and_recorded(tmp_path):
    Store(tmp_path / "m.db").close()
    with Store(tmp_path / "m.db") as s:  # reopening applies nothing twice
        names = [r["name"] for r in s.db.query("SELECT name FROM _migrations ORDER BY name")]
        assert names == [m.__name__ for m in MIGRATIONS]
        assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000


def test_round_trip_is_exact(store, md_doc, contract_doc):
    for doc in (md_doc, contract_doc):
        assert store.add_record(make_record(doc)).status == "added"
        assert store.get_document(doc.doc_id) == doc


def test_a_database_from_before_passage_titles_is_migrated(tmp_path, md_doc):
    """m008 fills in the section titles of passages stored before it; removing such a
    document then deletes exactly the FTS rows it had (the index ends empty)."""
    db = tmp_path / "old.db"
    with Store(db) as s:
        s.add_record(make_record(md_doc))
        # Back to the schema before m008: the column gone, the migration not recorded.
        s.db.execute("ALTER TABLE passages DROP COLUMN titles")
        s.db.execute("DELETE FROM _migrations WHERE name = 'm008_passage_titles'")
    with Store(db) as s:
        stored = [r[0] for r in s.db.execute("SELECT titles FROM passages ORDER BY idx")]
        # The Markdown's headings, by hand: the third passage is under "2. Termination".
        assert stored[2] == "Termination / Master Agreement"
        assert stored == make_record(md_doc).titles  # what a fresh ingest stores
        assert s.search("termination convenience", unit="passages")
        s.remove(md_doc.doc_id)
        fts = [f"fts_passages_{tok}" for tok in TOKENIZERS]
        assert all(s.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0 for t in fts)
        assert s.search("termination convenience", unit="passages") == []


def test_page_lines_match_the_document(store, contract_doc):
    store.add_record(make_record(contract_doc))
    doc_id, page = store.get_page(contract_doc.doc_id, 7)
    assert page == contract_doc.page(7)
    with pytest.raises(PageOutOfRange):
        store.get_page(doc_id, len(contract_doc.pages) + 1)


def test_add_is_idempotent_and_records_new_paths(store, md_doc):
    assert store.add_record(make_record(md_doc)).status == "added"
    before = store.counts()
    assert store.add_record(make_record(md_doc)).status == "already ingested"
    assert store.counts() == before
    moved = md_doc.model_copy(update={"path": "/elsewhere/agreement.md"})
    assert store.add_record(make_record(moved)).status == "new path"
    after = store.counts()
    assert after["document_paths"] == before["document_paths"] + 1
    assert {k: v for k, v in after.items() if k != "document_paths"} == {
        k: v for k, v in before.items() if k != "document_paths"}
    assert store.resolve("/elsewhere/agreement.md") == md_doc.doc_id
    assert store.get_document(md_doc.doc_id) == md_doc  # the first path stays the document's


def test_failed_add_leaves_nothing(store, md_doc, contract_doc):
    store.add_record(make_record(md_doc))
    before = store.counts()
    # Two sections with one id violate the primary key after pages were already written.
    dup = contract_doc.sections[0] if contract_doc.sections else Section(
        id="s1", number=None, title="x", level=1, char_start=0, char_end=1, page_start=1,
        line_start=1, page_end=1, line_end=1)
    broken = contract_doc.model_copy(update={"sections": [dup, dup]})
    with pytest.raises(sqlite3.IntegrityError):
        store.add_record(make_record(broken))
    assert store.counts() == before
    assert not store.has(contract_doc.doc_id)


def test_resolve_by_prefix_path_and_ambiguity(store, md_doc):
    a = md_doc.model_copy(update={"doc_id": "abc111111111", "content_sha256": "abc111" + "0" * 58,
                                  "path": "/docs/a.md"})
    b = md_doc.model_copy(update={"doc_id": "abc222222222", "content_sha256": "abc222" + "0" * 58,
                                  "path": "/docs/b.md"})
    store.add_record(make_record(a))
    store.add_record(make_record(b))
    assert store.resolve("abc1") == "abc111111111"
    assert store.resolve("/docs/b.md") == "abc222222222"
    with pytest.raises(AmbiguousDocument):
        store.resolve("abc")
    with pytest.raises(DocumentNotFound):
        store.resolve("fff")
    assert [i.doc_id for i in store.list_documents()] == ["abc111111111", "abc222222222"]


def test_search_ranks_the_right_passage_in_both_tokenizers(store, md_doc, contract_doc):
    store.add_record(make_record(md_doc))
    store.add_record(make_record(contract_doc))
    for tok in TOKENIZERS:
        hits = store.search("terminate for convenience", [md_doc.doc_id], tokenizer=tok,
                            unit="pages")
        assert hits and "terminate this Agreement for convenience" in hits[0].text
        zh = store.search("解除合同", tokenizer=tok, unit="pages")
        assert zh and zh[0].doc_id == md_doc.doc_id and "解除合同" in zh[0].text
        seg = store.search("terminate for convenience", [contract_doc.doc_id], tokenizer=tok)
        assert seg and all(h.doc_id == contract_doc.doc_id for h in seg)
        assert seg == sorted(seg, key=lambda h: h.bm25)


def test_two_character_chinese_word_needs_unicode61(store, md_doc):
    # unicode61 over spaced-out CJK matches a two-character word; trigram cannot (< 3 chars).
    store.add_record(make_record(md_doc))
    assert store.search("合同", tokenizer="unicode61", unit="pages")
    assert build_match("合同", "trigram") is None


@pytest.mark.parametrize("query", [
    'terminate" OR "x', "NEAR(terminate convenience, 2)", "text:terminate", "termin*",
    "-terminate", "^terminate", "terminate AND", "(((", '"', "a OR b NOT c", "{text}: x",
])
def test_user_text_never_becomes_fts_syntax(store, md_doc, query):
    store.add_record(make_record(md_doc))
    for tok in TOKENIZERS:
        expr = build_match(query, tok)
        if expr is not None:
            for term in expr.split(" OR "):
                assert term.startswith('"') and term.endswith('"') and '"' not in term[1:-1]
        store.search(query, tokenizer=tok)  # must not raise an FTS5 syntax error


def test_not_a_database(tmp_path):
    bad = tmp_path / "x.db"
    bad.write_bytes(b"not a database at all" * 50)
    with pytest.raises(StoreError):
        Store(bad)
