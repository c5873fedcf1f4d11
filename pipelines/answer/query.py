"""Question analysis for retrieval: what in a question is worth searching for.

A question is mostly words that every passage of a contract shares ("party", "clause",
"does", "contract"), plus a few that carry its subject. `analyze()` separates them:

- `focus`: the subject — a quoted phrase ("Termination For Convenience"), or, failing
  that, the content words; what section titles and the strongest bm25 query use;
- `terms`: every content word (stopwords, question words and checklist boilerplate gone);
- `expansions`: words and phrases a clause on that subject is usually written with, from a
  small thesaurus of general legal and specification vocabulary (ROFR ↔ right of first
  refusal, audit ↔ books and records). Contract drafting names a right by what it does,
  not by its label, so the label alone finds little;
- `clauses`: section/article/exhibit references ("Section 8.3") in canonical form;
- `mentions`: capitalised phrases, which may be defined terms or party names.

Pure string work; nothing here knows about documents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..fulltext import STOPWORDS
from ..textnorm import normalize

# Phrases of review checklists that describe the task, not the subject.
_BOILERPLATE = [
    re.compile(r"highlight the parts(?: \(if any\))? of this (?:contract|agreement|document) related to", re.IGNORECASE),
    re.compile(r"that should be reviewed by a lawyer\.?", re.IGNORECASE),
    re.compile(r"\bdetails\s*:", re.IGNORECASE),
]

# Words of a question's framing, not of its subject: asked of every clause, they match
# every passage and dilute bm25.
QUESTION_WORDS = frozenset(
    ["highlight", "parts", "part", "related", "reviewed", "review", "lawyer", "details", "detail", "clause", "clauses", "contract", "contracts", "agreement", "document", "party", "parties", "counterparty", "one", "does", "contain", "contains", "containing", "include", "includes", "including", "there", "any", "certain", "such", "whether", "either", "is", "are", "was", "be", "provide", "provided", "providing", "requirement", "required", "require", "requires", "regarding", "relating", "related", "concerning", "respect", "matters", "matter", "type", "types", "particular", "other", "others", "etc", "incl", "e", "g", "ie", "also", "what", "which", "who", "whom", "when", "where", "how", "why", "can", "could", "would", "should", "shall", "will", "may", "might", "must", "thing", "things", "specific", "whose"]
)

# Concept -> what clauses on it are commonly written with. General drafting vocabulary,
# keyed by the words that name the concept in a question.
THESAURUS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("rofr", "right of first refusal"), ("right of first refusal", "first refusal", "first right", "match")),
    (("rofo", "right of first offer"), ("right of first offer", "first offer", "first right")),
    (("rofn", "right of first negotiation"), ("right of first negotiation", "first negotiation", "negotiate exclusively")),
    (("termination for convenience", "without cause"), ("terminate", "without cause", "for any reason", "for convenience", "written notice", "days notice", "months notice")),
    (("change of control", "change in control"), ("change of control", "change in control", "merger", "acquisition", "acquired", "substantially all", "assets", "controlling interest")),
    (("anti-assignment", "assignment", "assigned"), ("assign", "assignment", "transfer", "prior written consent", "delegate")),
    (("non-compete", "compete"), ("compete", "competing", "competitive", "competitor", "similar business")),
    (("exclusivity", "exclusive"), ("exclusive", "exclusively", "sole", "solely")),
    (("no-solicit", "solicit", "soliciting"), ("solicit", "induce", "hire", "employ", "divert")),
    (("non-disparagement", "disparage"), ("disparage", "disparaging", "derogatory", "reputation", "goodwill")),
    (("most favored nation",), ("most favored", "most favoured", "no less favorable", "more favorable", "best price")),
    (("ip ownership", "intellectual property"), ("intellectual property", "ownership", "owns", "own", "title", "inventions", "work product", "vest")),
    (("joint ip", "joint", "shared ownership"), ("jointly", "joint", "co-owned", "jointly owned", "undivided interest")),
    (("license grant", "license", "licence"), ("grants", "license", "licence", "sublicense", "right to use")),
    (("non-transferable",), ("non-transferable", "nontransferable", "non-sublicensable", "may not transfer", "may not assign")),
    (("irrevocable", "perpetual"), ("irrevocable", "perpetual", "fully paid", "royalty-free")),
    (("unlimited", "all-you-can-eat", "enterprise"), ("unlimited", "enterprise", "royalty-free", "fully paid")),
    (("source code escrow", "escrow"), ("escrow", "source code", "deposit", "release")),
    (("post-termination", "after the termination"), ("upon termination", "after termination", "following termination", "expiration", "survive", "transition", "wind down", "return")),
    (("audit",), ("audit", "inspect", "inspection", "books", "records", "examine", "accountant")),
    (("uncapped liability", "liability uncapped"), ("liability", "unlimited", "shall not apply", "exclusion", "gross negligence", "willful misconduct", "indemnification")),
    (("cap on liability", "liability"), ("limitation of liability", "liability", "in no event", "aggregate", "exceed", "consequential damages")),
    (("liquidated damages", "termination fee"), ("liquidated damages", "termination fee", "penalty", "lost profits", "damages")),
    (("warranty duration", "warranty"), ("warrant", "warranty", "warranties", "defects", "warranty period", "months", "days")),
    (("insurance",), ("insurance", "insured", "coverage", "policy", "policies", "liability insurance")),
    (("covenant not to sue", "contesting the validity"), ("contest", "challenge", "validity", "sue", "claim", "dispute ownership")),
    (("third party beneficiary", "beneficiary"), ("third party beneficiary", "third-party beneficiaries", "beneficiaries", "no third party", "enforce")),
    (("revenue", "profit sharing", "royalty"), ("royalty", "royalties", "net sales", "revenue", "profit", "percentage", "share")),
    (("price restrictions", "prices"), ("price", "prices", "pricing", "increase", "adjust", "fee")),
    (("minimum commitment", "minimum order"), ("minimum", "purchase", "at least", "quota", "minimum royalty")),
    (("volume restriction", "threshold"), ("exceed", "exceeds", "threshold", "additional fee", "volume", "capacity")),
    (("renewal",), ("renew", "renewal", "renewed", "extend", "extension", "successive", "automatically")),
    (("notice period", "terminate renewal"), ("notice", "non-renewal", "prior to expiration", "days prior", "renew")),
    (("expiration date", "expire", "initial term"), ("term", "expire", "expiration", "continue", "until", "years", "commencing")),
    (("effective date",), ("effective date", "effective as of", "commence", "shall become effective")),
    (("agreement date", "date of the contract"), ("dated", "as of", "entered into", "made", "day of")),
    (("document name", "name of the contract"), ("agreement",)),
    (("signed the contract", "parties"), ("between", "by and between", "inc", "corporation", "llc", "ltd", "company")),
    (("geographies", "geography", "geographic", "regions", "operates in", "operate in"), ("geographic", "geographical", "region", "regions", "international", "countries")),
    (("governing law", "law governs"), ("governed by", "laws of", "construed", "governing law", "jurisdiction")),
    (("competitive restriction exception", "carveouts", "exceptions"), ("notwithstanding", "except", "exception", "shall not prevent", "shall not restrict", "permitted")),
]

# Questions answered by a contract's opening words (title, parties, date), which sit
# before any numbered section.
PREAMBLE_TRIGGERS = ("document name", "name of the contract", "name of the agreement", "title of the agreement",
                     "parties", "signed the contract", "agreement date", "date of the contract",
                     "date of the agreement", "effective date", "dated", "entered into")

_CLAUSE_RE = re.compile(
    r"\b(section|sections|sec\.|§|article|art\.|clause|exhibit|schedule|appendix|annex|attachment|paragraph)"
    r"\s*([0-9]+(?:\.[0-9]+)*(?:\([a-z0-9]+\))*|[A-Z]\b|[IVXLC]+\b)",
    re.IGNORECASE,
)
_CLAUSE_KIND = {
    "section": "Section", "sections": "Section", "sec.": "Section", "§": "Section",
    "article": "Article", "art.": "Article", "clause": "Section", "paragraph": "Section",
    "exhibit": "Exhibit", "schedule": "Schedule", "appendix": "Appendix", "annex": "Annex",
    "attachment": "Attachment",
}
_QUOTED = re.compile(r"[\"“]([^\"”]{2,80})[\"”]")
_CAPS = re.compile(r"\b([A-Z][\w'-]*(?:\s+(?:of|and|for|in|the|&)?\s*[A-Z][\w'-]*)*)")
_WORD = re.compile(r"[^\W_]+(?:['-][^\W_]+)*")


@dataclass
class Query:
    text: str  # the question without boilerplate
    focus: list[str] = field(default_factory=list)  # phrases naming the subject
    terms: list[str] = field(default_factory=list)  # content words, in order, distinct
    expansions: list[str] = field(default_factory=list)  # thesaurus words/phrases
    clauses: list[str] = field(default_factory=list)  # canonical refs: "Section 8.3"
    mentions: list[str] = field(default_factory=list)  # capitalised phrases (maybe defined terms)
    preamble: bool = False  # asks what a contract's opening states


def strip_boilerplate(question: str) -> str:
    text = question
    for pat in _BOILERPLATE:
        text = pat.sub(" ", text)
    return re.sub(r"\s+", " ", text).strip()


def content_words(text: str) -> list[str]:
    """Words worth matching: not stopwords, not question framing, not single letters."""
    out = []
    for w in _WORD.findall(normalize(text)):
        for part in w.split("-") if "-" in w else [w]:
            if part in STOPWORDS or part in QUESTION_WORDS:
                continue
            if len(part) < 2 and not part.isdigit():
                continue
            out.append(part)
    return list(dict.fromkeys(out))


def clause_refs(text: str) -> list[str]:
    refs = []
    for m in _CLAUSE_RE.finditer(text):
        kind = _CLAUSE_KIND[m.group(1).lower()]
        num = m.group(2)
        # "clause" and "paragraph" also occur as plain nouns ("a clause that ..."); only a
        # following number makes them a reference.
        if kind == "Section" and not num[0].isdigit() and m.group(1).lower() in ("clause", "paragraph"):
            continue
        if kind in ("Section", "Article") and num.isalpha() and not re.fullmatch(r"[IVXLC]+", num):
            continue
        refs.append(f"{kind} {num.upper() if num.isalpha() else num}")
    return list(dict.fromkeys(refs))


def expand(text_norm: str) -> list[str]:
    """Thesaurus entries whose trigger occurs in the (normalised) question."""
    out: list[str] = []
    for triggers, words in THESAURUS:
        if any(re.search(r"(?<!\w)" + re.escape(t) + r"(?!\w)", text_norm) for t in triggers):
            out.extend(words)
    return list(dict.fromkeys(out))


def quoted_phrases(text: str) -> list[str]:
    """Phrases in double quotes: how a checklist names its subject ("Non-Compete")."""
    return [q.strip() for q in _QUOTED.findall(text)]


def analyze(question: str) -> Query:
    text = strip_boilerplate(question)
    quoted = quoted_phrases(text)
    norm = normalize(text)
    # A subject phrase is searched as a phrase and as its words: "termination for
    # convenience" is rarely written in that order, but its words still mark the clause.
    focus = [w for q in quoted for w in [q, *content_words(q)]]
    if not focus:
        focus = content_words(text)
    # Section references name where to look, not what to match.
    words_text = _CLAUSE_RE.sub(" ", text)
    mentions = []
    for m in _CAPS.finditer(words_text):
        phrase = m.group(1).strip()
        # A sentence-initial capital is grammar, not a name.
        if " " not in phrase and (m.start() == 0 or text[max(0, m.start() - 2) : m.start()].strip() in (".", "?", ":")):
            continue
        if normalize(phrase) in QUESTION_WORDS or normalize(phrase) in STOPWORDS:
            continue
        mentions.append(phrase)
    return Query(
        text=text,
        focus=focus,
        terms=content_words(words_text),
        expansions=expand(norm),
        clauses=clause_refs(text),
        mentions=list(dict.fromkeys(quoted + mentions)),
        preamble=any(re.search(r"(?<!\w)" + re.escape(t) + r"(?!\w)", norm) for t in PREAMBLE_TRIGGERS),
    )


_SUFFIXES = ("ations", "ation", "ings", "ing", "ions", "ion", "ities", "ity", "ies", "ed", "es", "s", "ly")


def stem(word: str) -> str:
    """A crude stemmer for matching question words to section titles ("terminate" ~
    "termination"); FTS5's porter tokenizer does the real work for passages."""
    w = word.lower()
    for suf in _SUFFIXES:
        if w.endswith(suf) and len(w) - len(suf) >= 4:
            w = w[: -len(suf)]
            break
    if len(w) > 5 and w.endswith("e"):
        w = w[:-1]
    return w[:7]


def preview(text: str, question: str, width: int = 160) -> str:
    """At most `width` characters of a passage, centred on the lines that hold the
    question's words (its content words and thesaurus expansions, matched by stem), so an
    evidence line shows why it was ranked ("C. Governing Law ... Delaware", not the
    passage's first line "B. Entire Agreement"). The passage's start when nothing matches;
    "…" marks text left out."""
    q = analyze(question)
    own = {stem(w) for w in q.terms}
    stems = own | {stem(w) for e in q.expansions for w in content_words(e)}
    phrases = [normalize(p) for p in q.expansions + q.focus if " " in p.strip()]
    lines = [" ".join(ln.split()) for ln in text.split("\n")]
    lines = [ln for ln in lines if ln]
    if not lines:
        return ""

    def score(line: str) -> int:
        norm = normalize(line)
        words = {stem(w) for w in content_words(line)}
        # The question's own words count double the thesaurus's.
        return 2 * len(words & own) + len(words & stems) + 2 * sum(1 for p in phrases if p in norm)

    scores = [score(ln) for ln in lines]
    best = max(range(len(lines)), key=lambda i: (scores[i], -i))
    if scores[best] == 0:
        best = 0
    line = lines[best]
    if len(line) > width:
        # Centre the window on the first matching word of the line.
        first = next((m.start() for m in _WORD.finditer(line) if stem(normalize(m.group(0))) in stems), 0)
        start = max(0, min(first - width // 3, len(line) - width + 1))
        cut = line[start : start + width - 2]
        return ("…" if start else "") + cut + ("…" if start + width - 2 < len(line) else "")
    lo = hi = best
    shown = line
    # Widen with the lines around it, the following ones first (a heading's clause follows it).
    while True:
        grown = False
        for j in (hi + 1, lo - 1):
            if 0 <= j < len(lines) and (j > hi or j < lo) and len(shown) + 1 + len(lines[j]) <= width - 2:
                shown = f"{shown} {lines[j]}" if j > hi else f"{lines[j]} {shown}"
                lo, hi = min(lo, j), max(hi, j)
                grown = True
        if not grown:
            break
    if hi + 1 < len(lines) and len(shown) < width - 2:
        rest = lines[hi + 1][: width - 3 - len(shown)].rstrip()
        if rest:
            shown = f"{shown} {rest}"
        return ("…" if lo else "") + shown + "…"
    return ("…" if lo else "") + shown + ("…" if hi + 1 < len(lines) else "")
