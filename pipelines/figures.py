"""Figures a question asks for, and where a filing states them.

"What were the total revenues in 2022?", "How many employees at year end?", "capital
expenditures 2018": such questions name a *quantity* (revenue, net income, capex, EPS, …),
often a *period* (2022, FY2021, fiscal 2020) and sometimes a *statement* (income statement,
balance sheet, cash flow statement). Their answer is a number on a statement row or in a
sentence that names the quantity, and the words of the question are rarely the row's label
("revenue" vs "Net sales", "capex" vs "Purchases of property and equipment").

`analyze_figures()` reads that from a question; `statement_of()` says which primary statement
a page is (from its title lines); `row_matches()` says whether a line states a wanted
quantity. Retrieval (`pipelines.retrieval`) ranks statement rows and statement pages with
them, and the answer side can check that a quote holds a figure of the right kind and year.
Pure string work; nothing here knows about documents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .textnorm import normalize

Statement = str  # "income" | "balance" | "cash"


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

_YEAR = re.compile(r"(?<![\d,.$])(?:fy|fiscal(?: year)?\s*)?'?((?:19|20)\d\d)(?![\d,])")
_FY_SHORT = re.compile(r"\bfy\s?'?(\d\d)\b")
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
    """Fiscal years named in a question: "2022", "FY2022", "fiscal 2021", "FY22"."""
    norm = text.lower()
    out = [int(y) for y in _YEAR.findall(norm)]
    out += [2000 + int(y) for y in _FY_SHORT.findall(norm)]
    return tuple(dict.fromkeys(out))


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
