"""Evidence retrieval on the corpus's 10-K filings (bench/filings_eval.py, imported; floors
from bench/results/filings.md's Figures line, less 0.03): one filing in the default run, all
sixteen with dense retrieval under `-m slow`; and the exhibits every filing carries after its
signatures, which evidence shows only when a question asks about them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docqa.bench import filings_eval, retrieval_eval
from docqa.pipelines.answer.retrieval import exhibits

BEST_BUY = filings_eval.BEST_BUY


@pytest.fixture(scope="module")
def best_buy():
    docs = retrieval_eval.load_corpus(BEST_BUY, None)
    if not docs:
        pytest.skip(f"{BEST_BUY} is not in ../shared/corpus")
    return docs


def test_best_buy_exhibits_and_evidence(best_buy):
    """Best Buy's 10-K signs on p. 68 and files six exhibits after it (subsidiaries, the
    auditor's consent, four certifications); its seven questions find their gold pages
    lexically, and no exhibit page is shown for them."""
    doc = best_buy[BEST_BUY]
    assert [(e.number, e.first_page) for e in exhibits(doc)] == [
        ("21.1", 69), ("23.1", 71), ("31.1", 72), ("31.2", 73), ("32.1", 74), ("32.2", 75)]
    r = filings_eval.evaluate(best_buy, dense=False)
    assert len(r["rows"]) == 7
    for row in r["rows"]:
        assert not set(retrieval_eval.pages_of(retrieval_eval.product(row), row["by_key"])) & set(range(69, 76))
    hits = sum(bool(row["gold"] & set(retrieval_eval.pages_of(retrieval_eval.product(row), row["by_key"])))
               for row in r["rows"])
    assert hits / 7 >= filings_eval.expected()["lexical Best Buy"] - 0.03, hits


@pytest.fixture(scope="module")
def filings():
    return filings_eval.load_filings()


@pytest.mark.slow
def test_every_filing_files_its_exhibits_after_its_signatures(filings):
    assert len(filings) == 16
    for name, doc in filings.items():
        found = exhibits(doc)
        assert len(found) >= 4, name
        for e in found:
            first = next(ln.text for ln in doc.pages[e.first_page - 1].lines if ln.role == "body" and ln.text.strip())
            assert re.match(r"\s*exhibit\b", first, re.IGNORECASE), (name, e)
        # No FinanceBench evidence page is an exhibit's: the rule never hides a gold page.
        gold = {p for g in filings_eval.questions() if Path(g["doc_file"]).name == name for p in g["gold_pages"]}
        assert not gold & {p for e in found for p in range(e.first_page, e.last_page + 1)}, name


@pytest.mark.slow
def test_filings_recall(filings):
    """All sixteen filings, the product with its passage vectors: FinanceBench recall@5 per
    part no worse than measured, and the issue's target on the held-out filings (≥ 0.9)."""
    r = filings_eval.evaluate(filings)
    floors = filings_eval.expected()
    fb = r["by_set"]["financebench"]
    for part in retrieval_eval.PARTS:
        for label, name in (("product", retrieval_eval.FINAL), ("lexical", retrieval_eval.LEXICAL)):
            assert fb[name][part][5] >= floors[f"{label} {part}"] - 0.03, (label, part)
    assert fb[retrieval_eval.FINAL]["held out"][5] >= 0.9
