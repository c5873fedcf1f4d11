"""The store's own full-text search finds CUAD gold spans on their gold PDF pages (≥ 97%).

The evaluation itself is bench/fts_gold.py (the same function, imported), so the test and
the published figures cannot drift apart.
"""

from __future__ import annotations

import pytest

from docqa.app.store import Store
from docqa.bench import fts_gold
from docqa.pipelines.fulltext import TOKENIZERS

FAST_CONTRACT = "pdf/contract_IBM_MSL_Outsourcing_Agreement.pdf"


def test_gold_spans_found_one_contract(tmp_path):
    spans = [s for s in fts_gold.gold_spans() if s["doc_file"] == FAST_CONTRACT]
    assert len(spans) >= 40
    with Store(tmp_path / "gold.db") as store:
        ids = fts_gold.ingest_contracts(store, spans)
        for tokenizer in TOKENIZERS:
            r = fts_gold.evaluate(store, spans, ids, tokenizer=tokenizer, mode="words", k=5)
            assert r["share"] >= 0.97, (tokenizer, r["misses"])


@pytest.fixture(scope="module")
def all_contracts(tmp_path_factory):
    spans = fts_gold.gold_spans()
    with Store(tmp_path_factory.mktemp("gold") / "gold.db") as store:
        yield store, spans, fts_gold.ingest_contracts(store, spans)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["words", "phrase"])
@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_gold_spans_found_all_contracts(all_contracts, tokenizer, mode):
    store, spans, ids = all_contracts
    assert len(spans) == 188
    r = fts_gold.evaluate(store, spans, ids, tokenizer=tokenizer, mode=mode, k=5)
    assert r["share"] >= 0.97, r["misses"]
