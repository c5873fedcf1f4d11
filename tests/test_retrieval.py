"""Evidence retrieval: question analysis, each signal on a small contract, and recall of
CUAD gold pages on the three real contracts (bench/retrieval_eval.py, imported, so the test
and the published figures cannot drift apart; the floors are the figures of its newest run
in bench/results/retrieval.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from docqa.bench import retrieval_eval
from docqa.pipelines.answer.memory_fts import MemoryFts, MemoryPageFts
from docqa.pipelines.document import Anchor, Passage, RawLine, RawPage, Section, Span, assemble
from docqa.pipelines.ingest.passages import make_passages, passage_titles
from docqa.pipelines.ingest.record import make_record
from docqa.pipelines.answer.query import (
    analyze,
    clause_refs,
    content_words,
    expand,
    strip_boilerplate,
)
from docqa.pipelines.answer.retrieval import (
    definition_keys,
    fts_expression,
    retrieve,
    signals,
    top_pages,
)


CUAD_Q = ('Highlight the parts (if any) of this contract related to "Rofr/Rofo/Rofn" that should be '
          "reviewed by a lawyer. Details: Is there a clause granting one party a right of first refusal?")


# --------------------------------------------------------------------------------------
# Question analysis


def test_boilerplate_and_question_words_are_dropped():
    q = analyze(CUAD_Q)
    assert "highlight" not in q.text.lower() and "lawyer" not in q.text.lower()
    assert q.focus == ["Rofr/Rofo/Rofn", "rofr", "rofo", "rofn"]  # the phrase, then its words
    for w in ("party", "clause", "one", "contract", "lawyer", "highlight"):
        assert w not in q.terms
    assert {"granting", "right", "first", "refusal"} <= set(q.terms)


def test_thesaurus_expands_labels_to_drafting_words():
    assert "right of first refusal" in expand("rofr")
    assert "right of first offer" in analyze("Any ROFO?").expansions
    assert "without cause" in analyze("Is there termination for convenience?").expansions
    # Triggers are whole words: "reassignment" is not "assignment".
    assert "prior written consent" not in expand("reassignments of staff")


@pytest.mark.parametrize(
    "text,refs",
    [
        ("What does Section 8.3 require?", ["Section 8.3"]),
        ("see section 8.3(a) and Article VII", ["Section 8.3(a)", "Article VII"]),
        ("Exhibit B pricing", ["Exhibit B"]),
        ("Is there a clause that limits liability?", []),
        ("Clause 12 of the contract", ["Section 12"]),
    ],
)
def test_clause_references(text, refs):
    assert clause_refs(text) == refs


def test_content_words_split_hyphens_and_keep_numbers():
    assert content_words("Non-Compete for 5 years") == ["non", "compete", "5", "years"]
    assert strip_boilerplate("Details: x") == "x"


def test_fts_expression_is_never_syntax():
    expr = fts_expression(['NEAR(a b)', 'x" OR "y', "col:term*", "   "])
    assert expr == '"near a b" OR "x or y" OR "col term"'
    assert fts_expression(["?!", ""]) is None


# --------------------------------------------------------------------------------------
# Signals on a small hand-made contract

PAGES = [
    [
        "MASTER SUPPLY AGREEMENT",
        "This Master Supply Agreement is made between Acme Corp. and Widget LLC.",
        "1. DEFINITIONS",
        '"Change of Control" means a merger or a sale of all or substantially all assets.',
        '"Products" means the widgets listed in Exhibit A.',
    ],
    [
        "8. PAYMENT",
        "8.1 Invoices. Supplier shall invoice monthly and the buyer shall pay the amounts due.",
        "",
        "8.3 Late Payment. Amounts not paid within thirty days bear interest at one percent.",
        "per month until paid in full.",
    ],
    [
        "12. GOVERNING LAW",
        "This Agreement shall be construed under the laws of the State of Delaware.",
        "",
        "13. MISCELLANEOUS",
        "Each party shall comply with every law, law and regulation, and law applicable to it.",
    ],
]


def _section(doc, sid, number, title, first_line, last_line):
    (p0, l0), (p1, l1) = first_line, last_line
    start = doc.page(p0).lines[l0 - 1].start
    end = doc.page(p1).lines[l1 - 1].end
    return Section(id=sid, number=number, title=title, level=1, char_start=start, char_end=end,
                   page_start=p0, line_start=l0, page_end=p1, line_end=l1)


@pytest.fixture(scope="module")
def contract():
    doc = assemble([RawPage(lines=[RawLine(text=t) for t in page]) for page in PAGES],
                   doc_id="msa", content_sha256="0" * 64, path="msa.pdf", type="pdf")
    doc.sections = [
        _section(doc, "s1", "1", "DEFINITIONS", (1, 3), (1, 5)),
        _section(doc, "s2", "8", "PAYMENT", (2, 1), (2, 5)),
        _section(doc, "s3", "8.3", "Late Payment", (2, 4), (2, 5)),
        _section(doc, "s4", "12", "GOVERNING LAW", (3, 1), (3, 2)),
        _section(doc, "s5", "13", "MISCELLANEOUS", (3, 4), (3, 5)),
    ]
    doc.sections[2] = doc.sections[2].model_copy(update={"parent_id": "s2", "level": 2})
    line = doc.page(1).lines[3]
    doc.anchors = [Anchor(type="DEFINITION", text="Change of Control", value="change of control",
                          char_start=line.start, char_end=line.end, page=1, line=4, section_id="s1")]
    ps = make_passages(doc)
    # Each clause heading starts its own passage, so every signal has distinct candidates.
    assert [(p.span.page, p.span.line_start) for p in ps] == [(1, 1), (1, 3), (2, 1), (2, 4), (3, 1), (3, 4)]
    return {"msa": doc}, {"msa": ps}


def test_clause_mention_puts_that_section_first(contract):
    docs, ps = contract
    top = retrieve("What does Section 8.3 say?", docs, ps, k=3)
    assert top[0].span.page == 2 and "Late Payment" in top[0].text


def test_defined_term_finds_its_definition(contract):
    docs, ps = contract
    sig = signals("Can we terminate on a Change of Control?", docs, ps)
    first = ps["msa"][sig["definitions"][0][1]]
    assert '"Change of Control" means' in first.text


def test_section_titles_rank_their_sections(contract):
    docs, ps = contract
    # "law" is repeated under MISCELLANEOUS; only the title says which section governs.
    titles = signals("Which governing law applies?", docs, ps)["titles"]
    texts = [ps["msa"][i].text for _, i in titles]
    assert "Delaware" in texts[0]
    assert not any("comply with every law" in t for t in texts)
    top = retrieve("Which governing law applies?", docs, ps, k=2)
    assert "Delaware" in top[0].text


def test_passage_titles_hold_the_section_chain(contract):
    docs, ps = contract
    titles = passage_titles(docs["msa"].sections, ps["msa"])
    assert titles[3] == "Late Payment / PAYMENT"
    assert titles[0] == ""


def test_scores_descend_and_pages_are_distinct(contract):
    docs, ps = contract
    top = retrieve("interest on late payment", docs, ps, k=5)
    assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)
    assert top_pages(top, 3) == list(dict.fromkeys((p.doc_id, p.span.page) for p in top))[:3]


def test_injected_fts_is_used(contract):
    docs, ps = contract
    calls = []
    mem = MemoryFts(ps)

    def fts(expr, doc_ids, limit):
        calls.append((expr, tuple(doc_ids)))
        return mem(expr, doc_ids, limit)

    retrieve(CUAD_Q, docs, ps, fts=fts)
    assert calls and all(d == ("msa",) for _, d in calls)
    assert any('"right of first refusal"' in e for e, _ in calls)


def test_page_bm25_sees_a_page_whole(contract):
    """Page 2 holds "invoice" in one passage and "interest" in another: no passage has both,
    the page does. The page signal names each page once, by its passage that the passage
    bm25 ranks best, and runs on the injected page index."""
    docs, ps = contract
    calls = []
    mem = MemoryPageFts(docs)

    def page_fts(expr, doc_ids, limit):
        calls.append(expr)
        return mem(expr, doc_ids, limit)

    sig = signals("invoice interest", docs, ps, page_fts=page_fts)
    assert calls
    assert [ps["msa"][i].span.page for _, i in sig["bm25_pages"]] == [2]
    assert sig["bm25_pages"][0] == next(k for k in sig["bm25_terms"] if ps["msa"][k[1]].span.page == 2)


def test_definitions_are_recognised(contract):
    """Under a "Definitions" heading, or opening with a quoted term and "means"; a clause
    that merely defines a term in passing ("(the "Effective Date")") is not a definition."""
    docs, ps = contract
    assert definition_keys(docs, ps) == {("msa", 1)}
    texts = ['1.48 “Post-Approval Study” means a study conducted after approval.',
             'This Agreement is effective on 1 May 2020 (the "Effective Date") and means business.',
             '"Affiliate" shall have the meaning given in Section 2.']
    doc = assemble([RawPage(lines=[RawLine(text=t) for t in texts])], doc_id="d", content_sha256="1" * 64,
                   path="d.pdf", type="pdf")
    passages = [Passage(doc_id="d", index=i, page=1, line_start=i + 1, line_end=i + 1, char_start=0, char_end=len(t), element_id=None,
                        text=t) for i, t in enumerate(texts)]
    assert definition_keys({"d": doc}, {"d": passages}) == {("d", 0), ("d", 2)}
    # A specification's section that defines its subject is operative text, not a glossary.
    spec = assemble([RawPage(lines=[RawLine(text="9.3 Method Definitions"),
                                    RawLine(text="The GET method requests transfer of a current representation.")])],
                    doc_id="s", content_sha256="2" * 64, path="s.pdf", type="pdf")
    spec.sections = [_section(spec, "m", "9.3", "Method Definitions", (1, 1), (1, 2))]
    spec_passages = make_passages(spec)
    assert {p.section_id for p in spec_passages} == {"m"}
    assert definition_keys({"s": spec}, {"s": spec_passages}) == set()
    spec.sections = [_section(spec, "m", "9.3", "Definitions", (1, 1), (1, 2))]
    assert definition_keys({"s": spec}, {"s": spec_passages}) == {("s", p.index) for p in spec_passages}


def test_broad_signals_rank_definitions_last(contract):
    """The definition of "Change of Control" holds more of these words than any clause, so
    the broad bm25 ranks it first; the product ranks operative text before it there, keeps
    it in the list, and leaves the narrow signals (subject words, named definitions) alone."""
    docs, ps = contract
    q = "merger or sale of assets under the law"
    before = signals(q, docs, ps, demote_definitions=False)
    after = signals(q, docs, ps)
    assert before["bm25_terms"][0] == ("msa", 1)  # the definitions passage
    assert after["bm25_terms"][-1] == ("msa", 1) and sorted(after["bm25_terms"]) == sorted(before["bm25_terms"])
    assert after["bm25_focus"] == before["bm25_focus"] and after["titles"] == before["titles"]
    named = signals("Can we terminate on a Change of Control?", docs, ps)
    assert named["definitions"] == [("msa", 1)]


def test_question_with_nothing_searchable(contract):
    docs, ps = contract
    assert retrieve("?? !!", docs, ps) == []


# --------------------------------------------------------------------------------------
# CUAD gold: the regression test


@pytest.fixture(scope="module")
def cuad_docs():
    return retrieval_eval.load_docs(None)


def test_cuad_recall_lexical(cuad_docs):
    """Lexical fusion alone (no encoder): the gold page among the top 5 cited pages."""
    r = retrieval_eval.evaluate(encoder=None, docs_by_file=cuad_docs)
    assert r["n"] == 67
    assert r["recall"]["lexical fused"][5] >= retrieval_eval.expected()["lexical fused"] - 0.03, r["misses"]
    assert [f["n"] for f in r["split_lexical"]] == [27, 21, 19]  # every question held out once
    # The page-level bm25 signal earns its place on the gold: more gold pages in the top 5
    # with it than without, and no fewer at 1 or 3.
    final, without = r["recall"]["lexical fused"], r["recall"]["final without page-level bm25"]
    assert final[5] > without[5] and final[1] >= without[1] and final[3] >= without[3]
    # So does ranking definitions last in the broad signals: more gold pages in the top 3,
    # no fewer at 1 or 5.
    undemoted = r["recall"]["final without definitions ranked last"]
    assert final[3] > undemoted[3] and final[1] >= undemoted[1] and final[5] >= undemoted[5]
    # Chosen on two contracts and scored on the third, the grid of page weights and
    # definition handling still clears the target within the same margin.
    held_out5 = sum(f["hits"][2] for f in r["split_lexical"]) / r["n"]
    assert held_out5 >= retrieval_eval.expected()["held out"] - 0.03, r["split_lexical"]


def test_cuad_recall_through_the_store(cuad_docs, tmp_path):
    """The same gold through what `docqa ask` runs: passages and their FTS5 index from the
    SQLite store (stemmed, with the titles column) and its page index, ranked by `retrieve()`."""
    import json

    from docqa.app.service import Library
    from docqa.app.store import Store
    from docqa.pipelines.answer.retrieval import retrieve, top_pages

    store = Store(tmp_path / "cuad.db")
    for doc in cuad_docs.values():
        store.add_record(make_record(doc))
    lib = Library(store)
    hits = n = 0
    for line in retrieval_eval.GOLD.open():
        g = json.loads(line)
        gold = {p for s in g["gold_spans"] for p in (s["pdf_pages_1based"] or [])}
        if not (g["has_answer"] and gold):
            continue
        docs, passages = lib.load([cuad_docs[Path(g["doc_file"]).name].doc_id])
        ranked = retrieve(g["question"], docs, passages, fts=lib.fts, page_fts=lib.page_fts, k=40)
        n += 1
        hits += bool(gold & {page for _, page in top_pages(ranked, 5)})
    assert n == 67
    print(f"store-path recall@5 = {hits}/{n} = {hits / n:.3f}")
    assert hits / n >= retrieval_eval.expected()["lexical fused"] - 0.03, hits / n


def test_rerank_reorders_only_the_lexical_head():
    """The embedding second stage moves passages within the first N only: what lexical
    search did not find stays out of reach, and the tail keeps its order."""
    keys = [("d", i) for i in range(6)]
    # Lexical order 0..5; cosine order the reverse.
    row = {"sig": {"bm25_terms": keys, "_cosine": {k: float(k[1]) for k in keys}}}
    out = retrieval_eval.rerank(row, 3)
    assert out[3:] == keys[3:] and sorted(out[:3]) == keys[:3]
    # Equal weights: first by one and third by the other ties with the reverse; the
    # passage ranked second by both comes last.
    assert out[2] == ("d", 1)
    assert retrieval_eval.rerank(row, 3, weight=3.0)[0] == ("d", 2)


def test_split_check_chooses_on_the_other_contracts():
    """Leave-one-contract-out: the variant is picked on two documents and scored on the
    third, so one that wins only on the held-out document is never credited there."""
    def page(n):  # a passage on page n, as far as the split check reads it
        return Passage(doc_id="x", index=0, text="", span=Span(page=n, line_start=1, line_end=1))

    rows = [{"doc_id": d, "pages": {1}, "g": {"doc_file": f"pdf/{d}.pdf"},
             "by_key": {(d, 0): page(1), (d, 1): page(2)}} for d in ("a", "b", "c") for _ in range(2)]
    grid = {
        "lexical fused": lambda r: [(r["doc_id"], 1 if r["doc_id"] == "c" else 0)],
        "other": lambda r: [(r["doc_id"], 0 if r["doc_id"] == "c" else 1)],
    }
    folds = {f["held_out"]: f for f in retrieval_eval.split_check(rows, grid)}
    assert folds["c"]["chosen"] == "lexical fused" and folds["c"]["hits"] == [0, 0, 0]
    # a tie on the training documents goes to the lexical method, listed first
    assert folds["a"]["chosen"] == "lexical fused" and folds["a"]["hits"] == [2, 2, 2]
    assert folds["a"]["lexical_hits"] == [2, 2, 2]


@pytest.mark.slow
def test_cuad_recall_with_embeddings():
    """Lexical signals plus MiniLM embeddings (an option, not the default); slow: encodes
    every passage."""
    from docqa.engine.models.bert import load_minilm

    r = retrieval_eval.evaluate(encoder=load_minilm())
    assert r["recall"]["all fused"][5] >= retrieval_eval.expected()["all fused"] - 0.03, r["misses"]
    assert len(r["split"]) == 3 and sum(f["n"] for f in r["split"]) == r["n"]
