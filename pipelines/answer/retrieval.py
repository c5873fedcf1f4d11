"""Evidence retrieval: rank a document's passages for a question.

`retrieve()` is a pure ranking function. Several signals each rank passages, and a
weighted reciprocal-rank fusion combines them (ranks, not scores: bm25, title overlap and
cosine similarity live on unrelated scales):

- `bm25_focus`: FTS5 bm25 for the question's subject (its quoted phrase, else its content
  words);
- `bm25_terms`: bm25 for every content word plus the thesaurus expansions
  (`pipelines.answer.query`), so a clause written in drafting words ("may terminate ... upon
  ninety days' notice") is found for a question asked in labels ("termination for
  convenience");
- `titles`: passages of sections whose title shares words with the subject — contracts
  file most clauses under a telling heading ("16.9 Governing Law");
- `clauses`: passages of a section the question names ("Section 8.3") come first;
- `definitions`: the defining sentence of a defined term the question names;
- `preamble`: a contract's opening passages, for questions about its title, parties, date;
- `bm25_pages`: bm25 of whole pages for the same words as `bm25_terms`, each page standing
  for its passage that `bm25_terms` ranks best: a clause split over several passages (or
  spread over a page) whose words no single passage holds together still ranks. Weighted
  below the passage signals: it recounts `bm25_terms`' words at a coarser unit, so it
  breaks ties between pages rather than outvoting them;
- `figure_rows`: for a question about a figure (`pipelines.answer.figures`: "total revenues in
  2022", "capex", "how many employees"), passages holding a line that names the quantity
  with a number — a statement row or a sentence — those naming a wanted year first;
- `statements`: for the same questions, passages of the primary statements (income
  statement, balance sheet, cash flow statement) that hold the quantity, or that the
  question names, each page as its best passage;
- `dense`: cosine similarity of the question's sentence embedding and each passage's,
  stored at ingest (`Dense`); exact search, every passage of the documents scored.

The two broad signals, `bm25_terms` and `bm25_pages`, rank definitions last (`definition_keys`:
passages under a "Definitions" heading, or opening with `"Term" means`): a definition says
what a word means, not what a party must do, yet it holds many words of any question asked
with a thesaurus. The narrow signals (the subject's own words, titles, the definitions a
question names) keep them where they rank.

Full-text search is injected (`Fts`: expression, doc ids, limit -> (doc_id, passage index,
bm25); `PageFts` the same for (doc_id, page number, bm25)), so the store's FTS5 tables serve
the product and the in-memory ones of `memory_fts` stand in where none is given. Both index
a passage's text and, in a second column weighted `fulltext.TITLE_WEIGHT`, its section
titles (`ingest.passages.passage_titles`). Dense retrieval's passage vectors and question
encoder are injected too (`Dense`): the store keeps the vectors, made at ingest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..document import Document, Encoder, Passage, Section
from .figures import FigureQuery, analyze_figures, row_matches, statement_of
from .memory_fts import MemoryFts, MemoryPageFts
from .query import Query, analyze, content_words, stem
from ..ingest.sections import section_key
from ..textnorm import normalize

Fts = Callable[[str, list[str], int], list[tuple[str, int, float]]]
PageFts = Fts  # the same contract, with page numbers for passage indexes

# Reciprocal-rank fusion constant and signal weights. The lexical ones were chosen on the
# CUAD category descriptions' behaviour, never on the gold spans' words; dense's on the tuning
# part of the corpus only, where one weight served figure, business-fact and clause questions
# alike (bench/results/retrieval.md: the per-kind grid). The figure signals speak only for
# questions that ask for a figure, the clause and preamble signals only for those that name one.
RRF_K = 20
WEIGHTS: dict[str, float] = {
    "bm25_focus": 1.0,
    "bm25_terms": 1.0,
    "titles": 1.0,
    "clauses": 4.0,
    "definitions": 1.0,
    "preamble": 3.0,
    "bm25_pages": 0.75,
    "figure_rows": 2.0,
    "statements": 3.0,
    "dense": 0.5,
}
FTS_LIMIT = 100


@dataclass(frozen=True)
class Dense:
    """What dense retrieval reads: each document's passage vectors (rows in passage order,
    `ingest.passages.passage_vectors`) and the encoder that embeds a question as they were
    embedded. A document without vectors is ranked by the other signals alone."""

    vectors: Mapping[str, np.ndarray]
    encoder: Encoder


def fts_quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def fts_expression(phrases: Sequence[str]) -> str | None:
    """An FTS5 OR of phrases made of word characters only: user text never becomes FTS5
    syntax (no operators, column filters or prefixes)."""
    parts = []
    for ph in phrases:
        words = re.findall(r"[^\W_]+", normalize(ph))
        if words:
            parts.append(fts_quote(" ".join(words)))
    parts = list(dict.fromkeys(parts))
    return " OR ".join(parts) if parts else None


# --------------------------------------------------------------------------------------
# Signals: each returns passage keys (doc_id, index), best first.

Key = tuple[str, int]


def _bm25(fts: Fts, phrases: Sequence[str], doc_ids: list[str]) -> list[Key]:
    expr = fts_expression(phrases)
    if not expr:
        return []
    return [(d, i) for d, i, _ in fts(expr, doc_ids, FTS_LIMIT)]


def _pages(page_fts: PageFts, phrases: Sequence[str], doc_ids: list[str],
           passages: Mapping[str, Sequence[Passage]], within: Sequence[Key]) -> list[Key]:
    """Pages ranked by bm25, each as its passage ranked best in `within` (else its first):
    fusion and citations work on passages, so a page must be named by one."""
    expr = fts_expression(phrases)
    if not expr:
        return []
    rank = {key: r for r, key in enumerate(within)}
    on_page: dict[tuple[str, int], list[Key]] = {}
    for d in doc_ids:
        for p in passages.get(d, ()):
            on_page.setdefault((d, p.span.page), []).append((d, p.index))
    out = []
    for d, n, _ in page_fts(expr, doc_ids, FTS_LIMIT):
        keys = on_page.get((d, n))
        if keys:
            out.append(min(keys, key=lambda k: rank.get(k, len(rank))))
    return out


_DEFINES = re.compile(
    r"^\s*(?:[0-9]+(?:\.[0-9]+)*\.?\s+)?[\"“][^\"”]{1,80}[\"”]\s*(?:shall\s+)?(?:means?|has the meaning|have the meaning|shall have the meaning)\b",
    re.IGNORECASE,
)


# A contract's definitions heading ("DEFINITIONS", "Definitions and Interpretation"), not a
# specification's section that defines its subject ("9.3 Method Definitions").
_DEFINITIONS_HEADING = re.compile(
    r"(?:(?:certain|additional|other)\s+)?(?:definitions?|defined terms)"
    r"(?:\s+and\s+(?:interpretation|construction|rules of construction))?",
    re.IGNORECASE,
)


def definition_keys(docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]]) -> set[Key]:
    """Passages that define words rather than bind anyone: those under a heading that says
    "Definitions" (or a section below one), and those opening with `"Term" means`."""
    out: set[Key] = set()
    for doc_id, doc in docs.items():
        heading = {s.id for s in doc.sections if _DEFINITIONS_HEADING.fullmatch(" ".join(re.findall(r"[^\W_]+", s.title)))}
        defining = {sid for sid, chain in _ancestors(doc).items() if heading.intersection(chain)}
        for p in passages.get(doc_id, ()):
            if p.section_id in defining or _DEFINES.match(p.text):
                out.add((doc_id, p.index))
    return out


def operative_first(keys: Sequence[Key], definitions: set[Key]) -> list[Key]:
    """`keys` with the definitions moved after everything else, each part in its order."""
    return [k for k in keys if k not in definitions] + [k for k in keys if k in definitions]


def _ancestors(doc: Document) -> dict[str, list[str]]:
    by_id = {s.id: s for s in doc.sections}
    out = {}
    for s in doc.sections:
        chain, cur = [], s
        while cur is not None:
            chain.append(cur.id)
            cur = by_id.get(cur.parent_id) if cur.parent_id else None
        out[s.id] = chain
    return out


def _title_scores(q: Query, doc: Document) -> dict[str, float]:
    """Per section: how well its title names the question's subject. Focus words weigh
    most, expansions least; a title is scored by the share of its words that match, so
    "Governing Law" beats "Compliance with Law" for "governing law"."""
    weights: dict[str, float] = {}
    for w in q.expansions:
        for t in content_words(w):
            weights.setdefault(stem(t), 0.5)
    for t in q.terms:
        weights[stem(t)] = max(weights.get(stem(t), 0), 1.0)
    for ph in q.focus:
        for t in content_words(ph):
            weights[stem(t)] = 2.0
    scores = {}
    for s in doc.sections:
        words = [stem(t) for t in content_words(s.title)]
        # Titles that are really a clause's first sentence cut short say little.
        if not words or len(words) > 8:
            continue
        hit = sum(weights.get(w, 0.0) for w in dict.fromkeys(words))
        if hit:
            scores[s.id] = hit / (len(set(words)) ** 0.5)
    return scores


def _titles(q: Query, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]],
            within: Sequence[Key] = ()) -> list[Key]:
    """Passages of well-titled sections; inside one section, in the order of `within`
    (the bm25 ranking), then in reading order."""
    rank = {key: r for r, key in enumerate(within)}
    scored: list[tuple[float, int, int, Key]] = []
    for doc_id, doc in docs.items():
        sec = _title_scores(q, doc)
        if not sec:
            continue
        anc = _ancestors(doc)
        for p in passages.get(doc_id, ()):
            if not p.section_id:
                continue
            chain = anc.get(p.section_id, [p.section_id])
            # The nearest titled ancestor counts fully, farther ones less: a passage deep
            # inside "5 TERMINATION" is about termination, but less surely than 5.2's own.
            best = max((sec.get(sid, 0.0) * (0.8**depth) for depth, sid in enumerate(chain)), default=0.0)
            if best > 0:
                key = (doc_id, p.index)
                scored.append((-round(best, 6), rank.get(key, len(rank)), p.index, key))
    scored.sort()
    return [k for *_, k in scored]


def _section_matches(doc: Document, ref: str) -> list[Section]:
    base = re.sub(r"\(.*$", "", ref).strip()
    key = section_key(base)
    if key is None:
        return []
    hits = [s for s in doc.sections if section_key(s.number) == key]
    if not hits and key[0] in ("num",) and len(key[1]) > 1:
        # "Section 8.3" in a document numbered "8.3.1 ..." only: its subsections.
        hits = [s for s in doc.sections if (k := section_key(s.number)) and k[0] == "num" and k[1][: len(key[1])] == key[1]]
    return hits


def _clauses(q: Query, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]]) -> list[Key]:
    out: list[Key] = []
    for ref in q.clauses:
        for doc_id, doc in docs.items():
            ps = passages.get(doc_id, ())
            for s in _section_matches(doc, ref):
                for p in ps:
                    if p.span.char_end > s.span.char_start and p.span.char_start < s.span.char_end:
                        out.append((doc_id, p.index))
    return list(dict.fromkeys(out))


PREAMBLE_PASSAGES = 12


def _preamble(q: Query, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]]) -> list[Key]:
    """A contract's first passages, in order, for questions about what its opening
    states (title, parties, date); interleaved across documents."""
    if not q.preamble:
        return []
    heads = [[(d, p.index) for p in passages.get(d, ())[:PREAMBLE_PASSAGES]] for d in docs]
    return [k for tier in zip(*heads) for k in tier] if len(heads) > 1 else (heads[0] if heads else [])


def _passage_at(ps: Sequence[Passage], offset: int) -> Passage | None:
    for p in ps:
        if p.span.char_start <= offset < p.span.char_end + 1:
            return p
    return None


def _definitions(q: Query, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]]) -> list[Key]:
    wanted = {normalize(m) for m in q.mentions}
    if not wanted:
        return []
    out: list[Key] = []
    for doc_id, doc in docs.items():
        ps = passages.get(doc_id, ())
        for a in doc.anchors:
            if a.type == "DEFINITION" and a.value in wanted:
                p = _passage_at(ps, a.span.char_start)
                if p is not None:
                    out.append((doc_id, p.index))
    return list(dict.fromkeys(out))


def statement_pages(doc: Document) -> dict[int, str]:
    """Page number -> the primary statement it is ("income", "balance", "cash")."""
    out = {}
    for p in doc.pages:
        kind = statement_of([ln.text for ln in p.lines if ln.role == "body"])
        if kind:
            out[p.n] = kind
    return out


def _row_matches(fq: FigureQuery, passages: Mapping[str, Sequence[Passage]]) -> dict[Key, int]:
    """Per passage, its best line's `figures.row_matches` (0 for most). Only a passage whose
    text holds a wanted label can hold such a line, so the others' lines are not read."""
    out = {}
    for doc_id, ps in passages.items():
        for p in ps:
            norm = normalize(p.text)
            hit = any(lb in norm for lb in fq.labels)
            out[(doc_id, p.index)] = max((row_matches(line, fq) for line in p.text.split("\n")), default=0) if hit else 0
    return out


def _figure_rows(fq: FigureQuery, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]],
                 within: Sequence[Key], kinds: Mapping[str, Mapping[int, str]], matches: Mapping[Key, int]) -> list[Key]:
    """Passages stating a wanted figure (`figures.row_matches`), best match first; among
    equals, rows of a wanted statement, then the bm25 order of `within`."""
    rank = {key: r for r, key in enumerate(within)}
    scored = []
    for doc_id in docs:
        for p in passages.get(doc_id, ()):
            key = (doc_id, p.index)
            if matches[key]:
                on_statement = kinds[doc_id].get(p.span.page) in fq.statements
                scored.append((-matches[key], not on_statement, rank.get(key, len(rank)), p.index, key))
    scored.sort()
    return [k for *_, k in scored][:FTS_LIMIT]


def _statements(fq: FigureQuery, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]],
                within: Sequence[Key], kinds: Mapping[str, Mapping[int, str]], matches: Mapping[Key, int]) -> list[Key]:
    """Pages of the statements a figure question wants, each as its best passage: the one
    stating the figure, else the first in `within`'s order, else its first."""
    rank = {key: r for r, key in enumerate(within)}
    scored = []
    for doc_id in docs:
        best: dict[int, tuple] = {}
        for p in passages.get(doc_id, ()):
            kind = kinds[doc_id].get(p.span.page)
            if kind not in fq.statements:
                continue
            key = (doc_id, p.index)
            cand = (-matches[key], fq.statements.index(kind), rank.get(key, len(rank)), p.span.page, key)
            if p.span.page not in best or cand < best[p.span.page]:
                best[p.span.page] = cand
        scored += best.values()
    scored.sort()
    return [k for *_, k in scored]


def _dense(text: str, dense: Dense, doc_ids: Sequence[str]) -> dict[Key, float]:
    """Every passage's cosine similarity to the question (exact: all of them are scored)."""
    qv = dense.encoder.encode([text])[0]
    sims: dict[Key, float] = {}
    for doc_id in doc_ids:
        matrix = dense.vectors.get(doc_id)
        if matrix is not None:
            sims.update(((doc_id, i), float(c)) for i, c in enumerate(matrix @ qv))
    return sims


# A numbered exhibit's heading opens its first page: "Exhibit 21", "EXHIBIT 10.1", "Exhibit
# 10.5(14)" (sometimes split over two lines); lettered ones ("Exhibit A") are a contract's own.
_EXHIBIT = re.compile(r"exhibit\s+(\d+(?:\.\d+)*(?:\(\d+\))?[a-z]?)(?![\w.(])\.?", re.IGNORECASE)
_SIGNATURES = re.compile(r"signatures?\.?", re.IGNORECASE)
# Exhibit 13 is the annual report to security holders, filed as an exhibit when the report's
# financial statements are incorporated from it: the body, not an attachment.
_BODY_EXHIBITS = ("13",)


@dataclass(frozen=True)
class Exhibit:
    number: str  # "21", "10.1"
    first_page: int
    last_page: int
    title: str  # the lines after its heading, as the report's exhibit index names it


def exhibits(doc: Document) -> list[Exhibit]:
    """The documents filed after a report (its exhibits: plans, agreements, the subsidiary
    list, certifications): each starts on a page that opens with its numbered heading, after
    the report's signatures, and runs to the next one (the last, to the end). A document with
    no signatures page before such a heading (a contract filed as "Exhibit 10.1") has none.
    An exhibit's title is the short lines under its heading (at most three)."""
    signed = False
    starts: list[tuple[int, str, str]] = []
    for page in doc.pages:
        body = [ln.text.strip() for ln in page.lines if ln.role == "body" and ln.text.strip()]
        if signed and body:
            # The heading may be split ("Exhibit" / "10.5(14)") or run into the title.
            lines = [" ".join(body[:2]), *body[2:]] if body[0].lower() == "exhibit" else body
            m = _EXHIBIT.match(lines[0])
            if m:
                title = [lines[0][m.end():].strip()]
                for line in lines[1:4]:
                    if len(line.split()) > 10:
                        break
                    title.append(line)
                starts.append((page.n, m.group(1), " ".join(t for t in title if t)))
        if any(_SIGNATURES.fullmatch(t) for t in body):
            signed = True
    out = []
    for i, (first, number, title) in enumerate(starts):
        last = starts[i + 1][0] - 1 if i + 1 < len(starts) else len(doc.pages)
        if number not in _BODY_EXHIBITS:
            out.append(Exhibit(number, first, last, title))
    return out


def exhibit_keys(q: Query, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]]) -> set[Key]:
    """Passages of exhibits the question is not about: ranked after the body (`body_first`).
    A question is about an exhibit when it says "exhibit", names its number, or shares a word
    with its title (other than the document's own title: "Subsidiaries of PepsiCo, Inc." is
    not asked about by every question that names PepsiCo)."""
    if re.search(r"\bexhibits?\b", q.text, re.IGNORECASE):
        return set()
    asked = {stem(w) for w in q.terms}
    named = {ref.split()[-1] for ref in q.clauses if ref.startswith("Exhibit ")}
    out: set[Key] = set()
    for doc_id, doc in docs.items():
        own = {stem(w) for w in content_words(doc.title or "")}
        pages = set()
        for ex in exhibits(doc):
            if ex.number in named or ({stem(w) for w in content_words(ex.title)} - own) & asked:
                continue
            pages.update(range(ex.first_page, ex.last_page + 1))
        out.update((doc_id, p.index) for p in passages.get(doc_id, ()) if p.span.page in pages)
    return out


def body_first(ranked: Sequence[tuple[Key, float]], exhibit: set[Key]) -> list[tuple[Key, float]]:
    """The ranking with the passages of `exhibit` moved after all others, each part in order."""
    return [kv for kv in ranked if kv[0] not in exhibit] + [kv for kv in ranked if kv[0] in exhibit]


def signals(
    question: str,
    docs: Mapping[str, Document],
    passages: Mapping[str, Sequence[Passage]],
    *,
    fts: Fts | None = None,
    page_fts: PageFts | None = None,
    dense: Dense | None = None,
    extra: bool = False,
    demote_definitions: bool = True,
) -> dict[str, list[Key]]:
    """Every signal's ranking, by name (for fusion, and for measuring each one). `extra`
    adds what only the benchmark wants: `bm25_plain` (question words, no thesaurus).
    `demote_definitions=False` leaves definitions where bm25 ranks them (the benchmark's
    "before")."""
    q = analyze(question)
    doc_ids = list(docs)
    if fts is None:
        fts = MemoryFts({d: passages.get(d, ()) for d in doc_ids}, docs)
    if page_fts is None:
        page_fts = MemoryPageFts(docs)
    terms = _bm25(fts, q.terms + q.expansions, doc_ids)
    titles = _titles(q, docs, passages, terms)
    pages = _pages(page_fts, q.terms + q.expansions, doc_ids, passages, terms)
    if demote_definitions:
        defined = definition_keys(docs, passages)
        terms, pages = operative_first(terms, defined), operative_first(pages, defined)
    fq = analyze_figures(question)
    figure_rows = statements = []
    if fq.wanted:
        kinds = {d: statement_pages(doc) for d, doc in docs.items()}
        matches = _row_matches(fq, {d: passages.get(d, ()) for d in doc_ids})
        figure_rows = _figure_rows(fq, docs, passages, terms, kinds, matches)
        statements = _statements(fq, docs, passages, terms, kinds, matches)
    out = {
        "bm25_focus": _bm25(fts, q.focus, doc_ids),
        "bm25_terms": terms,
        "titles": titles,
        "clauses": _clauses(q, docs, passages),
        "definitions": _definitions(q, docs, passages),
        "preamble": _preamble(q, docs, passages),
        "bm25_pages": pages,
        "figure_rows": figure_rows,
        "statements": statements,
    }
    if extra:
        out["bm25_plain"] = _bm25(fts, q.terms, doc_ids)
    if dense is not None:
        sims = _dense(q.text, dense, doc_ids)
        out["dense"] = sorted(sims, key=lambda k: (-sims[k], k))[:FTS_LIMIT]
    return out


def fuse(rankings: Mapping[str, list[Key]], weights: Mapping[str, float] = WEIGHTS, rrf_k: int = RRF_K) -> list[tuple[Key, float]]:
    scores: dict[Key, float] = {}
    for name, keys in rankings.items():
        w = weights.get(name, 0.0)
        if not w:
            continue
        for r, key in enumerate(keys):
            scores[key] = scores.get(key, 0.0) + w / (rrf_k + r + 1)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def rank(question: str, docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]],
         rankings: Mapping[str, list[Key]], weights: Mapping[str, float] | None = None) -> list[tuple[Key, float]]:
    """Every passage the signals' `rankings` name, best first with its fused score: fused
    (`WEIGHTS` unless given), the body before the exhibits the question is not about
    (`body_first`)."""
    fused = fuse(rankings, WEIGHTS if weights is None else weights)
    return body_first(fused, exhibit_keys(analyze(question), docs, passages))


def retrieve(
    question: str,
    docs: Mapping[str, Document],
    passages: Mapping[str, list[Passage]],
    *,
    fts: Fts | None = None,
    page_fts: PageFts | None = None,
    dense: Dense | None = None,
    k: int = 10,
    weights: Mapping[str, float] | None = None,
) -> list[Passage]:
    """The `k` passages (over all `docs`) that best answer `question`, best first, each
    with its fused score in `Passage.score`.

    `fts(expression, doc_ids, limit)` runs an FTS5 MATCH over the passages (built in
    memory when not given), `page_fts` the same over whole pages; `dense` (optional) holds
    the documents' passage vectors and the question encoder."""
    sig = signals(question, docs, passages, fts=fts, page_fts=page_fts, dense=dense)
    ranked = rank(question, docs, passages, sig, weights)
    by_key = {(d, p.index): p for d, ps in passages.items() for p in ps}
    out = []
    for key, score in ranked[:k]:
        p = by_key.get(key)
        if p is not None:
            out.append(p.model_copy(update={"score": score}))
    return out


def evidence_passages(ranked: Sequence[Passage], k: int) -> list[Passage]:
    """What evidence shows: the best-ranked passage of each of the first `k` distinct pages
    (HTML: sections), in rank order. A page is one place to look, so it is listed once; only
    when the ranking holds fewer than `k` pages (a short document) do its next-best passages
    fill the list, after them."""
    seen: set[tuple[str, int]] = set()
    first, rest = [], []
    for p in ranked:
        if (p.doc_id, p.span.page) in seen:
            rest.append(p)
        else:
            seen.add((p.doc_id, p.span.page))
            first.append(p)
            if len(first) == k:
                return first
    return first + rest[: k - len(first)]
