"""Anchor tags: rule-based marks on a document's text that retrieval, review and the UI
use as handles (SPEC §1): entities, defined terms, clause references, logical connectives,
topics and paper metadata.

The rules aim to be accurate rather than broad: an anchor that is there is right, and a
missed one costs less than a wrong one. Every anchor carries its exact char span, the
page/line of its start (`Document.locate`) and the section it lies in.

Values (`Anchor.value`) are normalised:
- DATE -> ISO 8601 ("2017-05-31"; "2017-05" when the day is not given);
- MONEY -> "<ISO currency> <amount>" with the multiplier applied ("USD 5000000");
- PERCENT -> "50%"; DURATION -> ISO 8601 ("P30D", "P5Y", "P6M", "P2W");
- ORG -> the organisation's name with its whitespace collapsed; a defined short name
  ("IBM") gets the full name it stands for;
- DEFINITION -> the term, `textnorm.normalize`d (casefolded);
- CLAUSE -> the reference in canonical form ("Section 8.3", "Article 7", "Exhibit B",
  "第143条"), with `target_section_id` set when the document has that section;
- LOGIC -> the connective in lower case; TOPIC -> the term; PAPER -> title/author/year.

DEFINITION spans: `char_start`/`char_end` cover the whole defining sentence, and
`subtype` holds the span of the term itself as "term:START-END" (absolute char offsets);
`definition_term_span()` reads it back.
"""

from __future__ import annotations

import calendar
import math
import re
from bisect import bisect_right
from collections import Counter

from ..document import Anchor, Document, Section, Span
from .sections import CN_NUM, chinese_to_int, looks_like_title, section_key
from ..textnorm import normalize

__all__ = ["tag_anchors", "definition_term_span", "normalize_date", "normalize_money",
           "normalize_duration", "words_to_int"]


def definition_term_span(anchor: Anchor) -> tuple[int, int] | None:
    """The char span of the defined term inside a DEFINITION anchor's sentence."""
    m = re.fullmatch(r"term:(\d+)-(\d+)", anchor.subtype or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


# ---------------------------------------------------------------------------------------
# Number words

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NUMBER_WORD = (r"(?:(?:" + "|".join(sorted(list(_UNITS) + list(_TENS) + list(_SCALES),
                                            key=len, reverse=True))
                + r")\b(?:[\s-]+(?:and[\s-]+)?)?)+")


def words_to_int(text: str) -> int | None:
    """'thirty' -> 30, 'one hundred twenty-five' -> 125, 'a' -> 1, '45' -> 45."""
    text = text.strip().lower().replace(",", "")
    if text.isdigit():
        return int(text)
    total, current, seen = 0, 0, False
    for w in re.split(r"[\s-]+", text):
        if w in ("and", ""):
            continue
        if w == "a":
            current, seen = max(current, 1), True
        elif w in _UNITS:
            current += _UNITS[w]
            seen = True
        elif w in _TENS:
            current += _TENS[w]
            seen = True
        elif w == "hundred":
            current = max(current, 1) * 100
            seen = True
        elif w in _SCALES:
            total += max(current, 1) * _SCALES[w]
            current, seen = 0, True
        else:
            return None
    return total + current if seen else None


# ---------------------------------------------------------------------------------------
# Dates

_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
_MONTHS.update({m.lower(): i for i, m in enumerate(calendar.month_abbr) if m})
_MONTHS["sept"] = 9
_MONTH_RE = (r"(?:January|February|March|April|May|June|July|August|September|October|"
             r"November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?")


def _iso(y: int, m: int, d: int | None) -> str | None:
    if not (1000 <= y <= 2999 and 1 <= m <= 12):
        return None
    if d is None:
        return f"{y:04d}-{m:02d}"
    if not 1 <= d <= calendar.monthrange(y, m)[1]:
        return None
    return f"{y:04d}-{m:02d}-{d:02d}"


_DATE_PATTERNS = [
    # May 31, 2017 / May 31 2017 / Nov. 20, 2023
    (re.compile(rf"\b({_MONTH_RE})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b"),
     lambda m: (int(m.group(3)), _MONTHS[m.group(1).rstrip(".").lower()], int(m.group(2)))),
    # 31 May 2017 / 1st day of June, 1998
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+day\s+of)?\s+({_MONTH_RE}),?\s+(\d{{4}})\b"),
     lambda m: (int(m.group(3)), _MONTHS[m.group(2).rstrip(".").lower()], int(m.group(1)))),
    # 2017-05-31
    (re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b"),
     lambda m: (int(m.group(1)), int(m.group(2)), int(m.group(3)))),
    # 05/31/2017 (US order: the corpus is US contracts)
    (re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b"),
     lambda m: (int(m.group(3)), int(m.group(1)), int(m.group(2)))),
    # 2020年5月28日 / 2021 年 1 月 1 日 / 二〇二〇年五月二十八日
    (re.compile(r"([\d〇零一二三四五六七八九]{4})\s*年\s*([\d十一二三四五六七八九]{1,3})\s*月"
                r"\s*([\d十一二三四五六七八九]{1,3})\s*日"),
     lambda m: (chinese_to_int(m.group(1)), chinese_to_int(m.group(2)),
                chinese_to_int(m.group(3)))),
    # December 2021 (month and year only)
    (re.compile(rf"\b({_MONTH_RE})\s+(\d{{4}})\b"),
     lambda m: (int(m.group(2)), _MONTHS[m.group(1).rstrip(".").lower()], None)),
]


def normalize_date(text: str) -> str | None:
    """'May 31, 2017' / '31 May 2017' / '2017-05-31' / '2020年5月28日' -> ISO 8601."""
    for rx, parts in _DATE_PATTERNS:
        m = rx.fullmatch(text.strip())
        if m:
            y, mo, d = parts(m)
            if y is None or mo is None:
                return None
            return _iso(y, mo, d)
    return None


# A character each of `_DATE_PATTERNS` needs: a pattern's pass is skipped without it.
_DATE_KEYS = ["", "", "-", "/", "年", ""]


def find_dates(text: str) -> list[tuple[int, int, str, str]]:
    """Every date the patterns read in `text`: (start, end, as written, ISO 8601), pattern by
    pattern (a caller resolves overlaps). Tagging and the conflict rules read dates here."""
    out = []
    for (rx, _), key in zip(_DATE_PATTERNS, _DATE_KEYS):
        if key not in text:
            continue
        for m in rx.finditer(text):
            v = normalize_date(m.group(0))
            if v:
                out.append((m.start(), m.end(), m.group(0), v))
    return out


# ---------------------------------------------------------------------------------------
# Money, percentages, durations

_CURRENCY = {"$": "USD", "us$": "USD", "u.s.$": "USD", "usd": "USD", "€": "EUR", "eur": "EUR",
             "£": "GBP", "gbp": "GBP", "¥": "JPY", "jpy": "JPY", "rmb": "CNY", "cny": "CNY",
             "chf": "CHF", "cad": "CAD", "c$": "CAD", "a$": "AUD", "aud": "AUD"}
_MONEY_RE = re.compile(
    r"(?<![\w$])(US\$|U\.S\.\s?\$|C\$|A\$|\$|€|£|¥|(?:USD|EUR|GBP|JPY|CNY|RMB|CHF|CAD|AUD)\s?)"
    r"\s?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:\s*(million|billion|thousand|[MBK]n?)\b)?"
)
_MONEY_WORDS_RE = re.compile(
    r"\b(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s*(million|billion|thousand)?\s*"
    r"(U\.S\.\s+dollars|US\s+dollars|dollars|euros|pounds sterling|yen)\b", re.I)
_CN_MONEY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(万|亿)?\s*元")
_MULT = {"thousand": 10**3, "k": 10**3, "million": 10**6, "m": 10**6, "mn": 10**6,
         "billion": 10**9, "b": 10**9, "bn": 10**9, "万": 10**4, "亿": 10**8}


def _amount(digits: str, frac: str | None, mult: str | None) -> str:
    value = int(digits.replace(",", ""))
    scale = _MULT.get((mult or "").lower(), 1)
    if frac:
        # exact decimal arithmetic: "1.5 million" must not become 1499999.9999
        cents = frac[1:]
        whole = value * scale + int(cents) * scale // 10 ** len(cents)
        rest = int(cents) * scale % 10 ** len(cents)
        if rest == 0:
            return str(whole)
        return f"{whole}.{str(rest).rjust(len(cents), '0').rstrip('0')}"
    return str(value * scale)


def normalize_money(text: str) -> str | None:
    """'$1,000,000' -> 'USD 1000000'; 'US$5 million' -> 'USD 5000000'."""
    m = _MONEY_RE.fullmatch(text.strip())
    if m:
        cur = _CURRENCY[re.sub(r"\s", "", m.group(1)).lower()]
        return f"{cur} {_amount(m.group(2), m.group(3), m.group(4))}"
    m = _MONEY_WORDS_RE.fullmatch(text.strip())
    if m:
        unit = m.group(4).lower()
        cur = "EUR" if "euro" in unit else "GBP" if "pound" in unit else (
            "JPY" if unit == "yen" else "USD")
        return f"{cur} {_amount(m.group(1), m.group(2), m.group(3))}"
    m = _CN_MONEY_RE.fullmatch(text.strip())
    if m:
        n, _, frac = m.group(1).partition(".")
        return f"CNY {_amount(n, '.' + frac if frac else None, m.group(2))}"
    return None


_DUR_UNIT = {"day": "D", "days": "D", "business day": "D", "business days": "D",
             "calendar day": "D", "calendar days": "D", "week": "W", "weeks": "W",
             "month": "M", "months": "M", "year": "Y", "years": "Y",
             "日": "D", "天": "D", "周": "W", "个月": "M", "月": "M", "年": "Y"}
_DURATION_RE = re.compile(
    r"\b(?:(" + _NUMBER_WORD + r")\s*\((\d{1,4})\)|(\d{1,4})|(" + _NUMBER_WORD + r"))"
    r"[\s-]*((?:business|calendar)\s+)?(days?|weeks?|months?|years?)\b",
    re.I,
)
# Scanning for number words at every word is slow; units are rare, so find them first and
# read the number backwards from there.
_DUR_UNIT_RE = re.compile(r"\b(?:(?:business|calendar)\s+)?(?:days?|weeks?|months?|years?)\b",
                          re.I)
_DUR_BACK_RE = re.compile(
    r"\b(?:(" + _NUMBER_WORD + r")\s*\((\d{1,4})\)|(\d{1,4})|(" + _NUMBER_WORD + r"))"
    r"[\s-]*$", re.I)
_PCT_WORD_RE = re.compile(r"\b(?:percent|per\s+cent)\b(?!\s*\(\d)", re.I)
_PCT_BACK_RE = re.compile(r"\b(" + _NUMBER_WORD + r")\s+$", re.I)
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_CN_DURATION_RE = re.compile(
    r"(?<![第\d" + CN_NUM + r"年月])([" + CN_NUM + r"]{1,4}|\d{1,3})(个月|年|日|天|周)"
    r"(?![\d" + CN_NUM + r"]|度|龄|级|岁|以前)"
)


def normalize_duration(text: str) -> str | None:
    """'thirty (30) days' -> 'P30D'; 'five years' -> 'P5Y'; '六个月' -> 'P6M'."""
    s = text.strip()
    m = _DURATION_RE.fullmatch(s)
    if m:
        n = int(m.group(2)) if m.group(2) else (
            int(m.group(3)) if m.group(3) else words_to_int(m.group(4) or m.group(1) or ""))
        if n is None:
            return None
        return f"P{n}{_DUR_UNIT[m.group(6).lower()]}"
    m = _CN_DURATION_RE.fullmatch(s)
    if m:
        n = chinese_to_int(m.group(1))
        return f"P{n}{_DUR_UNIT[m.group(2)]}" if n is not None else None
    return None


def find_durations(text: str) -> list[tuple[int, int, str, str]]:
    """Every period in `text`: (start, end, as written, ISO 8601 such as "P30D"); zero days
    or years are not periods. Tagging and the conflict rules read durations here."""
    out = []
    for m in _DUR_UNIT_RE.finditer(text):
        b = _DUR_BACK_RE.search(text, max(0, m.start() - 60), m.start())
        if b:
            s = text[b.start():m.end()]
            v = normalize_duration(s)
            if v and v not in {"P0D", "P0Y"}:
                out.append((b.start(), m.end(), s, v))
    for m in _CN_DURATION_RE.finditer(text) if _CJK_RE.search(text) else ():
        v = normalize_duration(m.group(0))
        if v and v not in {"P0D", "P0Y"}:
            out.append((m.start(), m.end(), m.group(0), v))
    return out


_PERCENT_RE = re.compile(
    r"(?<![\w.])(\d{1,3}(?:\.\d+)?)\s?(%|percent\b|per\s+cent\b)|"
    r"百分之([" + CN_NUM + r"]{1,4})",
    re.I,
)

# ---------------------------------------------------------------------------------------
# Organisations

_SUFFIX = (r"(?:Inc\.?|Incorporated|Corporation|Corp\.?|Co\.,?\s*Ltd\.?|Company|Ltd\.?|"
           r"Limited|L\.?L\.?C\.?|L\.?L\.?P\.?|L\.P\.|plc|PLC|GmbH|AG|S\.A\.|N\.V\.|B\.V\.|"
           r"INC\.?|CORPORATION|CORP\.?|COMPANY|LTD\.?|LIMITED)")
_NAME_WORD = r"(?:[A-Z][\w&'’\-.]*|&|of|and|de|du|van)"
_ORG_RE = re.compile(
    rf"\b((?:[A-Z][\w&'’\-.]*)(?:[ \t]+{_NAME_WORD}){{0,6}}?),?[ \t]+{_SUFFIX}(?![\w])"
)
_LEAD_STOP = {"the", "to", "and", "of", "by", "between", "with", "for", "this", "that",
              "from", "among", "in", "on", "at", "as", "addendum", "agreement", "exhibit",
              "whereas", "now", "therefore", "if", "any", "each", "such", "all", "an", "a"}
_ALIAS_RE = re.compile(
    r"\(\s*(?:(?:together\s+with\s+its\s+\w+,?\s+)?(?:hereinafter\s+)?(?:referred\s+to\s+as\s+)?"
    r"(?:the\s+)?)?[“\"]([^”\"\n]{1,40})[”\"]\s*\)"
)

# ---------------------------------------------------------------------------------------
# Definitions

_MEANS = (r"(?:means|shall\s+mean|mean|has\s+the\s+meaning|have\s+the\s+meaning|shall\s+have"
          r"\s+the\s+meaning|shall\s+refer\s+to|refers\s+to|is\s+defined\s+as|includes|"
          r"shall\s+include)")
_DEF_MEANS_RE = re.compile(
    r"[“\"]([^“”\"\n]{1,80}?)[”\"]\s*(?:\([^()\n]{0,80}\)\s*)?"
    r"(?:[\w’'\-]+[ \t]+){0,4}?" + _MEANS + r"\b"
)
_DEF_PAREN_RE = re.compile(
    r"\(\s*(?:each\s+|individually\s+|collectively\s+|together\s+)?,?\s*"
    r"(?:(?:hereinafter\s+)?(?:referred\s+to\s+as\s+|called\s+)?)?"
    r"(?:(?:the|this|a|an|each|its|their)\s+)?"
    r"[“\"]([^“”\"\n]{1,80}?)[”\"]"
    r"((?:\s*(?:,|or|and|and/or)\s*(?:(?:the|a|an)\s+)?[“\"][^“”\"\n]{1,80}?[”\"])*)"
    r"\s*\)"
)
_DEF_MORE_RE = re.compile(r"[“\"]([^“”\"\n]{1,80}?)[”\"]")
_CN_DEF_RE = re.compile(r"(?:本(?:法|编|章|节|条)|民法)所称(?:的)?([^，。；\s]{1,20})，(?:是指|包括)")

# ---------------------------------------------------------------------------------------
# Clause references

_REF_NUM = (r"(?:\d{1,3}(?:\.\d{1,3})*(?:\([a-zA-Z0-9]{1,4}\))*|[IVXLC]{1,7}\b|"
            r"[A-Z](?:-\d{1,2})?\b)")
_REF_RE = re.compile(
    r"\b(Sections?|SECTIONS?|Articles?|ARTICLES?|Exhibits?|EXHIBITS?|Schedules?|SCHEDULES?|"
    r"Appendix|Appendices|APPENDIX|Attachments?|ATTACHMENTS?|Annex(?:es)?|Chapters?|Clauses?)"
    r"\s+(" + _REF_NUM + r")"
    r"((?:\s*(?:,|and|or|through|and/or|-|–)\s*(?:" + _REF_NUM + r"))*)"
    r"|(§§?)\s*(\d{1,3}(?:\.\d{1,3})*(?:\([a-z0-9]{1,4}\))*)"
)
_REF_MORE_RE = re.compile(_REF_NUM)
# "Section 101 of the Bankruptcy Code" or "Section 2 of [RFC7235]" points outside the
# document; "Section 8.3 of the Agreement" or "of Attachment 1" does not.
_EXTERNAL_RE = re.compile(
    r"^\s*(?:of|under)\s+(?:the\s+)?(?!(?:Base\s+|Franchise\s+|Outsourcing\s+)?Agreement\b|"
    r"Attachment|Exhibit|Schedule|Appendix|Annex|Supplement|Statement|SOW\b|Amendment|"
    r"Addendum|Contract\b)[A-Z\[]")
_CN_REF_RE = re.compile(
    r"(本法|本编|本章|本条)?第([" + CN_NUM + r"]{1,8}|\d{1,4}(?:\.\d{1,3})*)条"
    r"(?:第([" + CN_NUM + r"]{1,3})款)?"
)

# ---------------------------------------------------------------------------------------
# Logic connectives

_LOGIC_EN = {
    "therefore": "consequence", "thus": "consequence", "accordingly": "consequence",
    "consequently": "consequence", "hence": "consequence",
    "however": "contrast", "notwithstanding": "override", "nevertheless": "contrast",
    "subject to": "condition", "provided that": "condition", "provided, however": "condition",
    "in the event that": "condition", "in the event of": "condition", "unless": "condition",
    "if and only if": "condition",
    "pursuant to": "reference", "in accordance with": "reference",
    "except as": "exception", "except for": "exception", "other than": "exception",
}
_LOGIC_EN_RE = re.compile(
    r"\b(" + "|".join(sorted((re.escape(k).replace(r"\ ", r"\s+") for k in _LOGIC_EN),
                             key=len, reverse=True)) + r")\b", re.I)
_LOGIC_ZH = {"因此": "consequence", "所以": "consequence", "然而": "contrast",
             "但是": "contrast", "根据": "reference", "依照": "reference", "依据": "reference",
             "除非": "condition", "如果": "condition", "不得": "prohibition"}
_LOGIC_ZH_RE = re.compile("|".join(_LOGIC_ZH) + r"|除[^，。；：\n]{1,30}?外")

# ---------------------------------------------------------------------------------------
# Topics

_STOP = set("""
a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing down during each either few for
from further had has have having he her here hers herself him himself his how i if in into is
it its itself just may me might more most must my myself no nor not now of off on once only
or other our ours ourselves out over own same shall she should so some such than that the
their theirs them themselves then there these they this those through to too under until up
upon very was we were what when where which while who whom why will with within without would
you your yours yourself yourselves hereby herein hereof hereto hereunder thereof therein
thereto thereunder whether including include includes included without limitation party
parties agreement section sections article exhibit schedule following set forth used use
provided shown one two three four five six first second new also et al see per via
""".split())
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z\-]{2,}|[\u4e00-\u9fff]+")


# ---------------------------------------------------------------------------------------


class _Ctx:
    """Offsets -> page/line/section, shared by every rule."""

    def __init__(self, doc: Document):
        self.doc = doc
        self.sections = doc.sections
        self.starts = [s.span.char_start for s in self.sections]

    def section_at(self, offset: int) -> Section | None:
        """The innermost section holding `offset`."""
        i = bisect_right(self.starts, offset) - 1
        while i >= 0:
            s = self.sections[i]
            if s.span.char_start <= offset < s.span.char_end:
                return s
            # an earlier section may still hold it if `s` was a sibling that ended
            i = self._parent_index(s)
        return None

    def _parent_index(self, s: Section) -> int:
        if s.parent_id is None:
            return -1
        return int(s.parent_id[1:]) - 1

    def anchor(self, type_, text, value, start, end, subtype=None, target=None) -> Anchor:
        loc = self.doc.locate(start)
        sec = self.section_at(start)
        return Anchor(type=type_, text=text, value=value, subtype=subtype,
                      span=Span(page=loc.page, line_start=loc.line, line_end=loc.line, char_start=start, char_end=end),
                      section_id=sec.id if sec else None, target_section_id=target)


def tag_anchors(doc: Document) -> list[Anchor]:
    """All anchors of a document (uses `doc.sections` for section ids and clause targets),
    sorted by position."""
    ctx = _Ctx(doc)
    text = doc.text
    out: list[Anchor] = []
    out += _entities(ctx, text)
    out += _definitions(ctx, text)
    out += _clauses(ctx, text)
    out += _logic(ctx, text)
    out += _topics(ctx, text)
    out += _paper(ctx, doc)
    out.sort(key=lambda a: (a.span.char_start, a.span.char_end, a.type))
    return out


# ---------------------------------------------------------------------------------------
# ENTITY


def _entities(ctx: _Ctx, text: str) -> list[Anchor]:
    found: list[tuple[int, int, str, str, str]] = []  # start, end, subtype, text, value
    # Each pattern is a full pass over the text; skip those whose key character is absent.
    low = text.lower()
    cjk = bool(_CJK_RE.search(text))
    found += [(a, b, "DATE", s, v) for a, b, s, v in find_dates(text)]
    money = [_MONEY_RE]
    if any(w in low for w in ("dollar", "euro", "pound", "yen")):
        money.append(_MONEY_WORDS_RE)
    if cjk:
        money.append(_CN_MONEY_RE)
    for rx in money:
        for m in rx.finditer(text):
            v = normalize_money(m.group(0))
            if v:
                found.append((m.start(), m.end(), "MONEY", m.group(0), v))
    has_pct = "%" in text or "百分之" in text or "per" in low
    for m in _PERCENT_RE.finditer(text) if has_pct else ():
        n = m.group(1) or chinese_to_int(m.group(3))
        if n is not None:
            found.append((m.start(), m.end(), "PERCENT", m.group(0), f"{n}%"))
    has_pct_word = "percent" in low or "per cent" in low
    for m in _PCT_WORD_RE.finditer(text) if has_pct_word else ():  # "fifty percent"
        b = _PCT_BACK_RE.search(text, max(0, m.start() - 60), m.start())
        n = words_to_int(b.group(1)) if b else None
        if n is not None:
            found.append((b.start(), m.end(), "PERCENT", text[b.start():m.end()], f"{n}%"))
    found += [(a, b, "DURATION", s, v) for a, b, s, v in find_durations(text)]
    found += _orgs(text)

    # Where two rules claim overlapping text, the longer claim wins ("May 31, 2017" over
    # "May 2017"-style partial matches; "thirty (30) days" over a bare "30").
    found.sort(key=lambda t: (t[0], -(t[1] - t[0])))
    out, last_end = [], -1
    for start, end, sub, s, v in found:
        if start < last_end:
            continue
        out.append(ctx.anchor("ENTITY", s, v, start, end, sub))
        last_end = end
    return out


def _orgs(text: str) -> list[tuple[int, int, str, str, str]]:
    found = []
    for m in _ORG_RE.finditer(text):
        name_start = m.start(1)
        words = list(re.finditer(r"\S+", m.group(1)))
        # drop leading function words and heading words: "between Array BioPharma Inc."
        k = 0
        while k < len(words) and words[k].group(0).lower().strip(",") in _LEAD_STOP:
            k += 1
        if k == len(words):
            continue
        start = name_start + words[k].start()
        name = re.sub(r"\s+", " ", text[start:m.end()]).strip()
        if len(name) < 4 or re.match(r"(?:Inc|Corp|Co|Ltd)\b", name):
            continue
        found.append((start, m.end(), "ORG", text[start:m.end()], name))
        # the short name the parties give themselves: Array BioPharma Inc. ... (“Array”)
        tail = text[m.end(): m.end() + 400]
        stop = re.search(r"[;]|\band\s+(?=[A-Z])|\.\s+[A-Z]", tail)
        window = tail[: stop.start()] if stop else tail
        a = _ALIAS_RE.search(window)
        if a and _alias_of(a.group(1), name):
            s0 = m.end() + a.start(1)
            found.append((s0, m.end() + a.end(1), "ORG", a.group(1), name))
    return found


def _alias_of(alias: str, name: str) -> bool:
    """Whether a short name can stand for `name`: one of its words ("Array"), its initials
    ("IBM"), or a capitalised abbreviation sharing its first letter ("MSL"). "(the
    “Agreement”)" after a party's name defines the document, not the party."""
    a = alias.strip()
    words = re.findall(r"[A-Za-z][\w'’\-]*", name)
    if a.lower() in {w.lower() for w in words} and a.lower() not in _SUFFIX_WORDS:
        return True
    initials = "".join(w[0] for w in words if w[0].isupper())
    if a.isupper() and a.isalpha() and 2 <= len(a) <= 6:
        return a in initials or a[0] == initials[:1]
    return False


_SUFFIX_WORDS = {"inc", "corp", "corporation", "company", "co", "ltd", "limited", "llc"}

# ---------------------------------------------------------------------------------------
# DEFINITION

_ABBREV = {"inc", "co", "ltd", "corp", "no", "nos", "mr", "ms", "mrs", "dr", "st", "e.g",
           "i.e", "etc", "vs", "u.s", "u.s.c", "sec", "art", "approx", "fig", "jr", "sr"}


def _sentence_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """The sentence around text[start:end]: from after the previous sentence end (or the
    start of a numbered clause) to the next sentence end, at most ~1500 chars each way."""
    lo = max(0, start - 1500)
    s = lo
    for m in re.finditer(r"[.!?](?=[\s\f]+[“\"(A-Z0-9])|[\n\f]\s*(?=\d{1,3}(?:\.\d{1,3})+\s)"
                         r"|\n\s*\n|[。！？]|[\n\f]", text[lo:start]):
        g = m.group(0)
        if g in ".!?" and _is_abbrev(text, lo + m.start()):
            continue
        if g in "\n\f":
            # a line break ends a heading, a contents entry or a signature block, never
            # a line of running prose
            prev = text[text.rfind("\n", 0, lo + m.start()) + 1: lo + m.start()].rstrip()
            if not prev or (any(c.islower() for c in prev) and prev[-1] not in ":"
                            and not (len(prev) <= 60 and looks_like_title(prev))):
                continue
        s = lo + m.end()
    while s < start and text[s] in " \t\n\f\u3000":
        s += 1
    hi = min(len(text), end + 1500)
    e = hi
    for m in re.finditer(r"[.!?](?=[\s\f]|$)|[。！？]|\n\s*\n", text[end:hi]):
        if m.group(0) in ".!?" and _is_abbrev(text, end + m.start()):
            continue
        e = end + m.end()
        if m.group(0).strip() == "":
            e = end + m.start()
        break
    return s, e


def _is_abbrev(text: str, dot: int) -> bool:
    m = re.search(r"([A-Za-z.]+)$", text[max(0, dot - 12):dot])
    if not m:
        return False
    w = m.group(1).lower()
    return w in _ABBREV or len(w) == 1  # "Nelson F. Liu", "U.S."


def _definitions(ctx: _Ctx, text: str) -> list[Anchor]:
    terms: dict[tuple[int, int], str] = {}
    for m in _DEF_MEANS_RE.finditer(text):
        terms[(m.start(1), m.end(1))] = m.group(1)
    for m in _DEF_PAREN_RE.finditer(text):
        terms[(m.start(1), m.end(1))] = m.group(1)
        if m.group(2):
            for q in _DEF_MORE_RE.finditer(m.group(2)):
                terms[(m.start(2) + q.start(1), m.start(2) + q.end(1))] = q.group(1)
    for m in _CN_DEF_RE.finditer(text):
        terms[(m.start(1), m.end(1))] = m.group(1)
    out = []
    for (ts, te), term in sorted(terms.items()):
        term_clean = term.strip()
        if not term_clean or len(term_clean.split()) > 8 or not term_clean[0].isalnum():
            continue
        s, e = _sentence_bounds(text, ts, te)
        out.append(ctx.anchor("DEFINITION", term, normalize(term), s, e,
                              subtype=f"term:{ts}-{te}"))
    return out


# ---------------------------------------------------------------------------------------
# CLAUSE


def _ref_key(kind: str, num: str) -> tuple | None:
    kind = kind.lower().rstrip("s")
    kind = {"appendice": "appendix", "§": "section", "§§": "section", "clause": "section",
            "annexe": "annex"}.get(kind, kind)
    base = re.sub(r"\(.*$", "", num)  # "4.4(c)(ii)" -> the section 4.4
    if kind == "section":
        return section_key(base) if re.fullmatch(r"\d+(\.\d+)*", base) else None
    if kind in {"article", "chapter"}:
        return section_key(f"{kind} {base}")
    if base and kind in {"exhibit", "schedule", "appendix", "attachment", "annex"}:
        return section_key(f"{kind} {num}")
    return None


def _canonical(kind: str, num: str) -> str:
    kind = kind.lower().rstrip("s")
    kind = {"appendice": "appendix", "§": "section", "§§": "section", "annexe": "annex"}.get(
        kind, kind)
    return f"{kind.capitalize()} {num}"


class _Resolver:
    """Section keys -> sections, with the fallbacks a reader would make: 'Article 7' may be
    numbered '7' in the document, and 'Section 13' may be 'ARTICLE XIII'."""

    def __init__(self, sections: list[Section]):
        self.by_key: dict[tuple, list[Section]] = {}
        self.top: dict[str, str] = {}
        by_id = {s.id: s for s in sections}
        for s in sections:
            k = section_key(s.number)
            if k is not None:
                self.by_key.setdefault(k, []).append(s)
            root = s
            while root.parent_id is not None:
                root = by_id[root.parent_id]
            self.top[s.id] = root.id

    def resolve(self, key: tuple | None, where: Section | None) -> Section | None:
        if key is None:
            return None
        options = self.by_key.get(key)
        if not options:
            kind, v = key
            alt = None
            if kind in {"article", "chapter"}:
                alt = ("num", (v,))
            elif kind == "num" and len(v) == 1:
                alt = ("article", v[0]) if ("article", v[0]) in self.by_key else ("chapter", v[0])
            elif kind == "条":
                alt = ("num", (v,))
            options = self.by_key.get(alt) if alt else None
        if not options:
            return None
        if len(options) > 1 and where is not None:
            # the same number in several attachments: prefer the reference's own part
            mine = [s for s in options if self.top[s.id] == self.top[where.id]]
            if mine:
                return mine[0]
        return options[0]


def _clauses(ctx: _Ctx, text: str) -> list[Anchor]:
    resolver = _Resolver(ctx.sections)
    heading_lines = sorted((s.span.char_start, _line_end(text, s.span.char_start)) for s in ctx.sections)
    hl_starts = [a for a, _ in heading_lines]

    def in_heading(pos: int) -> bool:
        i = bisect_right(hl_starts, pos) - 1
        return i >= 0 and pos < heading_lines[i][1] and not text[heading_lines[i][0]:pos].strip()
    out = []
    for m in _REF_RE.finditer(text):
        if m.group(4):  # § 5.2
            kind, first, more = "section", m.group(5), ""
            items = [(m.start(), m.end(5), first)]
        else:
            kind, first, more = m.group(1), m.group(2), m.group(3) or ""
            if in_heading(m.start()) or (kind.isupper() and _at_line_start(text, m.start())):
                continue  # a heading (or its running header, or a contents entry)
            items = [(m.start(), m.end(2), first)]
            for q in _REF_MORE_RE.finditer(more):
                items.append((m.start(3) + q.start(), m.start(3) + q.end(), q.group(0)))
        if kind.lower().startswith("section") and not re.match(r"\d", first):
            continue
        external = bool(_EXTERNAL_RE.match(text[m.end(): m.end() + 60])) or bool(
            re.search(r"(?:U\.S\.C\.|C\.F\.R\.|\],)\s*$", text[max(0, m.start() - 12): m.start()]))
        for s0, e0, num in items:
            key = _ref_key(kind, num)
            if key is None:
                continue
            where = ctx.section_at(s0)
            target = None if external else resolver.resolve(key, where)
            out.append(ctx.anchor("CLAUSE", text[s0:e0], _canonical(kind, num), s0, e0,
                                  subtype="external" if external else None,
                                  target=target.id if target else None))
    for m in _CN_REF_RE.finditer(text):
        if in_heading(m.start()):
            continue
        n = m.group(2)
        if re.fullmatch(r"\d+(\.\d+)+", n):
            key, canon = ("num", tuple(int(p) for p in n.split("."))), f"第{n}条"
        else:
            v = chinese_to_int(n)
            if v is None:
                continue
            key, canon = ("条", v), f"第{v}条"
        where = ctx.section_at(m.start())
        target = resolver.resolve(key, where)
        out.append(ctx.anchor("CLAUSE", m.group(0), canon, m.start(), m.end(),
                              target=target.id if target else None))
    return out


def _at_line_start(text: str, pos: int) -> bool:
    ls = max(text.rfind("\n", 0, pos), text.rfind("\f", 0, pos)) + 1
    return not text[ls:pos].strip()


def _line_end(text: str, pos: int) -> int:
    ends = [i for i in (text.find("\n", pos), text.find("\f", pos)) if i >= 0]
    return min(ends) if ends else len(text)


# ---------------------------------------------------------------------------------------
# LOGIC


def _logic(ctx: _Ctx, text: str) -> list[Anchor]:
    out = []
    for m in _LOGIC_EN_RE.finditer(text):
        key = re.sub(r"\s+", " ", m.group(1).lower())
        out.append(ctx.anchor("LOGIC", m.group(1), key, m.start(), m.end(), _LOGIC_EN[key]))
    for m in _LOGIC_ZH_RE.finditer(text):
        s = m.group(0)
        if s.startswith("除") and s.endswith("外"):
            out.append(ctx.anchor("LOGIC", s, "除…外", m.start(), m.end(), "exception"))
        else:
            out.append(ctx.anchor("LOGIC", s, s, m.start(), m.end(), _LOGIC_ZH[s]))
    return out


# ---------------------------------------------------------------------------------------
# TOPIC


def _term_counts(text: str) -> Counter:
    """Words (lower case, stop words dropped) and, for Chinese, which has no spaces,
    character bigrams standing in for words."""
    counts: Counter = Counter()
    for w in _WORD_RE.findall(text.lower()):
        if w[0] >= "\u4e00":
            counts.update(w[i: i + 2] for i in range(len(w) - 1))
        else:
            w = w.strip("-")
            if len(w) >= 3 and w not in _STOP:
                counts[w] += 1
    return counts


def _topics(ctx: _Ctx, text: str, per_unit: int = 3) -> list[Anchor]:
    """Per section: the terms most frequent in its own text (children excluded) and rare
    across the other sections (tf-idf). Without sections, pages are the units."""
    units: list[tuple[str | None, list[tuple[int, int]]]] = []
    secs = ctx.sections
    if secs:
        children: dict[str, list[Section]] = {}
        for s in secs:
            if s.parent_id:
                children.setdefault(s.parent_id, []).append(s)
        for s in secs:
            spans, pos = [], s.span.char_start
            for c in children.get(s.id, []):
                spans.append((pos, c.span.char_start))
                pos = c.span.char_end
            spans.append((pos, s.span.char_end))
            units.append((s.id, [(a, b) for a, b in spans if b > a]))
    else:
        units = [(None, [(p.start, p.end)]) for p in ctx.doc.pages]
    unit_counts = []
    df: Counter = Counter()
    for _, spans in units:
        c = Counter()
        for a, b in spans:
            c.update(_term_counts(text[a:b]))
        unit_counts.append(c)
        df.update(c.keys())
    n = len(units)
    out = []
    for (sid, spans), tf in zip(units, unit_counts):
        if sum(tf.values()) < 20:
            continue
        scored = sorted(((c * math.log((n + 1) / (df[w] + 0.5)), w) for w, c in tf.items()
                         if c >= 2), reverse=True)
        for score, w in scored[:per_unit]:
            if score <= 0:
                break
            hit = _first_occurrence(text, spans, w)
            if hit:
                out.append(ctx.anchor("TOPIC", text[hit[0]:hit[1]], w, hit[0], hit[1],
                                      subtype=sid))
    return out


def _first_occurrence(text: str, spans, term: str) -> tuple[int, int] | None:
    """Where `term` (lower case) first occurs as a whole word in the spans. Plain string
    search: compiling a regex per term costs more than the whole scan."""
    latin = term[0] < "\u4e00"
    for a, b in spans:
        low = text[a:b].lower()
        i = low.find(term)
        while i >= 0:
            j = i + len(term)
            if not latin or ((i == 0 or not low[i - 1].isalpha())
                             and (j == len(low) or not low[j].isalpha())):
                return a + i, a + j
            i = low.find(term, i + 1)
    return None


# ---------------------------------------------------------------------------------------
# PAPER


def _paper(ctx: _Ctx, doc: Document) -> list[Anchor]:
    """Title, authors and year of a scientific paper, from metadata and the first page.
    Only documents whose first page reads like a paper (an "Abstract" heading) qualify."""
    if doc.type != "pdf" or not doc.pages:
        return []
    first = doc.pages[0]
    body = [ln for ln in first.lines if ln.role == "body" and ln.text.strip()]
    abstract = next((i for i, ln in enumerate(body)
                     if re.fullmatch(r"\s*abstract\.?\s*", ln.text, re.I)), None)
    if abstract is None or abstract == 0:
        return []
    out = []
    head = body[:abstract]
    meta_title = str(doc.metadata.get("title") or "").strip()
    title_lines: list = []
    if meta_title:
        for ln in head:
            if normalize(ln.text) and normalize(ln.text) in normalize(meta_title):
                title_lines.append(ln)
    if not title_lines:
        # the title is the first line(s) before the author line; skip arXiv stamps
        for ln in head:
            if re.search(r"arXiv:|^\s*\d+\s*$", ln.text):
                continue
            if _author_line(ln.text) or "@" in ln.text:
                break
            title_lines.append(ln)
            if len(title_lines) == 2:
                break
    if title_lines:
        s, e = title_lines[0].start, title_lines[-1].end
        title = meta_title or re.sub(r"\s+", " ", doc.text[s:e]).strip()
        out.append(ctx.anchor("PAPER", doc.text[s:e], title, s, e, "TITLE"))
    after = head[len(title_lines):] if title_lines and head[0] is title_lines[0] else head
    for ln in after:
        names = _author_line(ln.text)
        if not names:
            if out and len(out) > 1:
                break
            continue
        for name, a, b in names:
            out.append(ctx.anchor("PAPER", ln.text[a:b], name, ln.start + a, ln.start + b,
                                  "AUTHOR"))
    year = _paper_year(doc, first)
    if year:
        y, s, e = year
        out.append(ctx.anchor("PAPER", doc.text[s:e], y, s, e, "YEAR"))
    return out


_INSTITUTION = re.compile(r"\b(?:University|Institute|College|School|Laboratory|Lab|Labs|AI|"
                          r"Research|Inc|Corporation|Google|Meta|Microsoft|Department|Center|"
                          r"Centre|Academy|Foundation)\b")
_NAME_RE = re.compile(r"[A-Z][a-zA-Z’'\-]+(?:\s+[A-Z]\.)*(?:\s+[A-Z][a-zA-Z’'\-]+){1,2}")


def _author_line(text: str) -> list[tuple[str, int, int]]:
    """Names on an author line: 'Nelson F. Liu1∗ Kevin Lin2 ...' -> the names with spans.
    Affiliation marks (digits, ∗, †) or commas separate the names."""
    if not re.search(r"[\d∗*†‡§]|,|\band\b", text):
        return []
    parts = list(re.finditer(r"[^\d∗*†‡§,]+", text))
    names = []
    for p in parts:
        chunk = p.group(0)
        chunk_clean = re.sub(r"^\s*and\s+|\s+and\s*$", "", chunk).strip()
        if _INSTITUTION.search(chunk_clean):
            continue
        off = p.start() + chunk.find(chunk_clean)
        for m in _NAME_RE.finditer(chunk_clean):
            if m.start() == 0 and m.end() == len(chunk_clean.rstrip()):
                names.append((m.group(0), off + m.start(), off + m.end()))
    # an author line is mostly names
    covered = sum(b - a for _, a, b in names)
    return names if names and covered >= 0.6 * len(re.sub(r"[\d∗*†‡§,\s]", "", text)) else []


def _paper_year(doc: Document, first) -> tuple[str, int, int] | None:
    for ln in first.lines:
        m = re.search(r"arXiv:(\d{2})(\d{2})\.\d{4,5}", ln.text)
        if m:
            d = re.search(r"\b(19|20)\d{2}\b", ln.text[m.end():])
            if d:
                s = ln.start + m.end() + d.start()
                return d.group(0), s, s + 4
            return f"20{m.group(1)}", ln.start + m.start(), ln.start + m.end()
    for ln in first.lines[:15]:
        d = re.search(r"(?:©|\(c\)|Copyright)\s*((?:19|20)\d{2})", ln.text)
        if d:
            return d.group(1), ln.start + d.start(1), ln.start + d.end(1)
    return None
