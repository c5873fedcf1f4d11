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

Those rules are necessary, not sufficient: a quote on the subject need not answer it (a clause
that mentions governing law is not the governing-law clause). So a quote also needs the model's
own verdict: asked, apart from the answer, whether the quoted text answers the question
(`confirm_messages`), its log-odds of "Yes" over "No" must reach the model's threshold
(`Confirm`, app/models.py; bench/answer_eval.py measures both on the corpus gold).

An answer with no supporting citation is withheld ("Not found", with the evidence); a
free-text answer to a numeric question must state a figure that a supporting quote holds; and
free text that states what no supporting quote says (`unbacked`) is not shown as the answer:
its supporting quotes are. Pure string work on the question, the quote and the cited lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..document import Document
# Figures and years, in questions and quotes, are read in one place (pipelines/answer/figures.py);
# the names not used here are re-exported for qa, the tests and the bench.
from .figures import (FRAMING_WORDS, Figure, FigureKind, figure_asked, figures, has_figure,  # noqa: F401
                      header_years, is_year_word, mentions_year, metric_words, question_years)
from .query import analyze, content_words, expand, quoted_phrases, stem
from ..textnorm import normalize


# Prefixes that a hyphen splits off ("Non-Compete", "Post-Termination"): alone they name nothing.
_AFFIXES = frozenset({"non", "anti", "post", "pre", "co", "sub", "self", "multi", "cross"})
# A subject word on at least this share of a document's pages names the document (its company,
# its parties), not what was asked; documents shorter than _MIN_PAGES keep every word.
_COMMON_SHARE = 0.5
_MIN_PAGES = 8


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
    return frozenset(stem(w) for w in words - _AFFIXES - FRAMING_WORDS if not is_year_word(w)) or None


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


# -- the model's verdict ------------------------------------------------------------------

# Confirm(messages) -> the model's log-odds of "Yes" over "No" as its next word.
Confirm = Callable[[list[dict[str, str]]], float]
# A quote supports an answer only where the model's log-odds that it answers the question reach
# this: the least that met the precision target on the tune questions with the evaluation model
# (bench/results/answers.md, "rules + model yes/no"); a bare "yes" (0) let wrong quotes through.
CONFIRM_MARGIN = 0.5

CONFIRM_PROMPT = ("You check whether a passage quoted from a document answers a question. "
                  "Reply with Yes or No only.")


def confirm_messages(question: str, quote: str) -> list[dict[str, str]]:
    """The yes/no question put to the model about one verified quote, apart from the answer's
    context (what it read before may not sway it), in its chat template's own turns."""
    return [{"role": "system", "content": CONFIRM_PROMPT},
            {"role": "user", "content": f"Question: {question}\n\nQuoted passage: \"{quote}\"\n\n"
                                        "Does the quoted passage answer the question? Reply Yes or No."}]


# -- free text that says more than its quotes -----------------------------------------------

# Words that frame an answer rather than state anything ("The exact words with their citation
# are: …", "According to the excerpt on page 3, …").
_FRAMING = frozenset(stem(w) for w in (
    "answer", "answers", "quote", "quoted", "quotes", "exact", "words", "citation", "citations", "cited",
    "text", "excerpt", "excerpts", "passage", "passages", "page", "line", "lines", "document", "state", "states",
    "stated", "says", "according", "provided", "specified", "mentioned", "following", "found", "given", "question"))
_CLAIM_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def unbacked(answer: str, quotes: Iterable[str], question: str) -> list[str]:
    """The sentences of `answer` that state something no quote in `quotes` says: a content word
    (stemmed) that is in none of the quotes, the question or the words that frame an answer.
    Text inside the answer's own quotation marks and citation labels is the quotes', not a claim."""
    held = {stem(w) for q in quotes for w in content_words(q)} | {stem(w) for w in content_words(question)}
    text = re.sub(r"\[[^\]]*\]", " ", answer)
    text = re.sub(r'"[^"]*"|“[^”]*”', " ", text)
    out = []
    for m in _CLAIM_SENTENCE.finditer(text):
        words = {stem(w) for w in content_words(m.group()) if not is_year_word(w)}
        if words - held - _FRAMING:
            out.append(m.group().strip())
    return out
