"""Whether a verified quote *supports* an answer to the question, beside whether it is *verified*.

A verified citation says only that its words are on the lines it names (`citations.verify`).
A reader takes a shown citation as "this answers the question", so each verified citation is
also judged here, mechanically, on what it says:

- it must name the question's subject: share a word (stemmed) with the subject — the quoted
  subject ("Non-Compete"), else the question's content words — or with the words the
  thesaurus says clauses on that subject are written with; words that occur on most pages of
  the document ("American Express" in its own 10-K) name the document, not the subject, and
  do not count;
- for a numeric question ("how much / how many …", "what was X in YEAR"), it must name the
  figure asked for (the metric word and the word right before it: "restructuring costs",
  not "cost of sales"), hold a figure of the kind asked for (an amount, a percentage, a
  count, a duration), and, where the question names years, one of those years must be on
  the cited lines or on the table header of years above them.

An answer with no supporting citation is withheld ("Not found", with the evidence), and a
free-text answer to a numeric question must state a figure that a supporting quote holds.
Pure string work on the question, the quote and the cited lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from .document import Document
from .query import analyze, content_words, expand, quoted_phrases, stem
from .textnorm import normalize

FigureKind = Literal["amount", "percent", "count", "duration"]

# Prefixes that a hyphen splits off ("Non-Compete", "Post-Termination"): alone they name nothing.
_AFFIXES = frozenset({"non", "anti", "post", "pre", "co", "sub", "self", "multi", "cross"})
# Amount nouns that name no figure by themselves (stemmed): "costs", "expenses", "amount".
_GENERIC_AMOUNTS = frozenset({"cost", "expens", "amount", "spend", "payment", "fee", "paid", "pay", "value"})
# Words of a numeric question's framing ("how much has … changed"), not of its subject.
_FRAMING = frozenset({"much", "many"})

# A subject word on at least this share of a document's pages names the document (its company,
# its parties), not what was asked; documents shorter than _MIN_PAGES keep every word.
_COMMON_SHARE = 0.5
_MIN_PAGES = 8

_HOW = re.compile(r"\bhow (?:much|many)\b")
_WHAT = re.compile(r"\bwhat (?:is|was|were|are|will be)\b")
# What a figure is asked for: the metric words of filings and contracts.
_PERCENT_WORDS = re.compile(r"\b(?:rate|margin|percent(?:age)?|growth|yield|return on)\b|%")
_COUNT_WORDS = re.compile(r"\bhow many\b|\bnumber of\b|\bemployees?\b|\bheadcount\b|\bstores\b|\blocations\b")
_DURATION_WORDS = re.compile(r"\bnotice\b|\bhow (?:much|many) (?:time|days|months|years|weeks)\b")
_AMOUNT_WORDS = re.compile(
    r"\b(?:revenues?|sales|income|earnings|profits?|loss(?:es)?|ebitda|capex|capital expenditures?|expenses?|"
    r"costs?|cash|debt|assets|liabilit(?:y|ies)|equity|dividends?|eps|per share|price|fees?|amount|payments?|"
    r"royalt(?:y|ies)|spend(?:ing)?|borrowings|value|worth|paid|pay)\b")
# Questions that name a figure but ask for a thing: "what was the largest liability" is
# answered by "customer deposits".
_NOT_A_FIGURE = re.compile(r"\b(?:largest|biggest|smallest|main|primary|major|which)\b")
_YEAR = re.compile(r"\b(?:fy|fiscal(?: year)?)?\s*'?((?:19|20)\d{2}|\d{2})\b")
_QUESTION_YEAR = re.compile(r"\b(?:(?:fy|fiscal(?: year)?)\s*'?(\d{2}(?:\d{2})?)|((?:19|20)\d{2}))\b")

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_SPELLED_VALUES = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                   "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20, "thirty": 30,
                   "forty-five": 45, "forty": 40, "fifty": 50, "sixty": 60, "ninety": 90, "hundred": 100}
_SPELLED = "|".join(_SPELLED_VALUES)
_FIGURES: list[tuple[FigureKind, re.Pattern]] = [
    ("percent", re.compile(rf"({_NUMBER})\s*(?:%|percent\b|per cent\b)")),
    ("amount", re.compile(rf"[$€£¥]\s*\(?\s*({_NUMBER})|({_NUMBER})\s*(?:million|billion|thousand|mm|bn)\b"
                          rf"|\b(\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?)\b|\b(?:usd|dollars?)\s*({_NUMBER})")),
    ("duration", re.compile(rf"\b({_NUMBER}|{_SPELLED})(?:\s*\(\d+\))?[\s-]*(?:business |calendar )?"
                            rf"(?:days?|weeks?|months?|years?)\b")),
    ("count", re.compile(rf"\b({_NUMBER})\b")),
]


@dataclass(frozen=True)
class Need:
    """What a question needs from a quote for the quote to support an answer."""

    subject: frozenset[str] | None  # stems; None: no subject test (a contract's title, parties, date)
    figure: FigureKind | None = None  # None: not a numeric question
    years: frozenset[int] = frozenset()
    # The figure's name, stemmed: the metric word asked about and the word qualifying it
    # ("restructuring costs", "tax rate"); a quote of another figure ("cost of sales") does
    # not support. Empty: no metric word found, the subject test alone applies.
    metric: frozenset[str] = frozenset()

    @property
    def numeric(self) -> bool:
        return self.figure is not None


def subject_words(question: str) -> frozenset[str] | None:
    """Stems of the words that name what `question` asks about: its quoted subject ("Non-
    Compete"), else its content words, plus the words the thesaurus says clauses on that
    subject are drafted with. None where no such test applies: questions about a contract's
    title, parties or date are answered by its opening words, which need not name them."""
    q = analyze(question)
    quoted = quoted_phrases(q.text)
    subject = " ".join(quoted) if quoted else q.text
    # Judged on the subject alone: "other parties" in a description is not a question about
    # who the parties are.
    if analyze(subject).preamble:
        return None
    words = set(content_words(subject))
    for phrase in expand(normalize(subject)):
        words.update(content_words(phrase))
    return frozenset(stem(w) for w in words - _AFFIXES - _FRAMING if not _is_year(w)) or None


def _is_year(word: str) -> bool:
    return bool(re.fullmatch(r"(?:fy)?(?:19|20)\d{2}|fy\d{2}", word))


def question_years(question: str) -> frozenset[int]:
    """Years a question names: 2022, FY2022, FY22, fiscal 2022."""
    out = set()
    for m in _QUESTION_YEAR.finditer(normalize(question)):
        y = m.group(1) or m.group(2)
        if len(y) == 2:
            y = "20" + y
        if len(y) == 4:
            out.add(int(y))
    return frozenset(out)


def figure_asked(question: str) -> FigureKind | None:
    """The kind of figure a question asks for, or None when it does not ask for one.

    Numeric: "how much / how many …", and "what is/was X" where X is a metric (revenue,
    capex, a rate, a count) and the question names a year or a total — unless it asks which
    item is largest or main."""
    q = normalize(analyze(question).text)
    if _HOW.search(q):
        pass
    elif not (_WHAT.search(q) and (_AMOUNT_WORDS.search(q) or _PERCENT_WORDS.search(q) or _COUNT_WORDS.search(q))
              and (question_years(q) or re.search(r"\b(?:total|amount|quantity)\b", q))):
        return None
    if _NOT_A_FIGURE.search(q) and not _HOW.search(q):
        return None
    if _DURATION_WORDS.search(q):
        return "duration"
    if _PERCENT_WORDS.search(q):
        return "percent"
    if _COUNT_WORDS.search(q):
        return "count"
    return "amount"


def metric_words(question: str) -> frozenset[str]:
    """The first metric word of a numeric question and the content word right before it,
    stemmed: "restructuring costs", "effective tax rate" -> {tax, rate}, "total revenues"."""
    q = normalize(analyze(question).text)
    hits = [m for pat in (_AMOUNT_WORDS, _PERCENT_WORDS, _COUNT_WORDS) for m in pat.finditer(q)
            if m.group() != "%" and not m.group().startswith(("how ", "number of"))]
    if not hits:
        return frozenset()
    m = min(hits, key=lambda m: m.start())
    before = [w for w in content_words(q[:m.start()]) if w not in _FRAMING and not _is_year(w)][-1:]
    # Only a qualifier that sits right before the metric word ("…restructuring costs", not
    # "how much did X generate in cash").
    if before and not re.search(re.escape(before[0]) + r"\W{1,3}$", q[:m.start()]):
        before = []
    words = {stem(w) for w in content_words(m.group())}
    # "restructuring costs" is written "restructuring and impairment charges": where a
    # qualifier names the figure, a generic amount noun is not required beside it.
    if before:
        words = {w for w in words if w not in _GENERIC_AMOUNTS} | {stem(before[0])}
    return frozenset(words)


def need_of(question: str) -> Need:
    figure = figure_asked(question)
    return Need(subject=subject_words(question), figure=figure, years=question_years(question),
                metric=metric_words(question) if figure and figure != "duration" else frozenset())


def for_documents(need: Need, docs: Iterable[Document]) -> Need:
    """`need` with the subject and metric words that name the documents themselves dropped (a
    word on at least half the pages of each document: "American Express", "Best Buy"); the
    subject is kept whole if nothing would be left of it."""
    if not need.subject and not need.metric:
        return need
    docs = [d for d in docs if len(d.pages) >= _MIN_PAGES]
    if not docs:
        return need
    common = set(need.subject or ()) | set(need.metric)
    for doc in docs:
        pages = [normalize(doc.text[p.start:p.end]) for p in doc.pages]
        common = {w for w in common
                  if sum(bool(re.search(r"\b" + re.escape(w), t)) for t in pages) >= _COMMON_SHARE * len(pages)}
    subject = need.subject
    if subject and subject - common:
        subject = frozenset(subject - common)
    return Need(subject=subject, figure=need.figure, years=need.years, metric=frozenset(need.metric - common))


@dataclass(frozen=True)
class Figure:
    kind: FigureKind
    value: float
    text: str


def figures(text: str) -> list[Figure]:
    """Figures written in `text`, each with the most specific kind that describes it (a
    percentage is not also a count; a year alone is no figure)."""
    norm = normalize(text)
    taken: list[tuple[int, int]] = []
    out = []
    for kind, pat in _FIGURES:
        for m in pat.finditer(norm):
            if any(a < m.end() and m.start() < b for a, b in taken):
                continue
            raw = next(g for g in m.groups() if g)
            value = _value(raw)
            if value is None or (kind == "count" and _looks_like_year(raw)):
                continue
            taken.append(m.span())
            out.append(Figure(kind, value, m.group().strip()))
    return out


def _value(raw: str) -> float | None:
    if raw in _SPELLED_VALUES:
        return float(_SPELLED_VALUES[raw])
    try:
        return float(raw.replace(",", ""))
    except ValueError:
        return None


def _looks_like_year(raw: str) -> bool:
    return bool(re.fullmatch(r"(?:19|20)\d{2}", raw))


def has_figure(text: str, kind: FigureKind) -> bool:
    """A figure of `kind` in `text`; an amount may be a bare number in a statement's rows
    ("66,608" under "in millions"), a count any number that is not a year."""
    kinds = {f.kind for f in figures(text)}
    if kind == "count":
        return bool(kinds & {"count", "amount"})
    return kind in kinds


def mentions_year(text: str, years: frozenset[int]) -> bool:
    norm = normalize(text)
    for m in _YEAR.finditer(norm):
        y = m.group(1)
        if len(y) == 2:
            if not re.match(r"(?:fy|fiscal)", m.group().strip()):
                continue
            y = "20" + y
        if int(y) in years:
            return True
    return False


def header_years(lines: list[str]) -> str:
    """The nearest line above a table row that is a header of years ("2022 2021 2020"), or "":
    a statement row's figures sit under the years that head its columns."""
    for text in reversed(lines):
        years = re.findall(r"\b(?:19|20)\d{2}\b", text)
        if len(years) >= 2 and len(re.sub(r"[^a-z]", "", text.lower())) <= 3 * len(years) + 12:
            return text
    return ""


def why_not(quote: str, lines: str, need: Need) -> str | None:
    """None when `quote` (on the cited `lines`) supports an answer to the question; else the
    reason it does not, in a few words."""
    if need.subject is not None and not need.subject & {stem(w) for w in content_words(quote)}:
        return "does not mention the subject"
    if need.figure is not None:
        if need.metric and not need.metric <= {stem(w) for w in content_words(quote)}:
            return "does not name the figure asked for"
        if not has_figure(quote, need.figure):
            return f"holds no {need.figure}"
        if need.years and not mentions_year(lines, need.years):
            return "names none of the years asked"
    return None


def supports(quote: str, lines: str, need: Need) -> bool:
    return why_not(quote, lines, need) is None


def answer_figure_quoted(answer: str, quotes: Iterable[str]) -> bool:
    """Whether `answer` states a figure that one of the supporting `quotes` holds, and no figure
    that none of them holds: an answer to "how much" must carry a number taken from a verified,
    supporting quote. Figures inside the answer's own quotation marks are the quotes'; those
    outside are its claims, and each claim must be backed."""
    held = {f.value for q in quotes for f in figures(q)}
    text = re.sub(r"\[[^\]]*\]", " ", answer)
    claims = {f.value for f in figures(re.sub(r'"[^"]*"|“[^”]*”', " ", text))}
    said = {f.value for f in figures(text)}
    return bool(said & held) and claims <= held
