"""`docqa review`, `docqa export` and `docqa browse`: thin commands over app.review,
app.export and app.tui, registered on the main app by `register(app)`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.text import Text

from ..pipelines.errors import IngestError
from . import config
from .clikit import (EXIT_ERROR, EXIT_NOTHING_INGESTED, cli_errors, collect_files, db_option, err,
                     error_line, json_option, open_store, out, print_json, printable, short)
from .engine_cli import EFFORT_HELP, NO_THINKING_HELP, Effort
from .errors import DocqaError

if TYPE_CHECKING:  # imported for annotations only: `docqa --help` must not load the store
    from .store import Store


def _documents(store: Store, paths: list[Path], executor=None, on_file=None) -> list[tuple[str, str]]:
    """(doc_id, path) for every PATH: files and folders are ingested if new; a PATH that is
    not a file may name an ingested document (doc id or prefix). With an executor whose
    workers do not share the database (Ray), new files are parsed on the workers and
    stored here."""
    docs: list[tuple[str, str]] = []
    files = collect_files([p for p in paths if p.exists()])
    for p in paths:
        if not p.exists():
            try:
                did = store.resolve(str(p))
            except DocqaError:
                raise DocqaError(f"{p}: no such file, folder or ingested document") from None
            docs.append((did, store.info(did).path))
    if executor is not None and not executor.shares_database:
        return list(dict.fromkeys(docs + _ingest_remote(store, files, executor, on_file)))
    from .ingest import ingest_path, passage_encoder

    encoder = passage_encoder()  # MiniLM is loaded on the first new document only
    for f in files:
        try:
            r = ingest_path(store, f, encoder=encoder)
        except IngestError as e:
            error_line(str(e))
            continue
        docs.append((r["doc_id"], r["path"]))
    return list(dict.fromkeys(docs))


def _ingest_remote(store: Store, files: list[Path], executor, on_file) -> list[tuple[str, str]]:
    """Parse new files on the executor's workers (the file's bytes travel with the task, so
    workers need no shared filesystem); store each document here as it comes back."""
    from .ingest import add_known, add_record, open_source, parse_source

    docs, new, order = [], [], {}
    for f in files:
        try:
            source = open_source(f)
        except IngestError as e:
            error_line(str(e))
            continue
        order.setdefault(source.doc_id, len(order))
        if add_known(store, source) is not None:
            docs.append((source.doc_id, str(source.path)))
        else:
            new.append(source)
    if on_file:
        on_file(None, len(new))
    for source, out in executor.map(parse_source, new):
        if "error" in out:
            error_line(out["error"])
        else:
            add_record(store, source, out["record"])
            docs.append((source.doc_id, str(source.path)))
        if on_file:
            on_file(source, len(new))
    return sorted(docs, key=lambda d: order[d[0]])  # as the files were named, not as parsed


def review(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders (ingested if new), or doc ids.", metavar="PATH...")],
    checklist: Annotated[str, typer.Option("--checklist", help="Checklist file (.yaml/.toml), or a built-in name: contract_review, spec_review.")],
    job: Annotated[Optional[str], typer.Option("--job", help="Job name; the same name resumes the job [default: from checklist, documents and mode].")] = None,
    evidence_only: Annotated[bool, typer.Option("--evidence-only", help="No model: each item's ranked, cited passages.")] = False,
    model: Annotated[Optional[str], typer.Option("--model", help="GGUF file or HF checkpoint dir [default: $DOCQA_MODEL, else SmolLM2-135M-Instruct]")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Local: worker processes for --evidence-only jobs (a model runs in this process) [default: 1]. Ray: workers [default: one per GPU with a model, else one per CPU].")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local (this machine) or ray (workers on a Ray cluster; the database stays here).")] = "local",
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster: auto (joins `ray start` here) or ray://HOST:PORT [default: a local cluster for this job].")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest answer, in tokens.")] = config.AskSettings.max_tokens,
    no_thinking: Annotated[bool, typer.Option("--no-thinking", help=NO_THINKING_HELP)] = False,
    reasoning_effort: Annotated[Optional[Effort], typer.Option("--reasoning-effort", help=EFFORT_HELP)] = None,
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """Review documents with a checklist: every item asked of every document.

    Answers are stored per item with verified citations. The job is resumable: run the
    same command again (or with the same --job) after an interruption, even a kill, and
    it answers only what is missing; no item is ever answered twice. Items with
    `compare: [a, b]` report [CONFLICT: a vs b] findings citing both clauses.

    With --executor ray, workers (one model each) parse new files and answer items; this
    process alone reads and writes the database. A lost worker's items are retried.

    Exit codes: 0 every item answered; 1 some items failed (run again to retry);
    3 no document to review.

    Example: docqa review contracts/ --checklist contract_review --job q3 --evidence-only

    Example: docqa review contracts/ --checklist contract_review --executor ray --address auto
    """
    from .models import check_ask, check_thinking
    from .service import AskSettings
    from .checklist import load_checklist
    from .executor import RayExecutor, local_executor
    from .review import run_review

    if executor not in ("local", "ray"):
        raise typer.BadParameter("--executor is local or ray")
    if address is not None and executor != "ray":
        raise typer.BadParameter("--address applies to --executor ray")
    if executor == "local" and (workers or 1) > 1 and not evidence_only:
        raise typer.BadParameter("--workers applies to --evidence-only jobs; a model runs in one process")
    cl = load_checklist(checklist)
    settings = AskSettings(model=model, evidence_only=evidence_only, max_tokens=max_tokens,
                           thinking=False if no_thinking else None,
                           reasoning_effort=reasoning_effort.value if reasoning_effort else None)
    check_ask(settings)
    if not evidence_only:
        check_thinking(settings)  # once, before any item is asked
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    runner = (RayExecutor(address, workers, gpus=not evidence_only) if executor == "ray"
              else local_executor(workers or 1))
    with open_store(db) as store, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    ) as progress:
        parse_bar = None

        def on_file(source, total: int) -> None:
            nonlocal parse_bar
            if parse_bar is None:
                parse_bar = progress.add_task("parse", total=total)
            elif source is not None:
                progress.update(parse_bar, advance=1, description=f"parse {short(source.path.name, 24)}")

        try:
            docs = _documents(store, paths, runner, on_file)
            if not docs:
                error_line("no document to review")
                raise typer.Exit(EXIT_NOTHING_INGESTED)
            names = {d: Path(p).name for d, p in docs}
            bar = progress.add_task("review", total=None)

            def on_start(total: int, done: int) -> None:
                progress.update(bar, total=total, completed=done)

            def on_done(task: dict, result: dict) -> None:
                name = names.get(task["doc_id"], task["doc_id"])
                progress.update(bar, advance=1, description=f"{short(name, 30)} · {task['item']['id']}")
                if "error" in result:
                    error_line(f"{name}: {task['item']['id']}: {result['error']}")

            summary = run_review(store, cl, docs, job_id=job, settings=settings,
                                 executor=runner, on_start=on_start, on_done=on_done)
        finally:
            getattr(runner, "close", lambda: None)()
        progress.stop()
        if as_json:
            print_json(summary.as_json())
        else:
            _print_summary(store, summary)
    if summary.failed:
        raise typer.Exit(EXIT_ERROR)


def _print_summary(store: Store, summary) -> None:
    from .jobs import get_job, job_runs
    from .tables import review_table

    job = get_job(store, summary.job_id)
    runs = job_runs(store, job.id)
    for doc_id, path in job.documents:
        out.print(Text(f"{doc_id}  {printable(path)}"))
        rows = []
        for item in job.checklist.items:
            run = runs.get((doc_id, item.id))
            if run is None:
                rows.append((item.id, "pending", ""))
                continue
            shown = [c for c in run.citations if c.verified] or run.evidence
            text = run.answer or (f"{shown[0].label()} {shown[0].quote}" if shown else "")
            rows.append((item.id, run.status, short(text, 160)))
        out.print(review_table(rows))
    err.print(
        f"job {printable(summary.job_id)}: {summary.answered_now} answered now, {summary.done_before} already done, "
        f"{len(summary.failed)} failed, {summary.conflicts} conflict finding(s) in {summary.elapsed_s:.1f} s; "
        f"report: docqa export {shlex.quote(summary.job_id)} --format html -o report.html"
    )


def export(
    ref: Annotated[str, typer.Argument(help="A review job name or a run id (see `docqa runs`).", metavar="RUN_OR_JOB")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="md, html or json.")] = "md",
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="File to write [default: stdout].", dir_okay=False)] = None,
    db: db_option = None,
) -> None:
    """Export a run or a review job as a citation-backed report.

    HTML is one self-contained file (inline CSS, no scripts, no external loads) with a
    table per document; citations link to the source (file.pdf#page=N, file.html#id).
    All document text is escaped.

    Example: docqa export q3 --format html -o q3-review.html
    """
    from .export import export as render

    with open_store(db, write=False) as store:
        text = render(store, ref, fmt)  # type: ignore[arg-type]
    if output is None or str(output) == "-":
        out.file.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        raise DocqaError(f"cannot write {output}: {e.strerror or e}") from None
    err.print(f"wrote {output} ({fmt}, {len(text.encode()):,} bytes)")


def browse(db: db_option = None) -> None:
    """Browse documents, review jobs, runs and answers in the terminal.

    Keys: tab/shift+tab move between panes, enter opens, c cites (shows the cited lines
    highlighted in their page), escape goes back, q quits.

    Example: docqa browse --db review.db
    """
    from .tui import BrowseApp

    with open_store(db, write=False) as store:
        BrowseApp(store).run()


def register(app: typer.Typer) -> None:
    app.command()(cli_errors(review))
    app.command()(cli_errors(export))
    app.command()(cli_errors(browse))
