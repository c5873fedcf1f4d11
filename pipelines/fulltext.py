"""Full-text search text and queries for SQLite FTS5 (pure; the store runs them).

Shared by both sides: ingest indexes `index_text`, the store and retrieval query with
`build_match` / `query_terms`.

Two tokenizers are indexed and measured (SPEC §4, bench/fts_gold.py):

- `unicode61`: words. It would treat a run of Chinese characters as ONE token, so the
  indexed text has every CJK character spaced out and a Chinese query becomes phrases of
  adjacent characters (bigrams), which match anywhere inside a run.
- `trigram`: substrings of three characters; a term shorter than three characters can
  never match, so such terms are dropped from the query.

Both index `textnorm.normalize(text)` (NFKC, joined hyphenation, folded case, one space),
so ligatures, line breaks and curly quotes do not split or hide words.

User text never reaches FTS5 as syntax: a query is rebuilt from word characters only,
each term double-quoted (a string, never an operator, column filter or prefix), and the
terms OR-ed so bm25 ranks passages by how many of them they hold.
"""

from __future__ import annotations

import re

from .textnorm import normalize

TOKENIZERS = ("unicode61", "trigram")
# bm25 column weight of a passage's section titles against its text (measured in
# bench/retrieval_eval.py); the store and the in-memory indexes rank with it alike.
TITLE_WEIGHT = 2.0

_CJK_CHARS = (
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
    "\U00020000-\U0002ebef"
)
_CJK = re.compile(f"[{_CJK_CHARS}]")
# A query term: a run of CJK characters, or a run of other word characters.
_TERM = re.compile(f"[{_CJK_CHARS}]+|[^\\W_{_CJK_CHARS}]+")

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves shall may must also any upon within without hereby herein
    thereof therein whether e g ie eg etc s t
    """.split()
)
# Function characters that make a Chinese bigram useless as evidence on their own.
_CJK_STOP = frozenset("的了是在和与或及其之也而就都这那些个么什吗呢吧")

MAX_TERMS = 64


def index_text(text: str, tokenizer: str) -> str:
    """The text stored in the FTS index of `tokenizer` for a passage."""
    norm = normalize(text)
    if tokenizer == "unicode61":
        return _CJK.sub(lambda m: f" {m.group(0)} ", norm)
    if tokenizer == "trigram":
        return norm
    raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {TOKENIZERS}")


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def query_terms(query: str, tokenizer: str) -> list[str]:
    """The FTS5 phrases (unquoted) a question searches for, distinct, in order."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {TOKENIZERS}")
    terms: list[str] = []
    for run in _TERM.findall(normalize(query)):
        if _CJK.match(run):
            n = 2 if tokenizer == "unicode61" else 3
            grams = [run[i : i + n] for i in range(max(1, len(run) - n + 1))]
            for g in grams:
                if len(g) < n and tokenizer == "trigram":
                    continue
                if all(c in _CJK_STOP for c in g):
                    continue
                terms.append(" ".join(g) if tokenizer == "unicode61" else g)
        else:
            if run in STOPWORDS:
                continue
            if len(run) == 1 and not run.isdigit():
                continue
            if tokenizer == "trigram" and len(run) < 3:
                continue
            terms.append(run)
    return list(dict.fromkeys(terms))[:MAX_TERMS]


def build_match(query: str, tokenizer: str = "unicode61") -> str | None:
    """A safe FTS5 MATCH expression for a free-text question, or None when nothing in it
    is searchable (only stopwords, punctuation, or terms too short for trigrams)."""
    terms = query_terms(query, tokenizer)
    if not terms:
        return None
    return " OR ".join(_quote(t) for t in terms)


def build_phrase(text: str, tokenizer: str = "unicode61", max_words: int = 12) -> str | None:
    """An exact-phrase MATCH for a quoted passage: its first `max_words` words in order
    (stopwords kept, since a phrase needs them). None when the text has no words."""
    norm = normalize(text)
    if tokenizer == "unicode61":
        words = _TERM.findall(norm)
        tokens: list[str] = []
        for w in words:
            tokens.extend(list(w) if _CJK.match(w) else [w])
        tokens = tokens[:max_words]
        return _quote(" ".join(tokens)) if tokens else None
    if tokenizer == "trigram":
        # Trigram phrases match raw substrings: keep the normalised text itself, cut at a
        # word boundary.
        words = norm.split(" ")[:max_words]
        phrase = " ".join(words)
        return _quote(phrase) if len(phrase) >= 3 else None
    raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {TOKENIZERS}")
