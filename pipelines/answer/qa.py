"""Question answering with verified citations.

The model is injected as a function from chat messages to text (`Generate`), so this
module stays a pure function of documents, passages and that function — and tests can run
it with a scripted model. Steps: build the context, generate, parse and verify citations,
attach mechanical citations to answer sentences copied verbatim from the excerpts, and fall
back to the ranked evidence when nothing verifies (SPEC §4: never an unsupported answer
shown as supported). Each verified citation is also judged on whether it *supports* an
answer (pipelines/answer/support.py); an answer none of whose citations supports it is withheld
as "Not found", its draft kept for audit (`raw_answer`, `draft_citations`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .citations import Citation, cite_lines, find_quote, parse_citations, relocate, verify
from .prompt import BuiltContext, approx_tokens, build_context, chat_messages
from ..document import Document, Passage
from .query import content_words, stem  # noqa: F401  (bench/abstention_rules.py imports them from here)
from .quote_constraint import QuotePlan, plan_for
from .retrieval import evidence_passages
from .support import (_AFFIXES, Need, answer_figure_quoted, for_documents, header_years, need_of,  # noqa: F401
                      subject_words, why_not)
from ..textnorm import normalize

Generate = Callable[[list[dict[str, str]]], str]
# Quote-constrained: the model may write only what the plan allows (labels of the passages it
# read, exact quotes of them, or the abstain sentence), in the format the prompt asks for.
QuoteGenerate = Callable[[list[dict[str, str]], QuotePlan], str]
Status = Literal["answered", "unsupported", "evidence_only", "not_found"]

NOT_FOUND = "not found in the document"
NOT_FOUND_ANSWER = "Not found in the document."


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str
    status: Status
    answer: str | None  # the answer as shown, citations rewritten to their verified labels
    raw_answer: str | None = None  # what the model wrote, kept for audit
    citations: list[Citation] = Field(default_factory=list)
    # A withheld answer's citations (verified, none supporting), shown with --show-draft.
    draft_citations: list[Citation] = Field(default_factory=list)
    evidence: list[Citation] = Field(default_factory=list)  # ranked passages, verified
    context_tokens: int = 0
    timings: dict[str, float] = Field(default_factory=dict)


def evidence_citations(docs: Mapping[str, Document], passages: list[Passage], k: int) -> list[Citation]:
    """Evidence a reader checks: the best-ranked passage of each of the first `k` distinct
    pages (`retrieval.evidence_passages`), cited by its lines."""
    out = []
    for p in evidence_passages(passages, k):
        doc = docs[p.doc_id]
        c = cite_lines(doc, p.span.page, p.span.line_start, p.span.line_end)
        out.append(c.model_copy(update={"segment_id": segment_of(doc, c.span.char_start)}))
    return out


_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


# A free-text answer (a model server's, or a model that did not mark its quotes) often copies
# the clause it relies on into a sentence of its own words: a run of this many words copied
# verbatim from an excerpt the model read is cited as a quote from it.
MIN_COPIED_WORDS = 6


def _copied_span(sentence: str, passage_text: str) -> str | None:
    """The longest run of the sentence's words that the passage has verbatim (after
    normalisation), if it is at least MIN_COPIED_WORDS words and a citable length."""
    from difflib import SequenceMatcher

    words = sentence.split()
    if len(words) < MIN_COPIED_WORDS:
        return None
    key = [normalize(w) for w in words]
    other = [normalize(w) for w in passage_text.split()]
    m = SequenceMatcher(None, key, other, autojunk=False).find_longest_match(0, len(key), 0, len(other))
    if m.size < MIN_COPIED_WORDS:
        return None
    # the run's ends may carry the sentence's own punctuation ("(5) years," vs "years."): trimmed
    span = " ".join(words[m.a:m.a + m.size]).strip('"“”.,;:!? ')
    return span if len(span) >= 25 else None


def _mechanical_citations(answer: str, docs: Mapping[str, Document], passages: list[Passage]) -> list[Citation]:
    """Citations for what an answer copied from an excerpt the model read without marking it:
    a whole sentence found verbatim, else the longest verbatim run of its words (at least
    MIN_COPIED_WORDS), each located on its page and lines."""
    out = []
    cited = {m.start() for m in re.finditer(r"\[[^\]]*LINE", answer)}
    for m in _SENTENCE.finditer(re.sub(r"\[[^\]]*\]", " ", answer) if cited else answer):
        sent = m.group().strip().strip('"“”.!?;: ')
        if len(sent) < 25:
            continue
        ns = normalize(sent)
        whole = next((p for p in passages if ns in normalize(p.text)), None)
        candidates = [(whole, sent)] if whole else [(p, _copied_span(sent, p.text)) for p in passages]
        for p, quote in candidates:
            if not quote:
                continue
            doc = docs[p.doc_id]
            hit = find_quote(doc, quote, p.span.char_start, p.span.char_end)
            if hit:
                c = relocate(doc, hit, quote=quote)
                out.append(c.model_copy(update={"segment_id": segment_of(doc, c.span.char_start)}))
                break
    return out


def answer_question(
    question: str,
    docs: Mapping[str, Document],
    passages: list[Passage],
    generate: Generate | None,
    *,
    budget_tokens: int = 3000,
    count_tokens: Callable[[str], int] = approx_tokens,
    evidence_k: int = 5,
    quote: bool = False,
    quote_from: int | None = None,
    read_k: int | None = None,
    support_check: bool = False,
) -> Answer:
    """Answer `question` from the ranked `passages` of `docs`; `generate=None` gives evidence only.

    `quote`: `generate` is a `QuoteGenerate`, and the answer is the quotes it chose, from the
    `quote_from` best-ranked passages of its context (None: any of them). `read_k`: the
    context is built from the first `read_k` passages only (None: all); evidence draws on all,
    so it can show `evidence_k` distinct pages. `support_check`: an answer none of whose
    verified quotes supports it (`check_answer`) is withheld as not found."""
    t0 = time.perf_counter()
    evidence = evidence_citations(docs, passages, evidence_k)
    if generate is None:
        return Answer(question=question, status="evidence_only", answer=None, evidence=evidence)
    ctx: BuiltContext = build_context(question, docs, passages[:read_k] if read_k else passages,
                                      budget_tokens=budget_tokens, count_tokens=count_tokens)
    t1 = time.perf_counter()
    messages = chat_messages(question, ctx)
    # Constrained decoding only shapes what the model can write; the verifier still checks it.
    # The model reads every chosen passage; quote_from can limit its quotes to the best-ranked.
    quotable = ctx.passages[:quote_from] if quote_from else ctx.passages
    raw = generate(messages, plan_for(quotable, with_doc=len(docs) > 1)) if quote else generate(messages)
    t2 = time.perf_counter()
    answer = check_answer(question, raw, docs, ctx.passages, evidence, withhold=support_check)
    answer.context_tokens = ctx.tokens
    answer.timings.update(context_s=t1 - t0, generate_s=t2 - t1)
    return answer


def check_answer(
    question: str, raw: str, docs: Mapping[str, Document], read: list[Passage], evidence: list[Citation],
    *, withhold: bool = True, need: Need | None = None,
) -> Answer:
    """Verify a model's answer: rewrite verified citations to their labels, mark the rest,
    add mechanical citations for sentences copied from the passages the model `read`, and
    judge whether each verified citation supports an answer to the question (`need`: what the
    question needs, default `need_of(question)` for these documents).

    With `withhold`, an answer with verified citations none of which supports it — or, to a
    numeric question, one that states no figure a supporting quote holds — is "not found":
    the words are on the page, but nothing shows they answer the question. Its citations move
    to `draft_citations`, its text stays in `raw_answer`."""
    default_doc = next(iter(docs)) if len(docs) == 1 else None
    need = need if need is not None else for_documents(need_of(question), docs.values())
    shown, citations = [], []
    pos = 0
    for span in parse_citations(raw):
        c = verify(span, docs, default_doc)
        if c.verified:
            c = c.model_copy(update={"segment_id": segment_of(docs[c.doc_id], c.span.char_start)})
            citations.append(c)
            shown.append(raw[pos : span.start] + c.label(with_doc=len(docs) > 1))
        else:
            citations.append(c)
            shown.append(raw[pos : span.start] + "[unverified citation removed]")
        pos = span.end
    shown.append(raw[pos:])
    text = "".join(shown).strip()
    if not any(c.verified for c in citations):
        citations += _mechanical_citations(raw, docs, read)
    citations = [judge(c, docs[c.doc_id], need) if c.verified else c for c in citations]
    verified = [c for c in citations if c.verified]
    supporting = [c.quote for c in citations if c.supports]
    common = dict(question=question, raw_answer=raw, citations=citations, evidence=evidence)
    answers_figure = not need.numeric or answer_figure_quoted(text, supporting)
    if withhold and verified and not (supporting and answers_figure):
        # Withheld, not hidden: the draft stays in raw_answer and draft_citations.
        common.update(citations=[], draft_citations=citations)
        return Answer(status="not_found", answer=NOT_FOUND_ANSWER, **common)
    if verified:
        return Answer(status="answered", answer=text, **common)
    if NOT_FOUND in normalize(raw):
        return Answer(status="not_found", answer=NOT_FOUND_ANSWER, **common)
    return Answer(status="unsupported", answer=None, **common)


def judge(c: Citation, doc: Document, need: Need) -> Citation:
    """A verified citation with its `supports` verdict (and, when it does not, why)."""
    page = doc.locate(c.span.char_start).page if c.span.char_start is not None else c.span.page
    lines = doc.lines_text(page, c.span.line_start, c.span.line_end) if page else c.quote
    if page and need.years:  # a table row's years head its columns, up to 40 lines above it
        above = doc.page(page).lines[max(0, c.span.line_start - 41):c.span.line_start - 1]
        lines = header_years([ln.text for ln in above]) + "\n" + lines
    why = why_not(c.quote, lines, need)
    return c.model_copy(update={"supports": why is None, "note": f"does not support the answer: {why}" if why else c.note})


def on_subject(quote: str, subject: frozenset[str] | None) -> bool:
    """Whether a quote names the subject at all (kept for bench/abstention_rules.py)."""
    return subject is None or bool(subject & {stem(w) for w in content_words(quote)})


def segment_of(doc: Document, offset: int | None) -> int | None:
    """The index of the segment holding char `offset` (the engine's unit of reading)."""
    if offset is None:
        return None
    for seg in doc.segments:
        if seg.span.char_start <= offset < seg.span.char_end:
            return seg.index
    return None


def answer_read_all(question: str, raw: str, docs: dict[str, Document], ranked: list[Passage],
                    passages: list[Passage], *, evidence_k: int, support_check: bool = True) -> Answer:
    """The answer step of `--read-all`: the model read the whole document, so its raw answer is
    verified against all of the document's `passages`; the evidence is the `ranked` one."""
    evidence = evidence_citations(docs, ranked, evidence_k)
    return check_answer(question, raw, docs, passages, evidence, withhold=support_check)
