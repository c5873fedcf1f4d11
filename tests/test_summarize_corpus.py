"""`docqa summarize` on the corpus (slow: ingests and reads whole documents): every citation
re-checks against the page's lines, the summary of a contract cites the gold pages of most
CUAD categories, the paper gets its [PAPER:] header, RFCs are cited by element id."""

import json

import pytest

from docqa.app.ingest import ingest_path
from docqa.app.store import Store
from docqa.app.summarize import SummarizeSettings, summarize

from corpus import CORPUS, GOLD, IBM, PAPER

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CORPUS.exists(), reason="needs the shared corpus (../shared/corpus)")]

RULES = SummarizeSettings(evidence_only=True, length="detailed")


def rechecks(store, c) -> bool:
    from docqa.pipelines.textnorm import normalize

    page = c.span.page or store.db.execute("SELECT n FROM pages WHERE doc_id = ? AND label = ?",
                                      [c.doc_id, c.span.element_id]).fetchone()[0]
    _, p = store.get_page(c.doc_id, page)
    return normalize(c.quote) in normalize("\n".join(ln.text for ln in p.lines[c.span.line_start - 1 : c.span.line_end]))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = Store(tmp_path_factory.mktemp("summ") / "db.sqlite")
    yield s
    s.close()


def test_contract_summary_cites_the_gold_pages_and_every_citation_rechecks(store):
    did = ingest_path(store, IBM, max_bytes=200_000_000)["doc_id"]
    run, summ = summarize(store, [did], RULES)
    cites = summ.citations()
    assert cites and all(rechecks(store, c) for c in cites)
    assert all(s.citations for s in summ.sentences())
    gold = {}
    for line in GOLD.read_text().splitlines():
        q = json.loads(line)
        if q["doc_file"].endswith(IBM.name) and q["has_answer"]:
            pages = {p for sp in q["gold_spans"] for p in (sp["pdf_pages_1based"] or [])}
            if pages:
                gold[q["category"]] = pages
    cited = {c.span.page for c in cites}
    covered = [k for k, pages in gold.items() if pages & cited]
    # bench/results/summarize.md: the detailed summary covers most categories (15 of 19); far fewer than
    # the contract's 75 pages are cited.
    assert len(covered) >= 0.75 * len(gold), (len(covered), len(gold))  # 15 of 19 (13 before the budget)
    assert len(cited) < 60
    kinds = {b.kind for b in summ.blocks}
    assert {"outline", "obligations", "terms", "topic"} <= kinds


def test_paper_header_and_rfc_element_ids(store):
    did = ingest_path(store, PAPER, max_bytes=200_000_000)["doc_id"]
    _, summ = summarize(store, [did], SummarizeSettings(evidence_only=True))
    assert summ.blocks[0].kind == "paper" and summ.blocks[0].title.startswith("[PAPER: Lost in the Middle")
    assert any(b.kind == "conclusions" and b.sentences for b in summ.blocks)
    rfc = ingest_path(store, CORPUS / "html/rfc9112_HTTP_1.1.html", max_bytes=200_000_000)["doc_id"]
    _, summ = summarize(store, [rfc], SummarizeSettings(evidence_only=True))
    cites = summ.citations()
    assert cites and all(c.span.page is None and c.span.element_id for c in cites)
    assert all(rechecks(store, c) for c in cites)
