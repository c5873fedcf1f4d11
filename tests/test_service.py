"""The library service's engine side: `ask --read-all`'s prompt is cut where the question
goes, so that what comes before it is the same for every question (the document's prefix the
prefix cache stores) and the two parts together are the chat template's own rendering."""

from __future__ import annotations

import pytest

from docqa.app.models import _SLOT, read_all_messages
from docqa.engine.chat import render_chat, split_prompt, template_of
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.ingest.build import ingest_file


@pytest.fixture(scope="module")
def tokenizer():
    from docqa.engine.generate import Engine

    return Engine.load_tokenizer(None)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return ingest_file(write_sample_contract_pdf(tmp_path_factory.mktemp("svc") / "contract.pdf"))


def test_read_all_prompt_splits_into_a_shared_prefix_and_the_question(tokenizer, doc):
    questions = ["Which law governs this agreement?", "What is the annual license fee?"]
    parts = [split_prompt(tokenizer, read_all_messages(doc, _SLOT), _SLOT, q) for q in questions]
    (prefix_a, rest_a), (prefix_b, rest_b) = parts
    assert prefix_a == prefix_b and rest_a != rest_b  # the document is read once for both
    assert len(prefix_a) > 10 * len(rest_a)  # the document is in the prefix, not in the rest
    for q, (prefix, rest) in zip(questions, parts):
        # The reference: the template rendered with the question in place, in one piece.
        whole = render_chat(template_of(tokenizer), read_all_messages(doc, q),
                            bos_token=tokenizer.token_text(tokenizer.bos_id),
                            eos_token=tokenizer.token_text(tokenizer.eos_id))
        text = tokenizer.decode(prefix, skip_special=False) + tokenizer.decode(rest, skip_special=False)
        assert text == whole
        assert q in tokenizer.decode(rest, skip_special=False)


def test_read_all_prompt_is_tokenized_once_for_the_prefetch_and_the_answer(tokenizer, doc):
    """`Engine.load(prefetch=prompt)` tokenizes the document while the weights load; the answer
    step then reuses those ids (a 128K-token document is not tokenized twice per question)."""
    from docqa.app.config import AskSettings
    from docqa.app.models import ReadAllPrompt

    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, *a, **k):
            calls.append(1)
            return tokenizer.encode(*a, **k)

    q = "Which law governs this agreement?"
    prompt = ReadAllPrompt(doc, q, AskSettings())
    key, prefix, capacity = prompt(Counting())
    want_prefix, want_rest = split_prompt(tokenizer, read_all_messages(doc, _SLOT), _SLOT, q)
    assert key == doc.content_sha256 and prefix == want_prefix
    assert capacity > len(want_prefix) + len(want_rest)  # room for the answer too
    n = len(calls)
    assert prompt.ids(Counting())[:2] == (want_prefix, want_rest) and len(calls) == n
