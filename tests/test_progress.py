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


# --- ingest: pages within a file (issue 17: a 190-page filing showed "0/3" for minutes) ---


def _pdf(tmp_path, pages: int):
    from docqa.fixtures.make_pdf import pdf_bytes

    path = tmp_path / "long.pdf"
    path.write_bytes(pdf_bytes([[f"Body line of page {n}."] for n in range(1, pages + 1)]))
    return path


def test_parse_pdf_reports_every_page(tmp_path):
    from docqa.pipelines.ingest.pdf import parse_pdf

    calls = []
    pages, _ = parse_pdf(_pdf(tmp_path, 12), on_page=lambda *a: calls.append(a))
    assert len(pages) == 12
    assert calls == [("pages", n, 12) for n in range(1, 13)]


def test_ingest_shows_pages_and_rate_within_a_pdf_when_not_a_terminal(tmp_path, monkeypatch):
    """A 20-page PDF, each page read 0.5 s after the one before (a fake clock): a line per
    tenth of the pages, with the rate (2 pages/s) and the time left."""
    from typer.testing import CliRunner

    from docqa.app import clikit
    from docqa.app.cli import app

    ticks = iter(range(10_000))
    monkeypatch.setattr(clikit.IngestProgress, "clock", staticmethod(lambda: 0.5 * next(ticks)))
    pdf = _pdf(tmp_path, 20)
    small = tmp_path / "note.txt"
    small.write_text("A short note.\n")
    r = CliRunner().invoke(app, ["ingest", str(pdf), str(small), "--db", str(tmp_path / "d.db")])
    assert r.exit_code == 0, r.output
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("long.pdf: ")]
    assert progress == [f"long.pdf: {n}/20 pages (2.0 pages/s, {(20 - n) // 2} s left)" for n in range(2, 20, 2)] + [
        "long.pdf: 20/20 pages (2.0 pages/s)"]
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("note.txt")]  # no pages to count
    # --json: stdout is the JSON, stderr keeps only errors
    r = CliRunner().invoke(app, ["ingest", str(pdf), "--json", "--db", str(tmp_path / "e.db")])
    assert r.exit_code == 0 and r.stderr == ""


def test_ingest_progress_times_ocr_from_the_end_of_the_text_pass(monkeypatch):
    """Page OCR follows the text pass: its rate counts from where that pass ended."""
    import io

    from rich.console import Console

    from docqa.app import clikit

    times = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 14.0, 18.0])
    monkeypatch.setattr(clikit.IngestProgress, "clock", staticmethod(lambda: next(times)))
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, highlight=False, markup=False, soft_wrap=True)
    with clikit.IngestProgress(console, 1) as p:
        p.start_file("scan.pdf")  # t=0
        for n in range(1, 11):  # t=1..10: one page a second
            p.page("pages", n, 10)
        p.page("ocr", 1, 2)  # t=14: 4 s for the first OCR'd page
        p.page("ocr", 2, 2)  # t=18
    lines = buf.getvalue().splitlines()
    assert lines[0] == "scan.pdf: 1/10 pages (1.0 pages/s, 9 s left)"
    assert lines[-2:] == ["scan.pdf: 1/2 pages OCR'd (0.2 pages/s, 4 s left)",
                          "scan.pdf: 2/2 pages OCR'd (0.2 pages/s)"]


def test_ingest_progress_on_a_terminal_is_a_page_bar_under_the_file_bar():
    import io

    from rich.console import Console

    from docqa.app import clikit

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with clikit.IngestProgress(console, 2) as p:
        p.start_file("a.pdf")
        for n in range(1, 8):
            p.page("pages", n, 20)
        files, pages = p._bars.tasks
        assert (files.description, files.completed, files.total) == ("a.pdf", 0, 2)
        assert (pages.visible, pages.completed, pages.total) == (True, 7, 20)
        assert pages.fields["rate"].endswith(" s left") and "pages/s" in pages.fields["rate"]
        p.file_done()
        p.start_file("b.txt")  # no pages to count: the page bar is hidden
        assert (files.completed, pages.visible) == (1, False)
