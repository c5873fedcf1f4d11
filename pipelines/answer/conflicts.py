"""Conflicts between two clauses of one document, found by rules over their sentences.

A review checklist's `compare: [a, b]` item hands this module the passages cited for item
`a` and item `b` on the same document; a summary hands it all of a document's statements,
as both sides. Each side's passages are widened to whole sentences (`sentences.py`), each
sentence is read clause by clause (at its semicolons) for a few facts, and the rules compare
the facts of one side with those of the other. Every finding cites one sentence on each
side, both verified against the document text.

A finding must pair two statements about the same thing: a lawyer reads every flag, and a
flag that pairs unrelated periods or clauses costs that reading for nothing. So a fact is
read only where the words bind it, not from the nearest keyword:
- a period's role comes from the words around the number: "initial term of two (2) years"
  (term), "renew for additional periods of one (1) year" (renewal period), "ninety (90)
  days' written notice" / "at least six (6) months prior to the end of the term" (a notice:
  of non-renewal in a clause about renewing, for convenience in a clause granting that
  right), "to cure within thirty (30) days" (cure period), "for three (3) years after
  termination" (after the term: survival when the clause says so). A period in none of
  these places ("within 30 days after delivery", "for two years after the transfer") has no
  role and takes part in no rule;
- a period belongs to a subject: this Agreement, an attachment or schedule ("This Attachment
  will automatically be renewed…"), a defined period (`(the "Profiling Term")`), a named
  programme ("the term of the CDx Development Program"); a notice belongs to what it ends
  ("notice of its intent to terminate this Agreement"), a right to terminate for convenience
  to the party that holds it;
- a licence is the same licence when the same grantor grants the same grantee the same kind
  of right over the same subject matter (most of the words after "license" shared).

The rules (within one document):
- `exclusivity`: the same licence is granted exclusive in one place and non-exclusive in
  another. A licence that becomes non-exclusive on expiry or termination is not a conflict.
- `durations_disagree`: the same subject's term, renewal period, notice of non-renewal, or
  a party's notice to terminate for convenience, has different lengths in the two clauses
  (a lower bound "at least six months" and an upper one "not more than nine months" make a
  window, not a disagreement). Cure, payment and warranty periods are not compared: one
  agreement rightly sets different ones for different breaches, payments and products.
- `notice_exceeds_period`: a notice of non-renewal (or for convenience) is at least as long
  as the term or renewal period of the same subject it would end (one sentence may hold both).
- `lock_in_vs_convenience`: one clause says this Agreement may not be terminated (during the
  term, or is non-cancellable) with no exception that refers elsewhere, and another gives a
  party the right to terminate it for convenience.
- `survival_shorter`: confidentiality survives termination for a fixed time, while a clause
  protects trade secrets for as long as they remain secret (or without end), or sets a longer
  confidentiality period.
Anything that needs reading the clauses' meaning beyond these facts (an exception that
removes the conflict, an amendment that supersedes a clause) is left to the model's
judgement or the reviewer. `bench/conflicts_eval.py` scores every flag the rules raise on the
corpus contracts against hand labels (`bench/data/conflict_labels.tsv`).

Across documents (`detect_cross_conflicts`, for answers over several documents) the
sentences are read for keyed facts and two documents disagree where the same key has
values in one that the other never states:
- `governing_law`: the place whose laws govern ("laws of the State of New York");
- `durations_disagree`: a period of the same role (as above, plus any notice period:
  "sixty (60) days' written notice", a termination notice when the clause speaks of
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
from .sentences import SEMICOLON, Sentence, sentences
from ..document import Document
from ..fulltext import STOPWORDS
from ..ingest.anchors import find_dates, find_durations

# A period in days, from its ISO 8601 duration (`anchors.find_durations`): a month counts
# 30 days, a year 365.
_UNIT_DAYS = {"D": 1, "W": 7, "M": 30, "Y": 365}
_CLAUSE_END = re.compile(rf"[{SEMICOLON}]\s+")

# -- what a period is, read from the words around its number -----------------------------

_AFTER_END = re.compile(
    r"^[\s,]*(?:after|following|beyond|from)\s+(?:the\s+)?(?:\(\d\)\s*)?(?:date\s+of\s+)?(?:any\s+|such\s+|its\s+)?"
    r"(?:termination|expiration|expiry|end\s+of\s+the\s+term)", re.I)
# "during the Term and for a period of 12 months thereafter": after the term, not the term.
_DURING_TERM = re.compile(r"\b(?:during|throughout)\s+the\s+(?:\w+\s+)?term\b[^.]{0,120}$", re.I)
_THEREAFTER = re.compile(r"^\s*thereafter", re.I)
_SURVIVE_FOR = re.compile(r"\b(?:for|until)\s+(?:a\s+period\s+of\s+)?$", re.I)
_NOTICE_AFTER = re.compile(r"^['’]?s?\s*(?:prior\s+|advance\s+)?(?:written\s+)?notice\b", re.I)
_NOTICE_BEFORE = re.compile(r"\bnotice\s+(?:period\s+)?(?:of|at\s+least)\s+(?:at\s+least\s+|not\s+less\s+than\s+)?$",
                            re.I)
_BEFORE_END = re.compile(r"^[\s,]*(?:prior\s+to|before|in\s+advance\s+of)\b", re.I)
_NOTICE_WORD = re.compile(r"\bnoti(?:ce|fy|fies|fication)\b", re.I)
_RENEWAL_CONTEXT = re.compile(r"\brenew|\bextend|\bextension|\bnon-?renewal", re.I)
_UNLESS = re.compile(r"\bunless\b", re.I)
_DECLINES = re.compile(r"\bnot\s+to\b|non-?renewal|elect", re.I)
_CURE = re.compile(
    r"\b(?:cure|remedy|remedied|cured)\w*\b[^.]{0,60}?\b(?:within|period\s+of|for|by)\s+"
    r"(?:up\s+to\s+)?(?:a(?:n\s+additional)?\s+period\s+of\s+)?(?:not\s+(?:less|more)\s+than\s+)?$", re.I)
_CURE_AFTER = re.compile(r"^[\s,]*(?:cure\s+period|(?:(?:in|within)\s+which\s+)?to\s+(?:cure|remedy))", re.I)
_RENEWAL = re.compile(
    r"\b(?:renew\w*|extend\w*|extension)\b[^.]{0,50}?\b(?:for|by)\s+(?:an?\s+|the\s+)?"
    r"(?:(?:further|additional|successive|subsequent|consecutive|like)\s+)*(?:renewal\s+)?"
    r"(?:(?:periods?|terms?)\s+of\s+)?(?:up\s+to\s+)?$", re.I)
# "successive periods of one year" is a renewal in a clause about renewing (not "each successive
# period of three months during the Term").
_SUCCESSIVE = re.compile(r"\b(?:additional|successive|subsequent|consecutive|renewal|successor)\s+"
                         r"(?:renewal\s+|successor\s+)?(?:terms?|periods?)\s+of\s+(?:up\s+to\s+)?$", re.I)
# "term" as a word, not inside a defined name ("the term “Minimum Royalty”", "Post-Term Period").
_TERM = re.compile(
    r"(?<![-\w])(?<!maximum )(?<!minimum )term\b(?!\s*[\"“])(?![\w\s-]{0,20}[\"”])[^.]{0,60}?\b(?:of|for|be|is)\s+"
    r"(?:a\s+period\s+of\s+)?$|"
    r"\b(?:Agreement|Attachment|Supplement|term)s?\b[^.]{0,120}?\b(?:continue|remain\s+in\s+(?:full\s+)?"
    r"(?:force\s+and\s+)?effect)\b[^.]{0,40}?\bfor\s+(?:a\s+(?:further\s+)?(?:period|term)\s+of\s+)?$", re.I)
_TERM_WORD = re.compile(r"(?<![-\w])term\b|\bthis\s+agreement\b", re.I)
_TERM_FROM = re.compile(r"^\s*(?:from|after|following)\s+(?:the\s+)?(?:Effective|Commencement|Execution)\s+Date|"
                        r"^\s*(?:from|after)\s+the\s+date\s+(?:hereof|of\s+this\s+Agreement)", re.I)
_EXPIRE = re.compile(r"\b(?:expire|end|continue\s+until)\s+(?:on\s+the\s+date\s+(?:that\s+is\s+)?)?$", re.I)
_PAY_WITHIN = re.compile(r"\b(?:pay\w*|invoice\w*|remit\w*)\b[^.]{0,80}?\bwithin\s+$", re.I)
_AFTER_INVOICE = re.compile(
    r"^\s*(?:after|of|following)\s+(?:the\s+)?(?:receipt|date)\s+of\s+(?:an?\s+|the\s+|such\s+)?invoice", re.I)
_WARRANTY_FOR = re.compile(r"\bwarrant\w*\b[^.]{0,60}?\b(?:for|of)\s+(?:a\s+period\s+of\s+)?$", re.I)
_SURVIVE = re.compile(r"\bsurviv\w*", re.I)
_CONFIDENTIAL = re.compile(r"\bconfidential", re.I)
_CONF_PERIOD = re.compile(r"\bconfiden\w*\b[^.]{0,120}?\bfor\s+(?:a\s+period\s+of\s+)?$", re.I)
_MIN = re.compile(r"\b(?:at\s+least|not\s+less\s+than|no\s+less\s+than|minimum\s+of|no\s+fewer\s+than)\s+$", re.I)
_MAX = re.compile(r"\b(?:not\s+more\s+than|no\s+more\s+than|up\s+to|at\s+most|maximum\s+of|not\s+to\s+exceed|"
                  r"no\s+earlier\s+than|not\s+earlier\s+than)\s+$", re.I)
# What a period belongs to: an agreement, or a part of it that has its own term.
_DEFINES = re.compile(r"[\"“]([^\"”]{2,40})[\"”]\s*(?:shall\s+)?(?:means?|refers?\s+to|is\s+defined\s+as)\b")
_DEFINED_PERIOD = re.compile(r"^[^.()]{0,60}?\((?:the\s+)?[\"“]([^\"”]{2,40}?(?:Term|Period))[\"”]\)")
_TERM_OF = re.compile(r"\b(?i:term)\s+(?:(?:of|for)\s+(?:[Tt]his|[Tt]he)\s+(?P<name>(?:[A-Z][\w-]*\s+){0,3}[A-Z][\w-]*)|"
                      r"(?P<other>thereof|of\s+(?:each|such|any|the\s+applicable)\b))")
_THING = re.compile(r"\b(?:[Tt]his|[Tt]he)\s+(Agreement|Attachment|Supplement|Schedule|Exhibit|Addendum|Amendment|"
                    r"Appendix|Statement\s+of\s+Work|SOW|Work\s+Order|Order|Lease|Sublicense|Program|Project)\b")
_SPEAKS_OF_AGREEMENT = re.compile(r"\b(?:this|the)\s+Agreement\b|\bthe\s+(?:initial\s+)?Term\b")
# What a notice ends: "notice of its intent to terminate this Agreement", "non-renewal of any policy".
_ENDS_WHAT = re.compile(r"\b(?:terminat\w*|non-?renewal|renew\w*|extend\w*|cancel\w*|expir\w*)\s+(?:of\s+)?"
                        r"(?:[Tt]his|[Tt]he|any|such|your|its)\s+((?:[A-Z][\w-]*\s+)?[A-Z][\w-]*|[a-z][\w-]*)")
_NOTICE_OF = re.compile(r"^['’]?s?\s*(?:prior\s+|advance\s+)?(?:written\s+)?notice\s+of\s+(?:its\s+|their\s+|your\s+|"
                        r"the\s+)?(?:(?:intent(?:ion)?|election|choice|decision)\s+)?(?:(?P<neg>not)\s+)?(?:to\s+)?"
                        r"(?P<what>[\w-]+)", re.I)
_CONVENIENCE = re.compile(
    r"(?P<who>\b[Ee](?:ither|ach)\s+[Pp]arty|\b[A-Z][\w&.-]*(?:\s+[A-Z][\w&.-]*){0,2})\s+"
    r"(?:(?:shall|will)\s+(?:also\s+)?have\s+the\s+right\s+to|may(?:\s+also)?|can|is\s+entitled\s+to|"
    r"has\s+the\s+right\s+to)\s+(?:\w+\s+){0,2}?terminate\b[^.]{0,160}?\b(?:for\s+convenience|without\s+cause|"
    r"for\s+any\s+reason|at\s+any\s+time)\b|"
    r"(?P<who2>\b[Ee](?:ither|ach)\s+[Pp]arty|\b[A-Z][\w&.-]*(?:\s+[A-Z][\w&.-]*){0,2})\s+"
    r"(?:may|shall\s+have\s+the\s+right\s+to)\s+(?:\w+\s+){0,3}?(?:for\s+convenience|without\s+cause)\b[^.]{0,60}?\bterminat",
)
_LOCK_IN = re.compile(
    r"\b(?:this|the)\s+Agreement\s+(?:may|shall|will|can)\s*not\s+(?:be\s+)?terminat\w*|"
    r"\b(?:this|the)\s+Agreement\s+(?:is|shall\s+be)\s+non-?cancell?able\b|"
    r"\b(?:neither|no)\s+party\s+(?:may|shall\s+have\s+(?:the|any)\s+right\s+to)\s+terminate\s+this\s+Agreement\b",
    re.I)
# "except as provided in Section 13" may be the very right to terminate for convenience.
_EXCEPT_ELSEWHERE = re.compile(
    r"\b(?:except|other\s+than|save|unless|subject\s+to)\b[^.]{0,60}?\b(?:section|article|clause|herein|"
    r"hereunder|this\s+agreement|provided|set\s+forth|permitted)\b", re.I)
_TRADE_SECRET_KEPT = re.compile(
    r"\btrade\s+secrets?\b[^.]{0,200}?\b(?:for\s+so\s+long\s+as|as\s+long\s+as|in\s+perpetuity|perpetual\w*|"
    r"indefinite\w*|until\s+such)|\b(?:for\s+so\s+long\s+as|as\s+long\s+as|until)\b[^.]{0,120}?\btrade\s+secret", re.I)


@dataclass(frozen=True)
class Period:
    days: int
    text: str  # as written
    role: str | None  # "term", "renewal period", "non-renewal notice", … ; None: none the rules know
    subject: str  # "agreement", "attachment", "profiling term", …
    party: str | None = None  # who may terminate for convenience ("either party", "licensee")
    bound: str = ""  # "min" ("at least"), "max" ("not more than"), "" (exactly)


def _party(who: str | None) -> str | None:
    if not who:
        return None
    words = who.lower().split()
    if words[-1] == "party":
        return "either party" if words[0] in ("either", "each") else None
    return words[-1]  # by its last word: a heading before it ("Exhibit C. Licensee") is not its name



def _subject(clause: str, start: int, end: int, role: str | None) -> str:
    after = clause[end:]
    defined = _DEFINES.search(clause[:start])
    if defined:  # "“Post-Term Period” means a period of two (2) years": that period's own length
        return _thing(defined.group(1))
    m = _DEFINED_PERIOD.match(after)
    if m and role in ("term", "renewal period"):
        name = " ".join(m.group(1).lower().split())
        return "agreement" if name in ("term", "initial term", "renewal term", "extended term") else name
    if role in ("non-renewal notice", "renewal notice", "notice to terminate for convenience", "termination notice"):
        m = _ENDS_WHAT.search(after) or _ENDS_WHAT.search(clause)
        if m:
            return _thing(m.group(1))
    m = next(reversed(list(_TERM_OF.finditer(clause[:start]))), None)
    if m and role in ("term", "renewal period"):
        return "" if m["other"] else _thing(m["name"])
    m = _THING.search(clause)
    if m:
        return _thing(m.group(1))
    # A period of no named thing is this agreement's only where the clause speaks of it.
    return "agreement" if _SPEAKS_OF_AGREEMENT.search(clause) else ""


def _thing(name: str) -> str:
    """'Franchise Agreement', 'Term' and 'Agreement' are this agreement; other things by their name."""
    name = " ".join(name.lower().split())
    return "agreement" if name.split()[-1] in ("agreement", "term") else name


def _role(clause: str, start: int, end: int) -> str | None:
    before, after = clause[:start], clause[end:]
    tail = before[-160:]
    if _AFTER_END.match(after) or (_DURING_TERM.search(tail) and _THEREAFTER.match(after)):
        return "survival" if _SURVIVE.search(clause) else "after the term"
    if _SURVIVE.search(tail[-90:]) and _SURVIVE_FOR.search(tail):
        return "survival"
    notice = (_NOTICE_AFTER.match(after) or _NOTICE_BEFORE.search(tail)
              or (_BEFORE_END.match(after) and _NOTICE_WORD.search(clause)))
    if notice:
        of = _NOTICE_OF.match(after)
        if of:  # "notice of termination", "notice of its intent not to renew"
            what = of["what"].lower()
            if what.startswith(("non-renew", "nonrenew")) or (of["neg"] and what.startswith(("renew", "extend"))):
                return "non-renewal notice"
            if what.startswith(("renew", "extend")):
                return "renewal notice"
            if not what.startswith("terminat"):
                return "notice period"
        if _CONVENIENCE.search(clause):
            return "notice to terminate for convenience"
        # "renewed for periods of one year unless either party gives notice of its intent to
        # terminate": a notice that stops the renewal.
        if _RENEWAL_CONTEXT.search(clause) and (
                _UNLESS.search(clause) or (of is None and (_DECLINES.search(clause) or _BEFORE_END.match(after)))):
            return "non-renewal notice"
        return "termination notice" if re.search(r"terminat", clause, re.I) else "notice period"
    if _CURE.search(tail) or _CURE_AFTER.match(after):
        return "cure period"
    if _RENEWAL.search(tail) or (_SUCCESSIVE.search(tail) and _RENEWAL_CONTEXT.search(clause)):
        return "renewal period"
    if _CONF_PERIOD.search(tail):
        return "confidentiality period"
    if (_TERM.search(tail) and _TERM_WORD.search(clause)) or (_TERM_FROM.match(after) and _EXPIRE.search(tail)):
        return "term"
    if _PAY_WITHIN.search(tail) or _AFTER_INVOICE.match(after):
        return "payment period"
    if _WARRANTY_FOR.search(tail):
        return "warranty period"
    return None


def periods(text: str) -> list[Period]:
    """The periods a sentence states, each with its role and subject, read clause by clause."""
    out = []
    for clause in _CLAUSE_END.split(text):
        for start, end, written, iso in find_durations(clause):
            n, unit = int(iso[1:-1]), iso[-1]
            if not n:
                continue
            role = _role(clause, start, end)
            conv = _CONVENIENCE.search(clause) if role == "notice to terminate for convenience" else None
            tail = clause[:start]
            bound = "min" if _MIN.search(tail) else "max" if _MAX.search(tail) else ""
            out.append(Period(n * _UNIT_DAYS[unit], written.strip(), role, _subject(clause, start, end, role),
                              _party(conv and (conv["who"] or conv["who2"])), bound))
    return out


# -- licences -------------------------------------------------------------------------------

_NON_EXCLUSIVE = re.compile(r"\bnon[-\s]?exclusive(?:ly)?\b", re.I)
_EXCLUSIVE = re.compile(r"(?<![-\w])(?<!non )exclusive(?:ly)?\b", re.I)
_NAME = r"(?:[Ee]ach\s+[Pp]arty|[Ee]ither\s+[Pp]arty|(?:the\s+)?[A-Z][\w&'’-]*(?:\s+[A-Z][\w&'’-]*){0,3})"
_GRANT = re.compile(
    rf"(?P<grantor>{_NAME})\s+(?:\([^)]{{0,80}}\)\s*,?\s*)?(?:hereby\s+)?"
    r"(?:grants?|shall\s+grant|will\s+grant|agrees\s+to\s+grant(?:\s+and\s+hereby\s+grants)?)\s*,?\s*"
    r"(?:\([^)]{0,120}\)\s*,?\s*)?(?:to\s+)?"
    rf"(?P<grantee>{_NAME})\s*,?\s*(?P<mods>[^.{SEMICOLON}]{{0,300}}?)\b(?P<what>sublicen[cs]e|licen[cs]e|option)s?\b"
    rf"(?P<object>[^.{SEMICOLON}]{{0,300}})")
_CHANGES = re.compile(r"\b(?:shall|will)\s+(?:automatically\s+)?become\b|\b(?:upon|after|following|on)\s+(?:the\s+)?"
                      r"(?:(?:date\s+of\s+)?(?:expiration|expiry|termination))\b", re.I)
SAME_LICENCE = 0.6  # share of the subject-matter words two grants must have in common


@dataclass(frozen=True)
class Grant:
    grantor: str
    grantee: str
    what: str  # "license", "sublicense", "option"
    exclusive: bool
    words: frozenset[str]  # subject-matter words after "license"


def _norm_name(name: str) -> str:
    """A party by its last word: a heading before it ("2.1.2 Platform Licenses Roche") is not its name."""
    words = name.lower().split()
    return "each party" if words[-1] == "party" else words[-1]


def grants(text: str) -> list[Grant]:
    """The licences a sentence grants with their exclusivity stated; none when the sentence
    changes a licence on expiry or termination ("shall become non-exclusive")."""
    if _CHANGES.search(text):
        return []
    out = []
    for m in _GRANT.finditer(text):
        mods = m["mods"]
        if _NON_EXCLUSIVE.search(mods):
            exclusive = False
        elif _EXCLUSIVE.search(mods):
            exclusive = True
        else:
            continue
        words = frozenset(w for w in re.findall(r"[a-z][a-z-]{2,}", m["object"].lower()) if w not in STOPWORDS)
        what = m["what"].lower().replace("licence", "license")
        out.append(Grant(_norm_name(m["grantor"]), _norm_name(m["grantee"]), what, exclusive, words))
    return out


def same_licence(x: Grant, y: Grant) -> bool:
    if (x.grantor, x.grantee, x.what) != (y.grantor, y.grantee, y.what) or x.grantor == "each party":
        return False
    if not x.words or not y.words:
        return False
    return len(x.words & y.words) / len(x.words | y.words) >= SAME_LICENCE


class Finding(BaseModel):
    """One conflict: a line of text and the sentence it rests on in each clause."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    text: str  # "[CONFLICT: a vs b] ..."
    a: Citation
    b: Citation


@dataclass(frozen=True)
class Fact:
    kind: str  # "governing law", "duration", "amount", "date"
    item: str  # what the value is of ("license fee", a duration's role); "" for governing law
    value: str  # normalised, compared across documents
    text: str  # as written


GOVERNING_LAW = re.compile(
    r"(?i:\b(?:govern\w*|constru\w*|interpret\w*|enforced)\b)[^.;]{0,150}?(?i:\blaws?\s+of\s+)"
    r"(?:the\s+)?(?:(?i:state|commonwealth|province|republic|kingdom)\s+of\s+)?"
    r"(?P<place>[A-Z][\w.'-]*(?:\s+(?:and\s+|of\s+)?[A-Z][\w.'-]*){0,3})"
)


def _governing_law(text: str) -> list[str]:
    return list(dict.fromkeys(" ".join(m["place"].rstrip(".").split()) for m in GOVERNING_LAW.finditer(text)))


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



def facts(text: str) -> list[Fact]:
    """The keyed facts two documents can disagree on, in one sentence."""
    out = [Fact("governing law", "", v.lower(), v) for v in _governing_law(text)]
    for p in periods(text):
        if p.role and p.role != "after the term":
            item = p.role if p.subject in ("agreement", "") else f"{p.role} of the {p.subject}"
            out.append(Fact("duration", item, str(p.days), p.text))
    return out + _amounts(text) + _dates(text)




_COMPARED = ("term", "renewal period", "non-renewal notice", "renewal notice", "notice to terminate for convenience")
_NOTICES = ("non-renewal notice", "renewal notice", "notice to terminate for convenience")


def _same_party(x: Period, y: Period) -> bool:
    return x.party is None or y.party is None or x.party == y.party or "either party" in (x.party, y.party)


def _what(p: Period) -> str:
    if p.role == "notice to terminate for convenience" and p.party and p.party != "either party":
        name = f"the notice {p.party.title()} must give to terminate for convenience"
    else:
        name = f"the {p.role}"
    return name if p.subject == "agreement" else f"{name} of the {p.subject.title()}"


def cite_sentence(doc: Document, s: Sentence, holding: str | None = None) -> Citation:
    """A verified citation of the lines holding sentence `s`, quoting it; of a sentence over
    two pages, the part that holds the words `holding` (else its first)."""
    lo, hi = s.parts[0]
    if len(s.parts) > 1 and holding:
        lo, hi = next(((a, b) for a, b in s.parts if holding in " ".join(doc.text[a:b].split())), (lo, hi))
    quote = " ".join(doc.text[lo:hi].split())
    hit = find_quote(doc, quote, lo, hi)
    if hit is None:  # a sentence is its own text; only normalisation could lose it
        hit = (lo, hi)
    return relocate(doc, hit, quote=quote).model_copy(update={"relocated": False})


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _clause_at(text: str, pos: int) -> str:
    start = 0
    for m in _CLAUSE_END.finditer(text):
        if m.start() >= pos:
            return text[start : m.start()]
        start = m.end()
    return text[start:]


def _lock_in(s: Sentence) -> re.Match | None:
    """'This Agreement may not be terminated', unless an exception refers elsewhere (which may
    be the very right to terminate for convenience)."""
    m = _LOCK_IN.search(s.text)
    return m if m and not _EXCEPT_ELSEWHERE.search(_clause_at(s.text, m.start())) else None


def _confidential(doc: Document, s: Sentence) -> bool:
    """The sentence speaks of confidentiality, or lies in a section about it."""
    if _CONFIDENTIAL.search(s.text):
        return True
    sec = next((x for x in reversed(doc.sections) if x.span.char_start <= s.start), None)
    return bool(sec and _CONFIDENTIAL.search(sec.title or ""))


@dataclass(frozen=True)
class _Read:
    """What the rules read in one sentence."""

    periods: tuple[Period, ...]
    grants: tuple[Grant, ...]
    lock_in: bool
    convenience: bool
    trade_secret: re.Match | None

    @classmethod
    def of(cls, s: Sentence) -> _Read:
        return cls(tuple(periods(s.text)), tuple(grants(s.text)), _lock_in(s) is not None,
                   bool(_CONVENIENCE.search(s.text)) and not _LOCK_IN.search(s.text), _TRADE_SECRET_KEPT.search(s.text))

    def matters(self) -> bool:
        return bool(self.grants or self.lock_in or self.convenience or self.trade_secret
                    or any(p.role in _COMPARED + ("survival", "confidentiality period") for p in self.periods))


def detect_conflicts(
    doc: Document,
    a_id: str,
    a_spans: Sequence[tuple[int, int]],
    b_id: str,
    b_spans: Sequence[tuple[int, int]],
) -> list[Finding]:
    """Rule-based conflicts between the clauses cited for item `a_id` and item `b_id`.

    `*_spans` are char spans of `doc.text` (the passages each item's answer cites)."""
    tag = f"[CONFLICT: {a_id} vs {b_id}]"
    found: dict[tuple, Finding] = {}
    read: dict[tuple[int, int], _Read] = {}
    sides = []
    for spans in (a_spans, b_spans):
        side = []
        for s in sentences(doc, spans):
            r = read.setdefault((s.start, s.end), _Read.of(s))
            if r.matters():  # a sentence with none of the facts takes part in no rule
                side.append((s, r))
        sides.append(side)
    side_a, side_b = sides

    def add(rule: str, sa: Sentence, sb: Sentence, why: str, holding: tuple[str | None, str | None] = (None, None),
            *, one_sentence: bool = False, flip: bool = False) -> None:
        """A finding citing `sa` as item a's side and `sb` as item b's (`flip`: the other way round)."""
        if (sa.start, sa.end) == (sb.start, sb.end) and not one_sentence:
            return  # one sentence cannot disagree with itself
        if flip:
            sa, sb, holding = sb, sa, holding[::-1]
        key = (rule, sa.start, sb.start)
        if key not in found:
            found[key] = Finding(rule=rule, text=f"{tag} {why}", a=cite_sentence(doc, sa, holding[0]),
                                 b=cite_sentence(doc, sb, holding[1]))

    def kind(g: Grant) -> str:
        return "an exclusive" if g.exclusive else "a non-exclusive"

    for sa, ra in side_a:
        for sb, rb in side_b:
            for x in ra.grants:
                for y in rb.grants:
                    if x.exclusive != y.exclusive and same_licence(x, y):
                        add("exclusivity", sa, sb,
                            f"{a_id} grants {kind(x)} {x.what} that {b_id} grants as {kind(y)} one "
                            f"({x.grantor.title()} to {x.grantee.title()}): \"{_short(sa.text)}\" / \"{_short(sb.text)}\"")
            for (x, rx), (y, ry), ids in (((sa, ra), (sb, rb), (a_id, b_id)), ((sb, rb), (sa, ra), (b_id, a_id))):
                if rx.lock_in and ry.convenience:
                    add("lock_in_vs_convenience", x, y, flip=ids[0] != a_id, why=
                        f"{ids[0]} says the agreement may not be terminated, {ids[1]} allows "
                        f"termination for convenience: \"{_short(x.text)}\" / \"{_short(y.text)}\"")
            for x in ra.periods:
                for y in rb.periods:
                    if (x.role in _COMPARED and x.subject and (x.role, x.subject, x.bound) == (y.role, y.subject, y.bound)
                            and x.days != y.days and _same_party(x, y)):
                        add("durations_disagree", sa, sb, f"{_what(x)} is {x.text} in {a_id} but {y.text} in {b_id}",
                            (x.text, y.text))
    # A notice and the period it would end are often in one sentence: these pair a sentence
    # with itself too.
    both = [(s, r, a_id) for s, r in side_a] + [(s, r, b_id) for s, r in side_b]
    for x_s, rx, x_id in both:
        for n in rx.periods:
            if n.role not in _NOTICES or n.bound == "max":
                continue
            for y_s, ry, y_id in both:
                for p in ry.periods:
                    if p.role in ("term", "renewal period") and n.subject and p.subject == n.subject and n.days >= p.days:
                        add("notice_exceeds_period", x_s, y_s,
                            f"{_what(n)} in {x_id} ({n.text}) is not shorter than {_what(p)} in {y_id} ({p.text}): "
                            "it falls due when that period begins, or before", (n.text, p.text), one_sentence=True,
                            flip=x_id != y_id and x_id == b_id)
    for x_s, rx, x_id in both:
        ends = [p for p in rx.periods if p.role == "survival"]
        if not ends or not _confidential(doc, x_s):
            continue
        for y_s, ry, y_id in both:
            if (y_s.start, y_s.end) == (x_s.start, x_s.end):
                continue
            longer = [p for p in ry.periods if p.role == "confidentiality period" and p.days > ends[0].days]
            if ry.trade_secret:
                add("survival_shorter", x_s, y_s,
                    f"confidentiality in {x_id} survives termination by {ends[0].text} only, but {y_id} protects "
                    f"trade secrets longer (\"{_short(ry.trade_secret.group(), 60)}\"): after that they may be disclosed",
                    (ends[0].text, None), flip=x_id != y_id and x_id == b_id)
            elif longer:
                add("survival_shorter", x_s, y_s,
                    f"confidentiality in {x_id} survives termination by {ends[0].text} only, while {y_id} sets a "
                    f"confidentiality period of {longer[0].text}", (ends[0].text, longer[0].text),
                    flip=x_id != y_id and x_id == b_id)
    return list(found.values())


_CROSS_RULES = {"governing law": "governing_law", "duration": "durations_disagree", "amount": "amounts_disagree",
                "date": "dates_disagree"}


def _fact_name(f: Fact) -> str:
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
    read: dict[str, list[tuple[Sentence, Fact]]] = {}
    for doc_id, sp in spans.items():
        if doc_id in docs and sp:
            read[doc_id] = [(s, f) for s in sentences(docs[doc_id], sp) for f in facts(s.text)]
    found: dict[tuple, Finding] = {}
    for a_id, b_id in combinations(list(read), 2):
        a_name, b_name = names.get(a_id, a_id), names.get(b_id, b_id)
        values = {d: {} for d in (a_id, b_id)}
        for d in (a_id, b_id):
            for _, f in read[d]:
                values[d].setdefault((f.kind, f.item), set()).add(f.value)
        for sa, fa in read[a_id]:
            key = (fa.kind, fa.item)
            if key not in values[b_id] or fa.value in values[b_id][key]:
                continue
            for sb, fb in read[b_id]:
                if (fb.kind, fb.item) != key or fb.value in values[a_id][key]:
                    continue
                k = (a_id, b_id, key, fa.value, fb.value)
                if k in found:
                    continue
                found[k] = Finding(
                    rule=_CROSS_RULES[fa.kind],
                    text=f"[CONFLICT: {a_name} vs {b_name}] {_fact_name(fa)} is {fa.text} in {a_name} but {fb.text} in {b_name}",
                    a=cite_sentence(docs[a_id], sa, fa.text),
                    b=cite_sentence(docs[b_id], sb, fb.text),
                )
    return list(found.values())
