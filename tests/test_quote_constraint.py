"""Quote-constrained decoding: whatever the model's scores, it writes only exact quotes of the
passages it read, under their own labels, or abstains; the verifier still checks everything."""

import random
import string

import pytest
import torch
from docqa.engine.generate import Engine
from docqa.pipelines.answer.citations import parse_citations, verify
from docqa.pipelines.document import RawLine, RawPage, assemble
from docqa.pipelines.ingest.passages import make_passages
from docqa.pipelines.answer.qa import answer_question
from docqa.pipelines.answer.quote_constraint import (
    ABSTAIN,
    QuoteDecoder,
    TokenTable,
    norm_cased,
    plan_for,
)
from docqa.pipelines.textnorm import normalize

PAGES = [
    ["SERVICES AGREEMENT", "", "1. Term. This Agreement begins on the Effective Date and", "continues for five (5) years."],
    ["8. Termination.", "Either party may terminate this Agreement for convenience upon",
     "ninety (90) days' prior written notice to the other party (the \"Notice\")."],
    ["12. Governing Law. This Agreement is governed by the laws of the", "State of New York, without regard to conflict of laws",
     "principles. Any dis-", "pute shall be resolved in New York City \u2013 Manhattan."],
]
DOC = assemble(
    [RawPage(lines=[RawLine(text=t) for t in p]) for p in PAGES],
    doc_id="feedbeef0002", content_sha256="2" * 64, path="agreement.txt", type="text",
)
DOCS = {DOC.doc_id: DOC}
PASSAGES = make_passages(DOC)


@pytest.fixture(scope="module")
def tokenizer():
    return Engine.load_tokenizer()  # the default model's; no weights are read


@pytest.fixture(scope="module")
def table(tokenizer):
    return TokenTable.from_tokenizer(tokenizer)


def run(decoder, score, max_tokens=160):
    """Drive the decoder as Engine.generate does, with `score(step)` standing in for the model."""
    out = []
    for step in range(max_tokens):
        token = decoder(score(step, out), out)
        if token in decoder.table.stop_ids:
            break
        out.append(token)
    return out


def test_token_texts_concatenate_to_the_decoded_text(tokenizer, table):
    ids = tokenizer.encode('"Either party may terminate" [PAGE:2, LINE:1-2] \u2013 caf\u00e9', add_bos=False)
    assert "".join(table.texts[i] for i in ids) == tokenizer.decode(ids)


@pytest.mark.parametrize("seed", range(12))
def test_random_scores_only_ever_write_verifiable_quotes_under_allowed_labels(tokenizer, table, seed):
    rng = random.Random(seed)
    plan = plan_for(PASSAGES, min_quote_chars=rng.choice([12, 20]))
    g = torch.Generator().manual_seed(seed)
    vocab = len(table.texts)
    quote_id, not_id = table.encode('"')[0], table.encode(ABSTAIN)[0]
    opening = rng.random() < 0.8  # mostly quote, sometimes abstain
    max_tokens = rng.choice([48, 160])  # a tight limit must still end on a whole label

    def score(step, out):
        logits = torch.randn(vocab, generator=g)
        if step == 0:
            logits[quote_id if opening else not_id] += 50
        return logits

    decoder = QuoteDecoder(plan, table, max_tokens=max_tokens)
    out = run(decoder, score, max_tokens)
    text = tokenizer.decode(out)
    if not opening:
        assert text == ABSTAIN and decoder.abstained
        return
    spans = parse_citations(text)
    assert spans and len(spans) == len(decoder.cited) and text.endswith("]"), text
    by_label = dict(zip(plan.labels, plan.sources))
    for span, (quote, label) in zip(spans, decoder.cited):
        assert label in plan.labels
        assert f"[PAGE:{span.span.page}, LINE:{span.span.line_start}-{span.span.line_end}]" == label
        assert span.quote == quote
        # A substring of the cited passage, case included; and the verifier agrees on its own.
        assert norm_cased(quote) in norm_cased(by_label[label])
        c = verify(span, DOCS, DOC.doc_id)
        assert c.verified and not c.relocated, (text, c.note)
    assert len({label for _, label in decoder.cited}) == len(decoder.cited)  # each passage once


def _favouring(table, wants):
    """Scores that rank the tokens spelling `wants(step)` (strings, most wanted first) on top."""
    def score(step, out):
        logits = torch.zeros(len(table.texts))
        for rank, want in enumerate(wants(step)):
            for i in table.by_text.get(want, []):
                logits[i] = 10.0 - rank
        return logits
    return score


def _script(steps, then):
    return lambda step: steps[step] if step < len(steps) else then


def _label_of(text):
    (p,) = [p for p in PASSAGES if text in p.text]
    return p.cite_label()


def test_labels_are_restricted_to_the_passages_holding_the_quote(tokenizer, table):
    plan = plan_for(PASSAGES, min_quote_chars=12)
    decoder = QuoteDecoder(plan, table)
    # The model insists on quoting the governing-law clause, then on citing page 9, line 1.
    script = [['"'], ["State"], [" of"], [" New"], [" York"], ['"'], [" ["], ["PAGE"], [":"], ["9"], [","],
              [" LINE"], [":"], ["1"], ["]"]]
    out = run(decoder, _favouring(table, _script(script, ["\n"])), 40)
    label = _label_of("State of New York")
    assert tokenizer.decode(out).startswith(f'"State of New York" {label}'), tokenizer.decode(out)
    assert decoder.cited == [("State of New York", label)]


def test_a_quote_cannot_be_closed_before_the_minimum_or_mid_word(tokenizer, table):
    plan = plan_for(PASSAGES, min_quote_chars=15)
    decoder = QuoteDecoder(plan, table)
    # The model wants to close after "State of New" (12 chars), then again mid-word ("Yo").
    script = [['"'], ["State"], [" of"], [" New"], ['"', " Yo"], ['"', "rk"], ['"', ","], ['"']]
    out = run(decoder, _favouring(table, _script(script, ['"'])), 40)
    quote = decoder.cited[0][0]
    assert quote == "State of New York"
    assert tokenizer.decode(out).startswith(f'"{quote}" {_label_of(quote)}')


def _first_step(table, first: dict[str, float], then):
    """Scores whose first step puts the named tokens at the given logits and every other token
    far below (a trained model's long tail), then follow `_favouring(table, then)`."""
    later = _favouring(table, then)

    def score(step, out):
        if step:
            return later(step - 1, out)
        logits = torch.full((len(table.texts),), -30.0)
        for text, value in first.items():
            logits[table.by_text[text][0]] = value
        return logits
    return score


def test_abstain_when_the_model_prefers_it(tokenizer, table):
    decoder = QuoteDecoder(plan_for(PASSAGES), table)
    # "No" spells the start of "Not found…" but is not the abstain choice: "Not" is.
    out = run(decoder, _first_step(table, {"Not": 0.0, "No": -1.0, '"': -2.0}, lambda step: ["xyz"]), 40)
    assert tokenizer.decode(out) == ABSTAIN and decoder.abstained and not decoder.cited


def test_abstain_margin_asks_for_more_than_a_bare_preference(tokenizer, table):
    """The model's log-odds of answering at all over abstaining is one unit (P("Not") =
    e^-1 / (1 + e^-1)): that quotes by default, and abstains when more confidence is asked
    for; the margin is kept for audit either way."""
    scores = _first_step(table, {'"': 0.0, "Not": -1.0}, _script([["State"]], ['"']))
    quoting = QuoteDecoder(plan_for(PASSAGES), table)
    run(quoting, scores, 40)
    assert quoting.cited and not quoting.abstained
    assert quoting.quote_margin == pytest.approx(1.0, abs=1e-4)
    careful = QuoteDecoder(plan_for(PASSAGES), table, abstain_margin=2.0)
    out = run(careful, scores, 40)
    assert tokenizer.decode(out) == ABSTAIN and careful.abstained and not careful.cited
    assert careful.quote_margin == pytest.approx(1.0, abs=1e-4)


def test_an_answer_in_the_models_own_words_counts_as_answering(tokenizer, table):
    """An instruct model starts its answers with a word ("The", "[PAGE") far more often than
    with a quote mark: that weight counts for answering, and the answer is then a quote."""
    scores = _first_step(table, {"The": 0.0, "Not": -2.0, '"': -6.0}, _script([["State"]], ['"']))
    decoder = QuoteDecoder(plan_for(PASSAGES), table)
    out = run(decoder, scores, 40)
    assert decoder.cited and tokenizer.decode(out).startswith('"State')
    # log((1 + e^-6) / e^-2): every first word but "Not" against "Not"
    assert decoder.quote_margin == pytest.approx(2.0 + float(torch.tensor([0.0, -6.0]).logsumexp(0)), abs=1e-4)


def test_a_yes_no_no_does_not_count_as_abstaining(tokenizer, table):
    decoder = QuoteDecoder(plan_for(PASSAGES), table)
    run(decoder, _favouring(table, _script([["No", '"', "Not"], ["State"]], ['"'])), 40)
    assert not decoder.abstained and decoder.cited


def test_no_passages_leaves_only_the_abstain_sentence(tokenizer, table):
    decoder = QuoteDecoder(plan_for([]), table)
    out = run(decoder, _favouring(table, lambda step: ['"']), 40)
    assert tokenizer.decode(out) == ABSTAIN


def test_quote_mode_answers_are_still_verified_independently():
    """A scripted quote-mode model that writes a fabricated quote is not shown as supported:
    the plan shapes decoding, it is not a certificate."""
    seen = {}

    def fake(messages, plan):
        seen["plan"] = plan
        return '"terminate this Agreement at any time" [PAGE:2, LINE:1-3]'

    ans = answer_question("How can it be terminated?", DOCS, PASSAGES, fake, quote=True)
    assert ans.status == "unsupported" and not any(c.verified for c in ans.citations)
    assert set(seen["plan"].labels) == {p.cite_label() for p in PASSAGES}

    def honest(messages, plan):
        return '"may terminate this Agreement for convenience" [PAGE:2, LINE:1-3]'

    ans = answer_question("How can it be terminated?", DOCS, PASSAGES, honest, quote=True)
    assert ans.status == "answered"
    (c,) = [c for c in ans.citations if c.verified]
    assert normalize(c.quote) in normalize(DOC.lines_text(2, c.span.line_start, c.span.line_end))

    ans = answer_question("Is there a non-compete?", DOCS, PASSAGES, lambda m, p: ABSTAIN, quote=True)
    assert ans.status == "not_found"


def test_invisible_tokens_cannot_fill_a_quote(tokenizer, table):
    """Tokens of only characters the normalisation deletes (soft hyphen, zero-width space; Gemma
    3's vocabulary has them) would keep any quote matching: a model that ranks them first must
    still write the source's words."""
    wide = TokenTable(table.texts + ["\u200b", " \u00ad", "\u200b\u200b"], table.stop_ids, table.encode)
    invisible = ["\u200b", " \u00ad", "\u200b\u200b"]
    decoder = QuoteDecoder(plan_for(PASSAGES), wide, max_tokens=80)
    script = [['"'], ["State"]] + [invisible + [w] for w in [" of", " New", " York", ","]] + [invisible + ['"']]
    out = run(decoder, _favouring(wide, _script(script, invisible + ['"'])), 80)
    assert not set(out) & set(range(len(table.texts), len(wide.texts)))
    quote = decoder.cited[0][0]  # too short to close at "York," (20 characters at least)
    assert quote.startswith("State of New York, ") and quote.isprintable() and "\u00ad" not in quote


def test_an_opening_curly_quote_does_not_close_a_quote(tokenizer, table):
    """Gemma 3 closed a quote with \u201c once: the parsed quote kept it and no longer matched the
    source lines. Only " and \u201d close."""
    wide = TokenTable(table.texts + ["\u201c", "\u201e"], table.stop_ids, table.encode)
    decoder = QuoteDecoder(plan_for(PASSAGES, min_quote_chars=15), wide, max_tokens=80)
    script = [['"'], ["State"], [" of"], [" New"], [" York"], ["\u201c", "\u201e", ","], ["\u201c", "\u201e", '"']]
    out = run(decoder, _favouring(wide, _script(script, ["\u201c", '"'])), 80)
    assert not set(out) & {len(table.texts), len(table.texts) + 1}
    quote = decoder.cited[0][0]
    assert quote == "State of New York,"
    (c,) = parse_citations(table_decode(wide, out))[:1]
    assert normalize(c.quote) in normalize(DOC.text)


def table_decode(table, ids):
    return "".join(table.texts[i] for i in ids)


def test_a_quote_opened_by_a_merged_token_counts_and_is_written():
    """Qwen's vocabulary (like GPT-4's) writes '"State' as one token and seldom predicts the
    bare mark before a word: a quote may open with such a token, which writes its first word
    (one whose word is in no passage may not)."""
    words = ['"', "Not", " found", " in", " the", " document", '"State', " of", " New", " York", " [", "PAGE",
             " LINE", '"Delaware']
    texts = words + [c for c in string.printable if c not in words and c.isprintable()] + ["<eos>"]
    table = TokenTable(texts, [len(texts) - 1], lambda s: [texts.index(t) for t in _spell(texts, s)])
    ids = {t: i for i, t in enumerate(texts)}

    def score(step, out):
        logits = torch.full((len(texts),), -20.0)
        if step == 0:  # the bare mark is unlikely, the merged opener likely, "Delaware" is in no passage
            logits[ids['"']], logits[ids["Not"]], logits[ids['"State']], logits[ids['"Delaware']] = -6.0, -1.0, 0.0, 0.5
            return logits
        for want in [" of", " New", " York", '"', " [", "PAGE", ":", "3", ",", " LINE", ":", "1", "-", "2", "]"]:
            logits[ids[want]] = 1.0 if want != '"' else 0.5
        return logits

    decoder = QuoteDecoder(plan_for(PASSAGES, min_quote_chars=12), table, max_tokens=40)
    out = run(decoder, score, 40)
    assert out[0] == ids['"State'] and not decoder.abstained
    assert decoder.cited and decoder.cited[0][0].startswith("State of New York")
    span, = parse_citations(table_decode(table, out))[:1]
    assert verify(span, DOCS, DOC.doc_id).verified


def _spell(texts, s):
    """Greedy longest-match spelling of `s` in a toy vocabulary."""
    out, i = [], 0
    while i < len(s):
        t = max((t for t in texts if s.startswith(t, i)), key=len)
        out.append(t)
        i += len(t)
    return out
