"""Conflicts between two clauses of one document, found by rules over their sentences.

A review checklist's `compare: [a, b]` item hands this module the passages cited for item
`a` and item `b` on the same document. Each side's passages are widened to whole
sentences, each sentence is read for a few facts (durations with the role they play,
"exclusive"/"non-exclusive", a lock-in of the term, a right to terminate for convenience,
perpetual ownership or trade-secret status), and the rules below compare the facts of
one side with those of the other. Every finding cites one sentence on each side, both
verified against the document text.

What the rules catch, and what they do not:
- `exclusivity`: one side grants or describes a right as non-exclusive while the other
  calls a right exclusive. Lexical: it does not know whether both words speak of the same
  right ("exclusive remedy", "exclusive jurisdiction" and "exclusive of" are ignored).
- `durations_disagree`: the same kind of period (notice of non-renewal, notice to
  terminate for convenience, cure, survival, payment, warranty, term, renewal) has
  different lengths in the two clauses. The kind is the nearest keyword before the number
  in its sentence, so a sentence that names two periods in an unusual order can be misread.
- `survival_shorter`: confidentiality survives termination for a fixed time, while the
  other clause protects the information longer (a longer confidentiality period) or
  without end (trade secrets, perpetual ownership, "right, title and interest").
- `notice_exceeds_period`: a notice period is at least as long as the term or renewal
  period it would end, so the notice can never be given in time.
- `lock_in_vs_convenience`: one clause says the agreement may not be terminated (during
  the term, or is non-cancellable) and the other lets a party terminate for convenience.
Anything that needs reading the clauses' meaning beyond these facts (an exception that
removes the conflict, two clauses about different products) is left to the model's
judgement or the reviewer; the rules flag, the citations let a person check quickly.

Across documents (`detect_cross_conflicts`, for answers over several documents) the
sentences are read for keyed facts and two documents disagree where the same key has
values in one that the other never states:
- `governing_law`: the place whose laws govern ("laws of the State of New York");
- `durations_disagree`: a period of the same kind (as above, plus a notice period: "sixty
  (60) days' written notice", a termination notice when the sentence speaks of
  terminating);
- `amounts_disagree`: a sum of money for the same item — the defined term in parentheses
  right after it (`(the "Fee")`), else the words ending in an item noun just before it
  ("annual license fee of $120,000"); amounts per different periods are not compared;
- `dates_disagree`: a date for the same defined item (`(the "Effective Date")`, "Closing
  Date"). Two agreements may rightly have different effective dates: the flag says that
  they differ, the reviewer decides whether it matters.
Keys are lexical: "license fee" and "license fees" meet; "licence fee", "fee" and "annual
charge" do not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from pydantic import BaseModel, ConfigDict

from .citations import Citation, find_quote, relocate
from ..document import Document
from ..fulltext import STOPWORDS
from ..ingest.anchors import find_dates, find_durations

# A period in days, from its ISO 8601 duration (`anchors.find_durations`): a month counts
# 30 days, a year 365.
_UNIT_DAYS = {"D": 1, "W": 7, "M": 30, "Y": 365}
# A period's kind: the nearest of these before the number, within its sentence.
_ROLES: list[tuple[str, re.Pattern]] = [
    ("survival", re.compile(r"surviv", re.I)),
    ("non-renewal notice", re.compile(r"non-?renewal|not to renew|elect not to extend", re.I)),
    ("notice to terminate for convenience", re.compile(r"for convenience|without cause|for any reason", re.I)),
    ("cure period", re.compile(r"\bcure", re.I)),
    ("payment period", re.compile(r"\bpa(?:y|id|yable|yment)\b|\binvoice", re.I)),
    ("warranty period", re.compile(r"warrant", re.I)),
    ("renewal period", re.compile(r"renew|extension|extend", re.I)),
    ("term", re.compile(r"\bterm\b|\bexpire", re.I)),
    ("confidentiality period", re.compile(r"confidential", re.I)),
]
_NON_EXCLUSIVE = re.compile(r"\bnon[-\s]?exclusive(?:ly)?\b", re.I)
_EXCLUSIVE = re.compile(
    r"(?<![-\w])(?<!non )exclusive(?:ly)?\b(?!\s+(?:of|remed|jurisdiction|venue|forum))", re.I
)
_LOCK_IN = re.compile(
    r"\b(?:may|shall|will|can)\s+not\s+(?:be\s+)?terminat\w*|\bnon-?cancell?able\b|"
    r"\bnot\s+(?:be\s+)?terminable\b|\bno\s+right\s+to\s+terminate\b",
    re.I,
)
_CONVENIENCE = re.compile(
    r"\bterminat\w*\b[^.;]{0,120}?\b(?:for convenience|without cause|for any reason|at any time)\b|"
    r"\b(?:for convenience|without cause)\b[^.;]{0,60}?\bterminat\w*",
    re.I,
)
_PERPETUAL = re.compile(
    r"\bperpetu\w*|\bin perpetuity\b|\btrade secrets?\b|\bright,? title,? and interest\b|"
    r"\bshall (?:solely |exclusively )?own\b|\bremain the (?:sole |exclusive )?property\b",
    re.I,
)
# "sixty (60) days' prior written notice": the period is a notice, whatever came before.
_NOTICE_AFTER = re.compile(r"^['’]?s?\s*(?:prior\s+|advance\s+)?(?:written\s+)?notice\b", re.I)
_NOTICE_ROLES = ("non-renewal notice", "notice to terminate for convenience")
MIN_SENTENCE_CHARS = 25
_HEADING = re.compile(r"^(?:[\dIVXA-Z]+(?:\.\d+)*\.?\s+)?(?:[A-Z][\w'-]*(?:\s+(?:of|for|and|the|to|in|on|or))*\s+){0,6}[A-Z][\w'-]*\.$")
_SENTENCE_END = re.compile(r"(?<=[.;!?])[\"”')]*\s+(?=[\"“(]?[A-Z0-9])|\n\s*\n")


class Finding(BaseModel):
    """One conflict: a line of text and the sentence it rests on in each clause."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    text: str  # "[CONFLICT: a vs b] ..."
    a: Citation
    b: Citation


@dataclass(frozen=True)
class Duration:
    days: int
    text: str
    role: str | None


@dataclass(frozen=True)
class Fact:
    kind: str  # "governing law", "duration", "amount", "date"
    item: str  # what the value is of ("license fee", a duration's role); "" for governing law
    value: str  # normalised, compared across documents
    text: str  # as written


_GOV_LAW = re.compile(
    r"(?i:\b(?:govern\w*|constru\w*|interpret\w*|enforced)\b)[^.;]{0,150}?(?i:\blaws?\s+of\s+)"
    r"(?:the\s+)?(?:(?i:state|commonwealth|province|republic|kingdom)\s+of\s+)?"
    r"(?P<place>[A-Z][\w.'-]*(?:\s+(?:and\s+|of\s+)?[A-Z][\w.'-]*){0,3})"
)


def _governing_law(text: str) -> list[str]:
    return list(dict.fromkeys(" ".join(m["place"].rstrip(".").split()) for m in _GOV_LAW.finditer(text)))


_MONEY = re.compile(
    r"(?P<cur>US\$|USD|EUR|GBP|\$|€|£)\s?(?P<num>\d+(?:,\d{3})*(?:\.\d+)?)(?:\s?(?P<mult>million|billion|thousand))?|"
    r"\b(?P<num2>\d+(?:,\d{3})*(?:\.\d+)?)\s?(?P<mult2>million|billion|thousand)?\s?(?P<cur2>dollars|euros|pounds|USD|EUR|GBP)\b",
    re.I,
)
_CURRENCY = {"us$": "USD", "$": "USD", "usd": "USD", "dollars": "USD", "€": "EUR", "eur": "EUR", "euros": "EUR",
             "£": "GBP", "gbp": "GBP", "pounds": "GBP"}
_MULT = {"thousand": 1e3, "million": 1e6, "billion": 1e9}
_PER = re.compile(r"^\s*(?:per|each|a|every)\s+(?:calendar\s+)?(month|year|annum|quarter|week|day|hour|unit)\b", re.I)
_MONEY_ITEM = re.compile(
    r"\b(fee|price|amount|payment|cap|deposit|royalty|royalties|rent|charge|sum|commitment|limit|compensation|"
    r"consideration|premium|penalty|damages|budget|cost|salary|bonus)s?\b", re.I)
_DATE_ITEM = re.compile(r"\b(date|deadline)s?\b", re.I)
# `(the "Effective Date")` right after a value names what it is.
_DEFINED_AFTER = re.compile(r"^\s*,?\s*\(\s*(?:the\s+|each,?\s+an?\s+|an?\s+)?[\"“']([^\"”']{2,40})[\"”']\s*\)", re.I)
_ITEM_WORDS = re.compile(r"[A-Za-z][\w-]*")


def _item_before(text: str, end: int, head: re.Pattern, reach: int = 80) -> str | None:
    """The item a value belongs to: the last `head` noun within `reach` characters before
    `end`, with up to two words before it that are not function words ("annual license
    fee", "Closing Date")."""
    window = text[max(0, end - reach) : end]
    hits = list(head.finditer(window))
    if not hits:
        return None
    h = hits[-1]
    words = [h.group(1).lower()]
    for w in reversed(_ITEM_WORDS.findall(window[: h.start()])[-2:]):
        if w.lower() in STOPWORDS or w[0].isdigit():
            break
        words.insert(0, w.lower())
    return " ".join(words)


def _defined_after(text: str, pos: int) -> str | None:
    m = _DEFINED_AFTER.match(text[pos:])
    return " ".join(m.group(1).lower().split()) if m else None


def _amounts(text: str) -> list[Fact]:
    out = []
    for m in _MONEY.finditer(text):
        num = float((m["num"] or m["num2"]).replace(",", "")) * _MULT.get((m["mult"] or m["mult2"] or "").lower(), 1)
        cur = _CURRENCY[(m["cur"] or m["cur2"]).lower()]
        item = _defined_after(text, m.end()) or _item_before(text, m.start(), _MONEY_ITEM)
        if not item:
            continue  # an amount of nothing named cannot be matched with another document's
        per = _PER.match(text[m.end():])
        unit = {"annum": "year"}.get(per.group(1).lower(), per.group(1).lower()) if per else ""
        if unit:
            item += f" per {unit}"
        out.append(Fact("amount", item, f"{cur} {num:.2f}", m.group().strip()))
    return out


def _dates(text: str) -> list[Fact]:
    out = []
    for start, end, written, iso in find_dates(text):
        if len(iso) != 10:  # a month ("December 2021") is not the date of anything
            continue
        item = _defined_after(text, end) or _item_before(text, start, _DATE_ITEM, reach=60)
        if item:
            out.append(Fact("date", item, iso, written.strip()))
    return out


@dataclass(frozen=True)
class Sentence:
    start: int
    end: int
    text: str

    def durations(self) -> list[Duration]:
        out = []
        for start, end, written, iso in find_durations(self.text):
            n, unit = int(iso[1:-1]), iso[-1]
            if not n:
                continue
            before = self.text[:start]
            role, best = None, -1
            for name, pat in _ROLES:
                for r in pat.finditer(before):
                    if r.end() > best:
                        role, best = name, r.end()
            if role not in _NOTICE_ROLES and _NOTICE_AFTER.match(self.text[end:]):
                role = "termination notice" if re.search(r"terminat", before, re.I) else "notice period"
            out.append(Duration(n * _UNIT_DAYS[unit], written.strip(), role))
        return out

    def facts(self) -> list[Fact]:
        """The keyed facts two documents can disagree on."""
        out = [Fact("governing law", "", v.lower(), v) for v in _governing_law(self.text)]
        out += [Fact("duration", d.role, str(d.days), d.text) for d in self.durations() if d.role]
        out += _amounts(self.text) + _dates(self.text)
        return out


def sentences(doc: Document, spans: Sequence[tuple[int, int]]) -> list[Sentence]:
    """The whole sentences (within one page) that overlap any of the char spans."""
    seen: dict[tuple[int, int], Sentence] = {}
    for lo, hi in spans:
        page = doc.page(doc.locate(lo).page)
        text = doc.text[page.start : page.end]
        bounds = [0]
        for m in _SENTENCE_END.finditer(text):
            piece = text[bounds[-1] : m.start() + 1].strip()
            # "1." and "3.2 Termination for Convenience." are headings, not sentences:
            # they stay with the sentence that follows (a paragraph break always ends one).
            if "\n\n" in m.group() or (len(piece) >= MIN_SENTENCE_CHARS and not _HEADING.match(piece)):
                bounds.append(m.end())
        bounds.append(len(text))
        for a, b in zip(bounds, bounds[1:]):
            s, e = page.start + a, page.start + b
            if s < hi and e > lo:
                raw = doc.text[s:e]
                s += len(raw) - len(raw.lstrip())
                e -= len(raw) - len(raw.rstrip())
                if e > s:
                    seen.setdefault((s, e), Sentence(s, e, " ".join(doc.text[s:e].split())))
    return sorted(seen.values(), key=lambda x: x.start)


def cite_sentence(doc: Document, s: Sentence) -> Citation:
    """A verified citation of the lines holding sentence `s`, quoting it."""
    hit = find_quote(doc, s.text, s.start, s.end)
    if hit is None:  # a sentence is its own text; only normalisation could lose it
        hit = (s.start, s.end)
    return relocate(doc, hit, quote=s.text).model_copy(update={"relocated": False})


def _days(d: int) -> str:
    if d % 365 == 0:
        return f"{d // 365} year(s)"
    if d % 30 == 0:
        return f"{d // 30} month(s)"
    return f"{d} day(s)"


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def detect_conflicts(
    doc: Document,
    a_id: str,
    a_spans: Sequence[tuple[int, int]],
    b_id: str,
    b_spans: Sequence[tuple[int, int]],
) -> list[Finding]:
    """Rule-based conflicts between the clauses cited for item `a_id` and item `b_id`.

    `*_spans` are char spans of `doc.text` (the passages each item's answer cites)."""
    side_a, side_b = sentences(doc, a_spans), sentences(doc, b_spans)
    tag = f"[CONFLICT: {a_id} vs {b_id}]"
    found: dict[tuple, Finding] = {}

    def add(rule: str, sa: Sentence, sb: Sentence, why: str) -> None:
        if (sa.start, sa.end) == (sb.start, sb.end):
            return  # one sentence cannot disagree with itself
        key = (rule, sa.start, sb.start)
        if key not in found:
            found[key] = Finding(rule=rule, text=f"{tag} {why}", a=cite_sentence(doc, sa),
                                 b=cite_sentence(doc, sb))

    for sa in side_a:
        for sb in side_b:
            for x, y, flip in ((sa, sb, False), (sb, sa, True)):
                ids = (b_id, a_id) if flip else (a_id, b_id)
                first, second = (y, x) if flip else (x, y)
                if _NON_EXCLUSIVE.search(x.text) and _EXCLUSIVE.search(_NON_EXCLUSIVE.sub(" ", y.text)):
                    add("exclusivity", first, second,
                        f"{ids[0]} describes a non-exclusive right, {ids[1]} an exclusive one: "
                        f"\"{_short(x.text)}\" / \"{_short(y.text)}\"")
                if _LOCK_IN.search(x.text) and _CONVENIENCE.search(y.text) and not _LOCK_IN.search(y.text):
                    add("lock_in_vs_convenience", first, second,
                        f"{ids[0]} says the agreement may not be terminated, {ids[1]} allows "
                        f"termination for convenience: \"{_short(x.text)}\" / \"{_short(y.text)}\"")
            da, db = sa.durations(), sb.durations()
            for x in da:
                for y in db:
                    if x.role and x.role == y.role and x.days != y.days:
                        add("durations_disagree", sa, sb,
                            f"the {x.role} is {x.text} in {a_id} but {y.text} in {b_id}")
            for x_s, y_s, xd, yd, flip in ((sa, sb, da, db, False), (sb, sa, db, da, True)):
                first, second = (y_s, x_s) if flip else (x_s, y_s)
                x_id, y_id = (b_id, a_id) if flip else (a_id, b_id)
                for s in (d for d in xd if d.role == "survival"):
                    if _PERPETUAL.search(y_s.text):
                        add("survival_shorter", first, second,
                            f"{x_id} ends confidentiality {s.text} after termination, but {y_id} "
                            f"protects it without end (\"{_PERPETUAL.search(y_s.text).group()}\"): "
                            "after that the information may be disclosed")
                notices = [d for d in xd if d.role in ("non-renewal notice", "notice to terminate for convenience")]
                periods = [d for d in yd if d.role in ("term", "renewal period")]
                for n in notices:
                    for p in periods:
                        if n.days >= p.days:
                            add("notice_exceeds_period", first, second,
                                f"the {n.role} in {x_id} ({n.text}) is not shorter than the "
                                f"{p.role} in {y_id} ({p.text})")
    # A survival shorter than the confidentiality period it ends is often written inside
    # one clause, so this rule also pairs sentences of the same side.
    both = [(s, a_id) for s in side_a] + [(s, b_id) for s in side_b]
    for x_s, x_id in both:
        for s in (d for d in x_s.durations() if d.role == "survival"):
            for y_s, y_id in both:
                longer = [d for d in y_s.durations() if d.role == "confidentiality period" and d.days > s.days]
                if longer:
                    add("survival_shorter", x_s, y_s,
                        f"confidentiality in {x_id} survives termination by {s.text} only, while "
                        f"{y_id} sets a confidentiality period of {longer[0].text}")
    return list(found.values())


_CROSS_RULES = {"governing law": "governing_law", "duration": "durations_disagree", "amount": "amounts_disagree",
                "date": "dates_disagree"}


def _what(f: Fact) -> str:
    return "the governing law" if f.kind == "governing law" else f"the {f.item}"


def detect_cross_conflicts(
    docs: Mapping[str, Document],
    spans: Mapping[str, Sequence[tuple[int, int]]],
    names: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Where two documents disagree, over the char spans cited in each (`spans[doc_id]`).

    A key (kind and item) conflicts when a document states a value for it that the other
    document, stating the same key, never states: a document that names both 30 and 60
    days for a notice agrees with one that names either. Each finding cites one sentence in
    each document, both verified. `names` label the documents in the text (doc ids by
    default)."""
    names = names or {}
    facts: dict[str, list[tuple[Sentence, Fact]]] = {}
    for doc_id, sp in spans.items():
        if doc_id in docs and sp:
            facts[doc_id] = [(s, f) for s in sentences(docs[doc_id], sp) for f in s.facts()]
    found: dict[tuple, Finding] = {}
    for a_id, b_id in combinations(list(facts), 2):
        a_name, b_name = names.get(a_id, a_id), names.get(b_id, b_id)
        values = {d: {} for d in (a_id, b_id)}
        for d in (a_id, b_id):
            for _, f in facts[d]:
                values[d].setdefault((f.kind, f.item), set()).add(f.value)
        for sa, fa in facts[a_id]:
            key = (fa.kind, fa.item)
            if key not in values[b_id] or fa.value in values[b_id][key]:
                continue
            for sb, fb in facts[b_id]:
                if (fb.kind, fb.item) != key or fb.value in values[a_id][key]:
                    continue
                k = (a_id, b_id, key, fa.value, fb.value)
                if k in found:
                    continue
                found[k] = Finding(
                    rule=_CROSS_RULES[fa.kind],
                    text=f"[CONFLICT: {a_name} vs {b_name}] {_what(fa)} is {fa.text} in {a_name} but {fb.text} in {b_name}",
                    a=cite_sentence(docs[a_id], sa),
                    b=cite_sentence(docs[b_id], sb),
                )
    return list(found.values())
