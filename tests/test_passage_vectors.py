"""Passage vectors for dense retrieval: made at ingest by the record, written by the store
(float16, one row per document), read back for retrieval; documents stored without them (or
before the migration that added them) get them on their first question."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from docqa.app import migrations
from docqa.app.cli import app
from docqa.app.service import Library
from docqa.app.store import Store
from docqa.pipelines.document import PassageVectors, RawLine, RawPage, assemble
from docqa.pipelines.ingest.passages import make_passages, passage_titles, passage_vectors, vectors_name
from docqa.pipelines.ingest.record import make_record

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sample_contract.pdf"


class HashEncoder:
    """A stand-in encoder: each text as a normalised bag of hashed words (8 dims)."""

    name = "hash/8"

    def encode(self, texts):
        out = np.zeros((len(texts), 8), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, sum(map(ord, w)) % 8] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def small_doc():
    pages = [["SUPPLY AGREEMENT", "1. Term. This Agreement runs for five years."],
             ["2. Termination. Either party may terminate on ninety days notice.", "3. Governing law: Delaware."]]
    return assemble([RawPage(lines=[RawLine(text=t) for t in p]) for p in pages],
                    doc_id="sup", content_sha256="5" * 64, path="supply.pdf", type="pdf")


def test_record_vectors_round_trip_and_removal(tmp_path):
    doc = small_doc()
    record = make_record(doc, HashEncoder())
    assert record.vectors.name == "hash/8 [titles: text]"
    assert record.vectors.matrix.shape == (len(record.passages), 8)
    with Store(tmp_path / "v.db") as store:
        store.add_record(record)
        back = store.passage_vectors("sup")
        assert back.name == record.vectors.name and back.matrix.dtype == np.float32
        assert np.abs(back.matrix - record.vectors.matrix).max() < 1e-3  # stored as float16
        assert store.counts()["passage_vectors"] == 1
        store.remove("sup")
        assert store.passage_vectors("sup") is None and store.counts()["passage_vectors"] == 0


def test_vectors_that_do_not_fit_the_passages_are_refused(tmp_path):
    doc = small_doc()
    good = make_record(doc, HashEncoder())
    bad = make_record(doc)
    bad = type(bad)(**{**bad.__dict__, "vectors": PassageVectors("hash/8", good.vectors.matrix[:1])})
    with Store(tmp_path / "v.db") as store:
        before = store.counts()
        with pytest.raises(ValueError, match="passage vectors for"):
            store.add_record(bad)
        assert store.counts() == before  # one transaction: nothing half-written
        store.add_record(make_record(doc))
        with pytest.raises(ValueError, match="passage vectors for"):
            store.set_passage_vectors("sup", PassageVectors("hash/8", good.vectors.matrix[:1]))


def test_a_document_stored_before_vectors_gets_them_on_its_first_question(tmp_path, monkeypatch):
    """A database made before migration m009 (by a docqa whose migrations ended at m008) is
    migrated on opening; its document still answers, and its first question makes the vectors
    the ingest would have made, once."""
    doc = small_doc()
    path = tmp_path / "old.db"
    with monkeypatch.context() as older:
        before = migrations.MIGRATIONS[: migrations.MIGRATIONS.index(migrations.m009_passage_vectors)]
        older.setattr(migrations, "MIGRATIONS", before)
        with Store(path) as store:
            store.add_record(make_record(doc))
            assert "passage_vectors" not in store.db.table_names()
    with Store(path) as store:
        assert store.passage_vectors("sup") is None
        lib = Library(store)
        docs, passages = lib.load(["sup"])
        steps = []
        ranked = lib.retrieve("How can the agreement be terminated?", docs, passages, 5,
                              on_progress=lambda step, done, total: steps.append((step, done, total)))
        assert ranked and "terminate" in ranked[0].text
        assert steps[-1] == ("encoding passages", len(passages["sup"]), len(passages["sup"]))
        stored = store.passage_vectors("sup")
        assert stored is not None and stored.name == vectors_name(lib.dense(["sup"]).encoder)
        from docqa.engine.models.bert import load_minilm

        ps = make_passages(doc)
        fresh = passage_vectors(ps, passage_titles(doc.sections, ps), load_minilm())
        assert stored.name == fresh.name
        assert (stored.matrix * fresh.matrix).sum(1).min() > 0.999
    with Store(path) as store:  # a later process reads them instead of making them again
        lib = Library(store)
        docs, passages = lib.load(["sup"])
        lib.retrieve("governing law", docs, passages, 3)
        assert lib._passage_encoder is None


def test_ingest_stores_vectors_and_ask_uses_them(tmp_path):
    db = str(tmp_path / "cli.db")
    runner = CliRunner()
    out = runner.invoke(app, ["ingest", str(FIXTURE), "--db", db, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    doc_id = json.loads(out.stdout)[0]["doc_id"]
    with Store(db) as store:
        vectors = store.passage_vectors(doc_id)
        assert vectors is not None and len(vectors.matrix) == len(store.passages(doc_id))
    out = runner.invoke(app, ["ask", doc_id, "Which law governs?", "--evidence-only", "--json", "--db", db],
                        catch_exceptions=False)
    assert out.exit_code == 0, out.output
    pages = [c["page"] for c in json.loads(out.stdout)["citations"]]
    # The fixture has three pages: each shown once before any is shown again (five evidence items).
    assert len(pages) == 5 and sorted(pages[:3]) == [1, 2, 3], pages
    with Store(db) as store:
        lib = Library(store)
        docs, passages = lib.load([doc_id])
        lib.retrieve("Which law governs?", docs, passages, 5)
        assert lib._passage_encoder is None  # the vectors made at ingest were used


def test_passages_in_a_script_the_encoder_cannot_read_are_left_to_lexical_search():
    """MiniLM reads English word pieces: a Chinese article is not embedded (its row is zero) and
    dense retrieval scores only the passages it embedded; a mixed page keeps its vector."""
    from docqa.pipelines.answer.retrieval import Dense, _dense

    pages = [["第五百七十七条 当事人一方不履行合同义务或者履行合同义务不符合约定的，应当承担继续履行、采取补救措施或者赔偿损失等违约责任。"],
             ["Article 577. Where a party fails to perform its contractual obligations, it bears liability for breach of contract (违约责任)."]]
    doc = assemble([RawPage(lines=[RawLine(text=t) for t in p]) for p in pages],
                   doc_id="cc", content_sha256="6" * 64, path="code.pdf", type="pdf")
    passages = make_passages(doc)
    seen = []

    class Recording(HashEncoder):
        def encode(self, texts):
            seen.extend(texts)
            return super().encode(texts)

    vectors = passage_vectors(passages, passage_titles(doc.sections, passages), Recording())
    chinese = [i for i, p in enumerate(passages) if "第五百七十七条" in p.text]
    english = [i for i, p in enumerate(passages) if "Article 577" in p.text]
    assert chinese and english
    assert not any("第五百七十七条" in t for t in seen)
    assert not vectors.matrix[chinese].any() and vectors.matrix[english].any()
    sims = _dense("liability for breach of contract", Dense({"cc": vectors.matrix}, HashEncoder()), ["cc"])
    assert {i for _, i in sims} == set(english)


def test_review_and_ray_workers_store_documents_with_vectors(tmp_path):
    """`docqa review` ingests new files with their vectors, and a Ray worker's parse
    (`parse_source`) carries them to the driver: the driver, which alone retrieves, does not
    make them on its first question."""
    from docqa.app.ingest import add_record, open_source, parse_source
    from docqa.app.review_cli import _documents
    from docqa.engine.models.bert_numpy import load_question_encoder

    name = vectors_name(load_question_encoder())
    with Store(tmp_path / "local.db") as store:
        ((doc_id, _),) = _documents(store, [FIXTURE])
        vectors = store.passage_vectors(doc_id)
        assert vectors is not None and vectors.name == name
        assert len(vectors.matrix) == len(store.passages(doc_id))
    source = open_source(FIXTURE)
    out = parse_source(source)
    assert out["record"].vectors is not None and out["record"].vectors.name == name
    with Store(tmp_path / "driver.db") as store:
        add_record(store, source, out["record"])
        assert np.array_equal(store.passage_vectors(doc_id).matrix, vectors.matrix)
