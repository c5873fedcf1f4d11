"""Figures a question asks for, and where a filing states them.

"What were the total revenues in 2022?", "How many employees at year end?", "capital
expenditures 2018": such questions name a *quantity* (revenue, net income, capex, EPS, …),
often a *period* (2022, FY2021, fiscal 2020) and sometimes a *statement* (income statement,
balance sheet, cash flow statement). Their answer is a number on a statement row or in a
sentence that names the quantity, and the words of the question are rarely the row's label
("revenue" vs "Net sales", "capex" vs "Purchases of property and equipment").

`analyze_figures()` reads that from a question; `statement_of()` says which primary statement
a page is (from its title lines); `row_matches()` says whether a line states a wanted
quantity. Retrieval (`pipelines.answer.retrieval`) ranks statement rows and statement pages with
them. For the answer side (`pipelines.answer.support`), `figure_asked()` and `metric_words()` say
which figure a question asks for, and `figures()`, `has_figure()`, `mentions_year()` and
`header_years()` what a quote and its lines state. This is the one place that reads figures
and years, in questions and in quotes. Pure string work; nothing here knows about documents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .query import analyze, content_words, stem
from ..textnorm import normalize

Statement = str  # "income" | "balance" | "cash"
FigureKind = Literal["amount", "percent", "count", "duration"]


@dataclass(frozen=True)
class Metric:
    name: str
    asked: tuple[str, ...]  # how a question names it (normalised words/phrases)
    labels: tuple[str, ...]  # how filings label its row or sentence
    statement: Statement | None  # the primary statement that holds it, if any


METRICS: tuple[Metric, ...] = (
    Metric("revenue", ("revenue", "revenues", "net sales", "sales", "top line", "turnover"),
           ("total revenues", "total net revenue", "total net revenues", "net revenue", "net revenues",
            "revenues", "revenue", "net sales", "total net sales"), "income"),
    Metric("net income", ("net income", "net earnings", "net profit", "net loss", "bottom line", "profit"),
           ("net income", "net earnings", "net income (loss)", "net loss"), "income"),
    Metric("operating income", ("operating income", "operating profit", "operating margin", "income from operations",
                                "ebit", "ebitda", "operating loss"),
           ("operating income", "operating profit", "income from operations", "operating income (loss)"), "income"),
    Metric("gross profit", ("gross profit", "gross margin", "gross margins", "cost of sales", "cost of goods", "cogs"),
           ("gross profit", "gross margin", "cost of sales", "cost of revenue", "total cost of revenue"), "income"),
    Metric("eps", ("eps", "earnings per share", "per share", "diluted earnings", "basic earnings"),
           ("earnings per share", "diluted earnings per share", "basic earnings per share", "net income per share",
            "diluted", "basic"), "income"),
    Metric("effective tax rate", ("effective tax rate", "tax rate", "effective rate"),
           ("effective tax rate", "effective income tax rate"), None),
    Metric("income tax", ("income tax", "income taxes", "tax expense", "tax provision", "provision for taxes"),
           ("provision for income taxes", "income tax expense", "income tax provision", "income taxes"), "income"),
    Metric("restructuring", ("restructuring",), ("restructuring charges", "restructuring and impairment charges",
                                                 "restructuring"), "income"),
    Metric("capex", ("capex", "capital expenditure", "capital expenditures", "capital spending", "capital investment",
                     "purchases of property", "property and equipment"),
           ("capital expenditures", "capital spending", "purchases of property and equipment",
            "purchase of property and equipment", "payments for property", "additions to property",
            "capital expenditure"), "cash"),
    Metric("depreciation", ("depreciation", "amortization", "d&a", "ebitda"),
           ("depreciation and amortization", "depreciation", "amortization"), "cash"),
    Metric("cash flow", ("cash flow", "cash flows", "operating activities", "investing activities",
                         "financing activities", "cash from operations", "free cash flow"),
           ("net cash provided by operating activities", "net cash provided by (used in) operating activities",
            "net cash used in investing activities", "net cash provided by (used in) investing activities",
            "net cash used for investing activities", "net cash used for financing activities",
            "net cash provided by (used in) financing activities", "net cash used in financing activities",
            "net cash provided by operating activities"), "cash"),
    Metric("dividends", ("dividend", "dividends"), ("dividends paid", "cash dividends", "dividends"), "cash"),
    Metric("working capital", ("working capital", "current assets", "current liabilities", "current ratio",
                               "quick ratio", "liquidity"),
           ("total current assets", "total current liabilities", "working capital"), "balance"),
    Metric("liabilities", ("liability", "liabilities", "total debt", "long-term debt", "borrowings"),
           ("total liabilities", "long-term debt", "customer deposits", "total current liabilities"), "balance"),
    Metric("assets", ("total assets", "assets"), ("total assets",), "balance"),
    Metric("equity", ("shareholders equity", "stockholders equity", "shareholders' equity", "book value"),
           ("total shareholders' equity", "total stockholders' equity", "total equity"), "balance"),
    Metric("cash", ("cash and cash equivalents", "cash balance", "cash on hand"),
           ("cash and cash equivalents", "total cash and cash equivalents"), "balance"),
    Metric("inventory", ("inventory", "inventories"), ("merchandise inventories", "inventories", "inventory"),
           "balance"),
    Metric("employees", ("employees", "employee", "headcount", "workforce", "staff", "team members", "people"),
           ("employees", "full-time employees", "team members", "headcount", "employed approximately",
            "colleagues"), None),
)

# The statement a question names outright.
_STATEMENT_ASKED: tuple[tuple[re.Pattern, Statement], ...] = (
    (re.compile(r"\b(income statements?|statements? of (?:income|operations|earnings)|p&l|profit and loss)\b"), "income"),
    (re.compile(r"\b(balance sheets?|statements? of financial (?:position|condition))\b"), "balance"),
    (re.compile(r"\b(cash flow statements?|statements? of cash flows?)\b"), "cash"),
)

# A primary statement's title at the top of its page. "Comprehensive income" and the
# statement of equity are other statements.
_STATEMENT_TITLE: tuple[tuple[re.Pattern, Statement], ...] = (
    (re.compile(r"^(?:consolidated )?statements? of (?:consolidated )?(?:income|operations|earnings)\b(?! and comprehensive)"
                r"|^(?:consolidated )?income statements?$"), "income"),
    (re.compile(r"^(?:consolidated )?balance sheets?\b|^(?:consolidated )?statements? of financial (?:position|condition)\b"),
     "balance"),
    (re.compile(r"^(?:consolidated )?statements? of (?:consolidated )?cash flows?\b"), "cash"),
)
_TITLE_LINES = 6  # a statement's title sits in its page's first lines
# Years in a question: "2022", "FY2022", "fiscal 2021", "FY22", "fiscal 22".
_QUESTION_YEAR = re.compile(r"\b(?:(?:fy|fiscal(?: year)?)\s*'?(\d{2}(?:\d{2})?)|((?:19|20)\d{2}))\b")

_NUMERIC_ASK = re.compile(
    r"\b(how much|how many|what (?:was|were|is|are) (?:the )?(?:total |net |amount|value|number)|amount of|"
    r"number of|how (?:large|big|high|low)|what percentage|percent|ratios?|rates?|margins?|growth|grow|"
    r"trend|change[ds]?|increase[ds]?|decrease[ds]?|improv\w*|declin\w*|fluctuat\w*|consistent|total)\b")


@dataclass(frozen=True)
class FigureQuery:
    metrics: tuple[Metric, ...] = ()
    years: tuple[int, ...] = ()
    statements: tuple[Statement, ...] = ()  # named in the question, or holding its metrics
    numeric: bool = False  # the answer is a number ("how much", "what was X in 2022")
    named_statement: bool = False  # the question names a statement ("from the cash flow statement")
    labels: tuple[str, ...] = field(default=())  # row labels to look for

    @property
    def wanted(self) -> bool:
        """Whether the question is about figures at all (gates every figure signal, so a
        contract's "revenue sharing" clause question is left to the clause signals)."""
        return bool(self.metrics) and (self.numeric or bool(self.years) or self.named_statement)


def _has(text: str, phrase: str) -> bool:
    return re.search(r"(?<![\w&])" + re.escape(phrase) + r"(?![\w&])", text) is not None


def years_in(text: str) -> tuple[int, ...]:
    """Fiscal years named in a question, in order: "2022", "FY2022", "fiscal 2021", "FY22",
    "fiscal 22"."""
    out = []
    for m in _QUESTION_YEAR.finditer(normalize(text)):
        y = m.group(1) or m.group(2)
        if len(y) == 2:
            y = "20" + y
        if len(y) == 4:
            out.append(int(y))
    return tuple(dict.fromkeys(out))


def question_years(question: str) -> frozenset[int]:
    """`years_in` as a set: the years a quote's lines must name for a numeric question."""
    return frozenset(years_in(question))


def analyze_figures(question: str) -> FigureQuery:
    norm = normalize(question)
    metrics = tuple(m for m in METRICS if any(_has(norm, a) for a in m.asked))
    named = [s for pat, s in _STATEMENT_ASKED if pat.search(norm)]
    statements = tuple(dict.fromkeys(named + [m.statement for m in metrics if m.statement]))
    labels = tuple(dict.fromkeys(lb for m in metrics for lb in m.labels))
    return FigureQuery(metrics=metrics, years=years_in(question), statements=statements,
                       numeric=bool(_NUMERIC_ASK.search(norm)), named_statement=bool(named), labels=labels)


def statement_of(lines: list[str]) -> Statement | None:
    """Which primary statement a page is, from a title among its first lines (None for
    any other page, including a table of contents that lists the statements)."""
    for text in lines[:_TITLE_LINES]:
        t = normalize(text).strip(" .:")
        if len(t) > 90:
            continue
        for pat, kind in _STATEMENT_TITLE:
            if pat.search(t):
                return kind
    return None


def row_matches(line: str, fq: FigureQuery) -> int:
    """How well a line states a wanted figure: 0 no; 1 it names the quantity and holds a
    number; 2 it also names a wanted year (a statement row "Net revenue | 2022: 86,392" or a
    sentence "capital spending of $5.2 billion in 2022")."""
    norm = normalize(line)
    if not re.search(r"\d", norm) or not any(_has(norm, lb) for lb in fq.labels):
        return 0
    numbers = [n for n in re.findall(r"\d[\d,]*(?:\.\d+)?", norm) if not re.fullmatch(r"(?:19|20)\d\d", n)]
    if not numbers:
        return 0
    return 2 if fq.years and any(str(y) in norm for y in fq.years) else 1


# ---------------------------------------------------------------------------------------
# What figure a question asks for (`figure_asked`, `metric_words`): stricter than
# `FigureQuery.numeric`, which only says a question is about figures ("how has revenue
# trended") and so wants statement pages; a question that asks for *a* figure is answered
# only by a quote that holds one of that kind.

# Amount nouns that name no figure by themselves (stemmed): "costs", "expenses", "amount".
_GENERIC_AMOUNTS = frozenset({"cost", "expens", "amount", "spend", "payment", "fee", "paid", "pay", "value"})
# Words of a numeric question's framing ("how much has … changed"), not of its subject.
FRAMING_WORDS = frozenset({"much", "many"})

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

def is_year_word(word: str) -> bool:
    """'2022', 'fy2022', 'fy22': a content word that is a year, not a subject."""
    return bool(re.fullmatch(r"(?:fy)?(?:19|20)\d{2}|fy\d{2}", word))


def figure_asked(question: str) -> FigureKind | None:
    """The kind of figure a question asks for, or None when it does not ask for one.

    Numeric: "how much / how many …", and "what is/was X" where X is a metric (revenue,
    capex, a rate, a count) and the question names a year or a total — unless it asks which
    item is largest or main."""
    q = normalize(analyze(question).text)
    if _HOW.search(q):
        pass
    elif not (_WHAT.search(q) and (_AMOUNT_WORDS.search(q) or _PERCENT_WORDS.search(q) or _COUNT_WORDS.search(q))
              and (years_in(q) or re.search(r"\b(?:total|amount|quantity)\b", q))):
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
    before = [w for w in content_words(q[:m.start()]) if w not in FRAMING_WORDS and not is_year_word(w)][-1:]
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


# ---------------------------------------------------------------------------------------
# Figures written in a quote or on cited lines

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
# A year on cited lines or a table header: "2022", "FY2022", "fiscal 22" (`mentions_year` skips
# a two-digit number without its "FY").
_TEXT_YEAR = re.compile(r"\b(?:fy|fiscal(?: year)?)?\s*'?((?:19|20)\d{2}|\d{2})\b")


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
    for m in _TEXT_YEAR.finditer(norm):
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
