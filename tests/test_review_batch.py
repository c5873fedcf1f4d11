"""Review and summarize submit a job's items together on a decoder that batches (the Triton
Llama-family decoder: CPU tensors under the Triton interpreter here, a GPU by default there):
every item's stored answer equals the one `ask` gives it alone — the same quote-constrained
tokens, the same verification — and a summary's extractions equal those read one at a time.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_cuda_engine import slow_on_cpu, triton_runs  # noqa: E402
from test_engine_vs_hf import make_tiny_hf_dir  # noqa: E402

from docqa.app.checklist import parse_checklist  # noqa: E402
from docqa.app.ingest import ingest_path  # noqa: E402
from docqa.app.jobs import job_runs  # noqa: E402
from docqa.app.store import Store  # noqa: E402

CHECKLIST = """
name: two
items:
  - id: law
    question: Which law governs the agreement?
    hints: [governed by]
  - id: notice
    question: How much notice ends the agreement?
    hints: [notice, terminate]
"""
CONTRACT = ("MASTER SERVICES AGREEMENT\n\n1. Term. This Agreement continues for two (2) years.\n\n"
            "2. Termination. Either party may terminate this Agreement upon thirty (30) days' written notice.\n\n"
            "3. Governing Law. This Agreement is governed by the laws of the State of New York.\n")


@pytest.fixture
def triton_loads(monkeypatch):
    """Engines load with the Triton decoder on any device (the product picks it on CUDA only), in
    fp32: greedy tokens batched and alone are compared exactly (bf16 has near-ties)."""
    import torch

    from docqa.engine.generate import Engine

    load = Engine.load.__func__
    fixed = {"kernels": "triton", "dtype": torch.float32}
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: load(cls, *a, **(k | fixed))))


@triton_runs
@slow_on_cpu  # minutes under the interpreter (two ~700-token prompts each way); by default on a GPU
def test_review_items_batched_equal_each_asked_alone(tmp_path, triton_loads):
    from docqa.app.review import _worker, run_review
    from docqa.app.service import AskSettings, Runtime, ask
    from docqa.engine.batch import BatchSession

    make_tiny_hf_dir(tmp_path / "m", "llama")
    (tmp_path / "c.txt").write_text(CONTRACT)
    settings = AskSettings(model=str(tmp_path / "m"), max_tokens=5, budget_tokens=120, passages=2, evidence=2,
                           abstain_margin=-1e9)  # random weights: always quote, so quotes are chosen and checked
    checklist = parse_checklist(CHECKLIST, fmt="yaml")
    with Store(tmp_path / "a.db") as store:
        doc = ingest_path(store, tmp_path / "c.txt")["doc_id"]
        summary = run_review(store, checklist, [(doc, "c.txt")], settings=settings)
        assert summary.answered_now == 2 and not summary.failed
        loaded = _worker(str(store.path.resolve())).model(settings).engine
        session = loaded.engine.batch_session()
        assert isinstance(session, BatchSession) and loaded.batch is None  # closed after the job
        assert session.scheduler._next_id == 2  # both items' requests went through the batch
        got = {item: shown(run) for (_, item), run in job_runs(store, summary.job_id).items()}
    with Store(tmp_path / "b.db") as store:
        ingest_path(store, tmp_path / "c.txt")
        runtime = Runtime(store)
        want = {item.id: shown(ask(runtime, [doc], item.question, settings, query=item.query()))
                for item in checklist.items}
    assert got == want
    assert all(w[2] for w in want.values()), want  # the model wrote something: not two empty answers compared


def shown(run):
    """What a reader of a run sees: its status and answer, the model's text, each citation."""
    return (run.status, run.answer, run.raw_answer, [(c.label(), c.verified, c.supports) for c in run.citations],
            [(c.label(), c.supports) for c in run.draft_citations], [c.label() for c in run.evidence])


class OneByOne:
    """An executor (app/executor.py) that runs tasks one after another in this process and is not
    the serial executor, so nothing is batched: the reference."""

    shares_database = True

    def map(self, fn, tasks):
        for task in tasks:
            yield task, fn(task)


@triton_runs
@slow_on_cpu
def test_summary_segments_batched_equal_those_read_one_at_a_time(tmp_path, triton_loads):
    from docqa.app.summarize import SummarizeSettings, _extractions, model_id, settings_key, summarize
    from docqa.app.summarize import generate_for

    make_tiny_hf_dir(tmp_path / "m", "llama")
    (tmp_path / "c.txt").write_text(CONTRACT)
    settings = SummarizeSettings(model=str(tmp_path / "m"), length="brief", max_tokens=5, cluster="section")
    got = {}
    for name, executor in (("batched", None), ("one", OneByOne())):
        with Store(tmp_path / f"{name}.db") as store:
            doc = ingest_path(store, tmp_path / "c.txt", segment_tokens=48)["doc_id"]
            run, _ = summarize(store, [doc], settings, executor=executor)
            key = settings_key(model_id(settings), settings)
            got[name] = (run.answer, {k: e.model_dump() for k, e in _extractions(store, key, [doc]).items()})
    assert len(got["one"][1]) >= 3  # segments enough to batch
    assert got["batched"] == got["one"]
    session = generate_for(settings).loaded.engine.batch_session()
    assert session.scheduler._next_id >= len(got["one"][1])  # the batched run's segments went through it
