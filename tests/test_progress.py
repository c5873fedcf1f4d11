"""`docqa ask`'s progress lines when stderr is not a terminal (a log, CI): one line per step,
prefill lines with tokens done/total, rate and time left (issue 17: a default-model ask
printed nothing for minutes)."""

from __future__ import annotations

import io

from rich.console import Console

from docqa.app import cli
from docqa.app.cli import StepProgress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_steps_and_prefill_rate_and_eta_as_lines(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(cli.time, "monotonic", clock)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, highlight=False, markup=False, soft_wrap=True)
    with StepProgress(console, enabled=True) as p:
        p.step("retrieving")
        clock.t += 2
        p.step("loading model")
        clock.t += 3
        p.step("prefilling", 1000, 5000)  # the first chunk: no rate yet
        clock.t += 10
        p.step("prefilling", 2000, 5000)  # 1000 tokens in 10 s: 100 tok/s, 3000 left: 30 s
        p.step("prefilling", 2100, 5000)  # same tenth: no new line
        clock.t += 30
        p.step("prefilling", 5000, 5000)
        clock.t += 5
        p.step("verifying")
    assert buf.getvalue().splitlines() == [
        "retrieving (0 s)",
        "loading model (2 s)",
        "prefilling 1,000/5,000 prompt tokens (5 s)",
        "prefilling 2,000/5,000 prompt tokens (100 tok/s, 30 s left) (15 s)",
        "generating (45 s)",
        "verifying (50 s)",
    ]


def test_disabled_shows_nothing():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False)
    with StepProgress(console, enabled=False) as p:
        p.step("retrieving")
        p.step("prefilling", 10, 20)
    assert buf.getvalue() == ""


def test_an_ask_with_the_model_reports_its_steps_and_prefill_total(tmp_path):
    """Through the CLI with the default model, stderr not a terminal: the steps in order, and
    the last prefill line's total is the prompt the run records (timings.prompt_tokens)."""
    import json
    import re

    from typer.testing import CliRunner

    from docqa.app.cli import app
    from docqa.fixtures.make_pdf import write_sample_contract_pdf

    pdf, db = write_sample_contract_pdf(tmp_path / "c.pdf"), str(tmp_path / "d.db")
    assert CliRunner().invoke(app, ["ingest", str(pdf), "--db", db]).exit_code == 0
    r = CliRunner().invoke(app, ["ask", str(pdf), "Which law governs?", "--max-tokens", "4", "--db", db])
    assert r.exit_code == 0, r.output
    steps = [ln.split(" ")[0] for ln in r.stderr.splitlines() if not ln.startswith("run ")]
    assert [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]] == [
        "retrieving", "loading", "prefilling", "generating", "verifying"]
    last = [ln for ln in r.stderr.splitlines() if ln.startswith("prefilling")][-1]
    total = int(re.match(r"prefilling [\d,]+/([\d,]+) ", last).group(1).replace(",", ""))
    (run,) = json.loads(CliRunner().invoke(app, ["runs", "--json", "--db", db]).stdout)
    assert total == run["timings"]["prompt_tokens"]
    quiet = CliRunner().invoke(app, ["ask", str(pdf), "Which law governs?", "--max-tokens", "4", "--db", db, "-q"])
    assert quiet.exit_code == 0 and quiet.stderr.splitlines()[:-1] == []  # only the `run …` line
