"""Question answering with verified citations.

The model is injected as a function from chat messages to text (`Generate`), so this
module stays a pure function of documents, passages and that function — and tests can run
it with a scripted model. Steps: build the context, generate, parse and verify citations,
attach mechanical citations to answer sentences copied verbatim from the excerpts, and fall
back to the ranked evidence when nothing verifies (SPEC §4: never an unsupported answer
shown as supported). Each verified citation is also judged on whether it *supports* an
answer (pipelines/answer/support.py: the rules, and the model's own yes/no verdict when a
`Confirm` is given); an answer none of whose citations supports it is withheld as "Not found",
and free text that states what no supporting quote says is replaced by those quotes. A
withheld answer's draft is always kept (`raw_answer`, `draft_citations`, `Answer.draft`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .citations import Citation, cite_lines, cited_lines, find_quote, parse_citations, relocate, verify
from .prompt import FREE_TEXT_PROMPT, QUOTE_PROMPT, BuiltContext, approx_tokens, build_context, chat_messages
from ..document import Document, Passage
from .query import content_words, stem  # noqa: F401  (bench/abstention_rules.py imports them from here)
from .quote_constraint import QuotePlan, plan_for
from .retrieval import evidence_passages
from .support import (_AFFIXES, CONFIRM_MARGIN, Confirm, Need, answer_figure_quoted, confirm_messages,  # noqa: F401
                      for_documents, header_years, need_of, subject_words, unbacked, why_not)
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
    # The sentences put to the model's verdict when its own answer was withheld (confirmed_sentence),
    # each with its log-odds: for measuring where the margin should sit; not stored.
    asked: list[Citation] = Field(default_factory=list)
    context_tokens: int = 0
    timings: dict[str, float] = Field(default_factory=dict)

    @property
    def draft(self) -> str | None:
        return draft_of(self.status, self.raw_answer, self.draft_citations)


def draft_of(status: str, raw_answer: str | None, draft_citations: list[Citation]) -> str | None:
    """What the model wrote when it is not what is shown — an answer withheld, or free text
    replaced by its supporting quotes — kept for `--show-draft`, `--json` and reports. None when
    the model abstained or its answer is shown as written."""
    if not raw_answer or not raw_answer.strip():
        return None
    if draft_citations or status == "unsupported":
        return raw_answer
    if status == "not_found" and NOT_FOUND not in normalize(raw_answer):
        return raw_answer
    return None


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
_EDGE_PUNCT = '"“”.,;:!?()'


def _copied_span(sentence: str, passage_text: str) -> str | None:
    """The longest run of the sentence's words that the passage has verbatim (after
    normalisation), if it is at least MIN_COPIED_WORDS words and a citable length."""
    from difflib import SequenceMatcher

    words = sentence.split()
    if len(words) < MIN_COPIED_WORDS:
        return None
    # Words compared without the punctuation around them: "Ohio." ends the answer's sentence
    # where the clause goes on ("Ohio, without …").
    key = [normalize(w).strip(_EDGE_PUNCT) for w in words]
    other = [normalize(w).strip(_EDGE_PUNCT) for w in passage_text.split()]
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
    confirm: Confirm | None = None,
) -> Answer:
    """Answer `question` from the ranked `passages` of `docs`; `generate=None` gives evidence only.

    `quote`: `generate` is a `QuoteGenerate`, and the answer is the quotes it chose, from the
    `quote_from` best-ranked passages of its context (None: any of them). `read_k`: the
    context is built from the first `read_k` passages only (None: all); evidence draws on all,
    so it can show `evidence_k` distinct pages. `support_check`: an answer none of whose
    verified quotes supports it (`check_answer`) is withheld as not found. `confirm`: the
    model's yes/no verdict on each verified quote (see `check_answer`)."""
    t0 = time.perf_counter()
    evidence = evidence_citations(docs, passages, evidence_k)
    if generate is None:
        return Answer(question=question, status="evidence_only", answer=None, evidence=evidence)
    ctx: BuiltContext = build_context(question, docs, passages[:read_k] if read_k else passages,
                                      budget_tokens=budget_tokens, count_tokens=count_tokens)
    t1 = time.perf_counter()
    messages = chat_messages(question, ctx, QUOTE_PROMPT if quote else FREE_TEXT_PROMPT)
    # Constrained decoding only shapes what the model can write; the verifier still checks it.
    # The model reads every chosen passage; quote_from can limit its quotes to the best-ranked.
    quotable = ctx.passages[:quote_from] if quote_from else ctx.passages
    raw = generate(messages, plan_for(quotable, with_doc=len(docs) > 1)) if quote else generate(messages)
    t2 = time.perf_counter()
    need = for_documents(need_of(question), docs.values())
    answer = check_answer(question, raw, docs, ctx.passages, evidence, withhold=support_check, need=need,
                          confirm=confirm)
    if answer.status != "answered" and support_check and confirm is not None:
        answer = confirmed_sentence(answer, docs, ctx.passages[:ASK_PASSAGES], need, confirm)
    t3 = time.perf_counter()
    answer.context_tokens = ctx.tokens
    answer.timings.update(context_s=t1 - t0, generate_s=t2 - t1, verify_s=t3 - t2)
    return answer


def check_answer(
    question: str, raw: str, docs: Mapping[str, Document], read: list[Passage], evidence: list[Citation],
    *, withhold: bool = True, need: Need | None = None, confirm: Confirm | None = None,
) -> Answer:
    """Verify a model's answer: rewrite verified citations to their labels, mark the rest,
    add mechanical citations for sentences copied from the passages the model `read` (failing
    those, a label with no quoted words of its own cites the lines it names, when it read them), and
    judge whether each verified citation supports an answer to the question (`need`: what the
    question needs, default `need_of(question)` for these documents; `confirm`: the model's
    yes/no verdict, which must reach CONFIRM_MARGIN too).

    With `withhold`, an answer with verified citations none of which supports it — or, to a
    numeric question, one that states no figure a supporting quote holds — is "not found":
    the words are on the page, but nothing shows they answer the question; and an answer whose
    own words state what no supporting quote says is shown as those quotes. Either way the
    citations it wrote move to `draft_citations` and its text stays in `raw_answer`."""
    multi = len(docs) > 1
    default_doc = next(iter(docs)) if not multi else None
    need = need if need is not None else for_documents(need_of(question), docs.values())
    spans = parse_citations(raw)
    citations = [verify(span, docs, default_doc) for span in spans]
    mechanical = [] if any(c.verified for c in citations) else _mechanical_citations(raw, docs, read)
    if not any(c.verified for c in citations) and not mechanical:
        # Citations without a quote of their own that verifies (a bare label, or a label after the
        # model's words): the lines each names, when it read them, are the quote to judge.
        citations = [cited_lines(s, docs, default_doc, read) or c for s, c in zip(spans, citations)]
    shown, pos = [], 0
    for span, c in zip(spans, citations):
        shown.append(raw[pos : span.start] + (c.label(with_doc=multi) if c.verified else "[unverified citation removed]"))
        pos = span.end
    shown.append(raw[pos:])
    text = "".join(shown).strip()
    citations = [c.model_copy(update={"segment_id": segment_of(docs[c.doc_id], c.span.char_start)}) if c.verified else c
                 for c in citations] + mechanical
    citations = [judge(c, docs[c.doc_id], need, question, confirm) if c.verified else c for c in citations]
    verified = [c for c in citations if c.verified]
    supporting = [c for c in citations if c.supports]
    if not re.search(r"\w", re.sub(r"\[[^\]]*\]", "", text)):  # labels alone: what they cite is the answer
        text = "\n".join(f'"{c.quote}" {c.label(with_doc=multi)}' for c in supporting or verified)
    common = dict(question=question, raw_answer=raw, citations=citations, evidence=evidence)
    answers_figure = not need.numeric or answer_figure_quoted(text, [c.quote for c in supporting])
    if withhold and verified and not (supporting and answers_figure):
        # Withheld, not hidden: the draft stays in raw_answer and draft_citations.
        common.update(citations=[], draft_citations=citations)
        return Answer(status="not_found", answer=NOT_FOUND_ANSWER, **common)
    if withhold and supporting and unbacked(text, [c.quote for c in supporting], question):
        # The quotes verify and answer, but the prose around them says more than they do.
        quotes = "\n".join(f'"{c.quote}" {c.label(with_doc=multi)}' for c in supporting)
        common.update(citations=supporting, draft_citations=citations)
        return Answer(status="answered", answer=quotes, **common)
    if verified:
        return Answer(status="answered", answer=text, **common)
    if NOT_FOUND in normalize(raw):
        return Answer(status="not_found", answer=NOT_FOUND_ANSWER, **common)
    common.update(citations=[], draft_citations=citations)
    return Answer(status="unsupported", answer=None, **common)


# When the model's own answer is withheld, the sentences of the best-ranked passages it read
# (this many passages, at most ASK_SENTENCES sentences that pass the rules) are each put to its
# yes/no verdict; a sentence is a far smaller question than finding the clause in the context.
ASK_PASSAGES = 3
ASK_SENTENCES = 6
ASK_MAX_CHARS = 500  # longer sentences are asked about clause by clause (at their semicolons)


def confirmed_sentence(answer: Answer, docs: Mapping[str, Document], passages: list[Passage], need: Need,
                       confirm: Confirm) -> Answer:
    """A withheld `answer` replaced by the sentence of `passages` that the rules pass and the
    model confirms with the highest log-odds (at least CONFIRM_MARGIN), quoted and cited, the
    model's own answer kept as the draft; else `answer` as it was. Either way `asked` holds every
    sentence put to the model, with its verdict."""
    from .sentences import clauses, sentences

    asked: list[Citation] = []
    seen: set[tuple[int, int]] = set()
    for p in passages:
        doc = docs[p.doc_id]
        for whole in sentences(doc, [(p.span.char_start, p.span.char_end)]):
            for s in clauses(doc, whole, ASK_MAX_CHARS):
                if len(s.parts) != 1 or (s.start, s.end) in seen or len(asked) >= ASK_SENTENCES:
                    continue
                seen.add((s.start, s.end))
                c = relocate(doc, (s.start, s.end), quote=s.text)
                c = c.model_copy(update={"relocated": False, "segment_id": segment_of(doc, s.start)})
                if judge(c, doc, need).supports:  # the rules first (a table row's years included): no prefill for the rest
                    asked.append(judge(c, doc, need, answer.question, confirm))
    best = max((c for c in asked if c.supports), key=lambda c: c.confirm_logodds, default=None)
    if best is None:
        return answer.model_copy(update={"asked": asked})
    return answer.model_copy(update={
        "status": "answered", "answer": f'"{best.quote}" {best.label(with_doc=len(docs) > 1)}', "citations": [best],
        "draft_citations": answer.citations + answer.draft_citations, "asked": asked})


def judge(c: Citation, doc: Document, need: Need, question: str | None = None,
          confirm: Confirm | None = None) -> Citation:
    """A verified citation with its `supports` verdict (and, when it does not, why): the rules
    of `need`, then, when `confirm` is given, the model's log-odds that the quote answers the
    `question` (kept in `confirm_logodds`), which must reach CONFIRM_MARGIN."""
    page = doc.locate(c.span.char_start).page if c.span.char_start is not None else c.span.page
    lines = doc.lines_text(page, c.span.line_start, c.span.line_end) if page else c.quote
    if page and need.years:  # a table row's years head its columns, up to 40 lines above it
        above = doc.page(page).lines[max(0, c.span.line_start - 41):c.span.line_start - 1]
        lines = header_years([ln.text for ln in above]) + "\n" + lines
    why = why_not(c.quote, lines, need)
    logodds = confirm(confirm_messages(question, c.quote)) if confirm is not None and question else None
    if why is None and logodds is not None and logodds < CONFIRM_MARGIN:
        why = f"the model does not judge that it answers the question (log-odds {logodds:+.1f})"
    return c.model_copy(update={"supports": why is None, "confirm_logodds": logodds,
                                "note": f"does not support the answer: {why}" if why else c.note})


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
                    passages: list[Passage], *, evidence_k: int, support_check: bool = True,
                    confirm: Confirm | None = None) -> Answer:
    """The answer step of `--read-all`: the model read the whole document, so its raw answer is
    verified against all of the document's `passages`; the evidence is the `ranked` one."""
    evidence = evidence_citations(docs, ranked, evidence_k)
    return check_answer(question, raw, docs, passages, evidence, withhold=support_check, confirm=confirm)
