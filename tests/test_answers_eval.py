"""The evaluation model (Qwen2.5-Coder-1.5B-Instruct, bench/eval_model.py) answers corpus questions
through the product's own `ask`, scored against the CUAD gold as bench/answer_eval.py scores
them (slow: ~1 minute a question on this CPU)."""

from __future__ import annotations

import pytest

from docqa.app.config import AskSettings
from docqa.app.service import Runtime, ask
from docqa.app.store import Store
from docqa.bench import answer_eval, eval_model
from corpus import CORPUS

# Clauses a reader finds by their heading, in a tune and a held-out contract, and a question the
# held-out contract does not answer (gold: no span).
QUESTIONS = [
    "cuad:contract_IBM_MSL_Outsourcing_Agreement:Governing Law",
    "cuad:contract_KINGPHARMACEUTICALSINC_08_09_2006_EX_10_1_PROMOTION_AGREEMENT:Governing Law",
    "cuad:contract_KINGPHARMACEUTICALSINC_08_09_2006_EX_10_1_PROMOTION_AGREEMENT:Competitive Restriction Exception",
]


@pytest.mark.slow
def test_the_evaluation_model_answers_corpus_questions_right_or_not_at_all(tmp_path):
    gguf = eval_model.path()
    if gguf is None:
        pytest.skip("the evaluation model is not assembled: .venv/bin/python bench/eval_model.py")
    gold = {q["id"]: q for q in answer_eval.questions(CORPUS)}
    qs = [gold[i] for i in QUESTIONS]
    assert [q["answerable"] for q in qs] == [True, True, False]
    store = Store(tmp_path / "docqa.db")
    ids = answer_eval.ingest(store, CORPUS, {q["doc"] for q in qs})
    runtime = Runtime(store)
    verdicts = {}
    for q in qs:
        run = ask(runtime, [ids[q["doc"]]], q["question"], AskSettings(model=str(gguf)))
        docs, _ = runtime.library.load([ids[q["doc"]]])
        shown, verdicts[q["id"]] = answer_eval.outcome(q, answer_eval.record(q, run, docs, 0.0), answer_eval.as_shipped)
        assert (shown == "") == (run.status != "answered"), run.status  # what the product showed
    # Precision first: nothing wrong is shown; and the governing-law clauses are found.
    assert "wrong" not in verdicts.values(), verdicts
    assert sum(v == "right" for v in verdicts.values()) >= 1, verdicts
