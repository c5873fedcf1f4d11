"""The `docqa` command line: thin typer commands over `app.store` and `app.ingest`.

Each command opens the store and calls the library; typed errors (any `DocqaError`, errors.py)
become one line on stderr and exit code 1. Anything else is a bug: users see one line too, but
with DOCQA_DEBUG=1 (tests set it) it raises with its traceback.

Commands outside this file live in their own modules, each with a `register(app)` that mounts
its commands (or its group, as `engine_cli` mounts `docqa engine`); add the module to the list
at the end. Use `db_option`, `json_option` and `cli_errors` from clikit.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..pipelines.errors import IngestError
from ..pipelines.ingest import SEGMENT_TOKENS
from . import config
from .errors import DocqaError
from .engine_cli import EFFORT_HELP, NO_THINKING_HELP, Effort
from .clikit import (EXIT_ERROR, EXIT_NOTHING_INGESTED, IngestProgress, cli_errors, collect_files, db_option,
                     err, error_line, json_option, open_store, out, print_json, printable, short,
                     terminal_safe)

app = typer.Typer(
    name="docqa",
    help="Ask long documents exact questions; every answer cites page and line.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"docqa {version('docqa')}")
        raise typer.Exit()


@app.callback()
def _main(
    _: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                    help="Print the version and exit.")] = False,
) -> None:
    try:
        config.check_environment()
    except DocqaError as e:
        error_line(str(e))
        raise typer.Exit(EXIT_ERROR) from None


@app.command()
@cli_errors
def ingest(
    paths: Annotated[
        list[Path],
        typer.Argument(help="Files or folders (searched recursively); - reads one document from stdin.",
                       metavar="PATH..."),
    ],
    db: db_option = None,
    as_json: json_option = False,
    segment_tokens: Annotated[
        int,
        typer.Option(help="Target size of the segments the engine reads.", min=64),
    ] = SEGMENT_TOKENS,
) -> None:
    """Ingest PDF, HTML, Markdown and text files into the database.

    Identical content is stored once (the doc id is a hash of the bytes); ingesting it
    again is a no-op, and from a new path only records that path. A file that cannot be
    ingested gets one line on stderr and leaves the database unchanged; the others still
    ingest. Files larger than $DOCQA_MAX_FILE_BYTES (default 200 MB) are refused.

    Exit codes: 0 all ingested; 1 some files failed; 3 nothing ingested.

    Example: docqa ingest contracts/ spec.pdf --json   (or: curl -s URL | docqa ingest -)
    """
    from .ingest import ingest_path, passage_encoder

    max_bytes = config.max_file_bytes()
    files = collect_files(paths)
    encoder = passage_encoder()
    results: list[dict] = []
    failed = 0
    with open_store(db) as store, IngestProgress(err, len(files), lines=not as_json) as progress:
        for f in files:
            progress.start_file(f.name)
            try:
                result = ingest_path(store, f, max_bytes=max_bytes, segment_tokens=segment_tokens, on_page=progress.page,
                                     encoder=encoder)
            except IngestError as e:
                failed += 1
                results.append({"path": str(f), "error": e.reason})
                error_line(str(e))
            except DocqaError:  # the store (busy, damaged) or a setting: every later file would fail too
                raise
            except Exception as e:
                if config.debug():
                    raise
                failed += 1
                reason = f"unexpected {type(e).__name__}: {e}"
                results.append({"path": str(f), "error": reason})
                error_line(f"{f}: {reason}")
            else:
                results.append(result)
                if not as_json:
                    _print_ingested(result)
            progress.file_done()
    if as_json:
        print_json(results)
    if not files:
        from ..pipelines.ingest.source import EXTENSIONS

        error_line("no ingestible files found (supported: " + ", ".join(sorted(EXTENSIONS)) + ")")
    ok = len(results) - failed
    if ok == 0:
        raise typer.Exit(EXIT_NOTHING_INGESTED)
    if failed:
        raise typer.Exit(EXIT_ERROR)


def _print_ingested(r: dict) -> None:
    if "warning" in r:
        err.print(f"warning: {printable(r['path'])}: {r['warning']}")
    note = "" if r["status"] == "added" else f"  ({r['status']})"
    out.print(
        f"{r['doc_id']}  {r['type']:<8} {r['pages']:>5} pages {r['sections']:>5} sections "
        f"{r['anchors']:>6} anchors {r['segments']:>4} segments  {printable(r['path'])}{note}"
    )


@app.command()
@cli_errors
def docs(db: db_option = None, as_json: json_option = False) -> None:
    """List the ingested documents.

    Example: docqa docs --json
    """
    with open_store(db, write=False) as store:
        infos = store.list_documents()
    if as_json:
        print_json([asdict(i) for i in infos])
        return
    if not infos:
        err.print("no documents yet; add some with `docqa ingest PATH`")
        return
    from .tables import docs_table

    out.print(docs_table(infos))


@app.command()
@cli_errors
def show(
    doc: Annotated[str, typer.Argument(help="Doc id, unique id prefix, or an ingested path.")],
    sections: Annotated[bool, typer.Option("--sections", help="The numbered sections.")] = False,
    anchors: Annotated[bool, typer.Option("--anchors", help="The anchor tags.")] = False,
    page: Annotated[
        Optional[int],
        typer.Option("--page", min=1, help="One page's lines, numbered as citations use them."),
    ] = None,
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """Show a document: a summary, its sections, its anchors, or one page's lines.

    For HTML a "page" is one section, labelled with its element id.

    Example: docqa show 3f2a9c01b7de --page 12 --json
    """
    from ..pipelines.ingest.ocr import ocr_note

    with open_store(db, write=False) as store:
        if page is not None:
            doc_id, pg = store.get_page(doc, page)
            _show_page(doc_id, pg, as_json, ocr_note(store.metadata(doc_id), page))
            return
        info = store.info(doc)
        if not (sections or anchors):
            _show_info(info, as_json)
            return
        secs = store.sections(info.doc_id) if sections else None
        ancs = store.anchors(info.doc_id) if anchors else None
    if as_json:
        value: dict = {"doc_id": info.doc_id}
        if secs is not None:
            value["sections"] = [s.model_dump() for s in secs]
        if ancs is not None:
            value["anchors"] = [a.model_dump() for a in ancs]
        print_json(value)
        return
    if secs is not None:
        for s in secs:
            head = f"{s.number} " if s.number else ""
            where = f"p{s.span.page}:{s.span.line_start}-p{s.span.page_end}:{s.span.line_end}"
            out.print(f"{'  ' * (s.level - 1)}{s.id:<6} {head}{printable(s.title)}  [{where}]")
    if ancs is not None:
        from rich.table import Table

        table = Table(box=None, header_style="bold")
        for col in ("type", "subtype", "text", "value", "page:line", "section"):
            table.add_column(col)
        for a in ancs:
            table.add_row(a.type, a.subtype or "", Text(printable(a.text)), Text(printable(a.value)),
                          f"{a.span.page}:{a.span.line_start}", a.section_id or "")
        out.print(table)


def _show_page(doc_id: str, pg, as_json: bool, ocr: str | None = None) -> None:
    if as_json:
        print_json({"doc_id": doc_id, "page": pg.n, "label": pg.label, "ocr": ocr,
                    "lines": [{"n": ln.n, "text": ln.text, "role": ln.role} for ln in pg.lines]})
        return
    label = f" ({pg.label})" if pg.label else ""
    err.print(f"{doc_id} page {pg.n}{label}: {len(pg.lines)} lines" + (f" ({ocr})" if ocr else ""))
    width = len(str(len(pg.lines))) if pg.lines else 1
    for ln in pg.lines:
        mark = {"header": "h", "footer": "f"}.get(ln.role, " ")
        out.print(f"{ln.n:>{width}}{mark} {ln.text}")


def _show_info(info, as_json: bool) -> None:
    if as_json:
        print_json(asdict(info))
        return
    for key in ("doc_id", "type", "title", "pages", "sections", "anchors", "segments",
                "ingested_at"):
        value = getattr(info, key)
        out.print(f"{key:<12} {printable(value) if isinstance(value, str) else value}")
    for p in info.paths:
        out.print(f"{'path':<12} {printable(p)}")


@app.command()
@cli_errors
def ask(
    args: Annotated[
        list[str],
        typer.Argument(help="One or more documents (doc id, id prefix or ingested path), then the question.",
                       metavar="DOC... QUESTION"),
    ],
    model: Annotated[
        Optional[str],
        typer.Option("--model", help="GGUF file, HF checkpoint dir, or an OpenAI-compatible server as "
                     "openai:http://HOST:PORT/v1#MODEL [default: $DOCQA_MODEL, else SmolLM2-135M-Instruct]"),
    ] = None,
    evidence_only: Annotated[
        bool, typer.Option("--evidence-only", help="No model: the ranked, cited passages only.")
    ] = False,
    show_draft: Annotated[
        bool, typer.Option("--show-draft", help="When an answer is withheld (no citation supports it), show "
                           "the model's draft and why each citation does not support it.")
    ] = False,
    read_all: Annotated[
        bool, typer.Option("--read-all", help="The engine reads the whole document (sparse attention; "
                           "its KV is cached, so later questions prefill only the question).")
    ] = False,
    map_reduce: Annotated[
        bool, typer.Option("--map-reduce", help="Read every segment of the documents (map), then merge the "
                           "verified extractions (reduce): for questions over more text than one context; "
                           "resumes where an interrupted run stopped.")
    ] = False,
    free_text: Annotated[
        bool, typer.Option("--free-text", help="Let the model write freely instead of quote-constrained "
                           "decoding (for models that quote unaided; citations are verified either way).")
    ] = False,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest answer, in tokens.")] = config.AskSettings.max_tokens,
    budget: Annotated[int, typer.Option("--budget", min=256, help="Context budget in tokens.")] = config.AskSettings.budget_tokens,
    abstain_margin: Annotated[
        float, typer.Option("--abstain-margin", help="Quote only when the model's log-odds of quoting over "
                            "'Not found in the document.' exceed this (0: the model's bare preference).")
    ] = config.AskSettings.abstain_margin,
    subject_check: Annotated[
        bool, typer.Option("--subject-check/--no-subject-check", help="Withhold an answer none of whose quotes "
                           "supports it: names the question's subject and, for a numeric question, holds a figure "
                           "of the kind and year asked (shown as not found, with the evidence).")
    ] = True,
    device: Annotated[
        Optional[str], typer.Option("--device", help="cpu, cuda, cuda:N or auto [default: $DOCQA_DEVICE, else auto]")
    ] = None,
    no_thinking: Annotated[bool, typer.Option("--no-thinking", help=NO_THINKING_HELP)] = False,
    reasoning_effort: Annotated[Optional[Effort], typer.Option("--reasoning-effort", help=EFFORT_HELP)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no streamed draft on stderr.")] = False,
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """Answer a question about ingested documents, citing page and lines.

    Every citation in the answer is checked against the source: its quoted words must
    appear on the lines it names (verified; a quote found on other lines is re-pointed
    there), and it must answer the question (supports: names its subject; for "how much /
    what was X in YEAR", holds a figure of that kind and year). An answer with no
    supporting citation is shown as not found, with the top evidence.

    Example: docqa ask contract.pdf "What is the notice period for termination?"
    Example: docqa ask 10k.pdf "What were total revenues in 2022?" --model openai:http://127.0.0.1:8080/v1
    """
    from .ingest import resolve_or_ingest
    from .service import AskSettings, Runtime, ask as run_ask

    if len(args) < 2:
        raise typer.BadParameter("give at least one document and the question")
    *refs, question = args
    if not question.strip():
        raise typer.BadParameter("the question is empty")
    settings = AskSettings(model=model, evidence_only=evidence_only, max_tokens=max_tokens,
                           budget_tokens=budget, read_all=read_all, quote=not free_text, device=device,
                           subject_check=subject_check, thinking=False if no_thinking else None,
                           reasoning_effort=reasoning_effort.value if reasoning_effort else None,
                           abstain_margin=abstain_margin)
    if map_reduce and (evidence_only or read_all):
        raise typer.BadParameter("--map-reduce needs a model and reads segments itself")
    from .models import check_ask

    check_ask(settings)
    # On a terminal the draft streams, and until its first token a spinner shows the step;
    # elsewhere (a log, a pipe) each step is a line. --quiet and --json show neither.
    show = not (quiet or as_json)
    stream = show and err.is_terminal and not evidence_only and not map_reduce
    with open_store(db) as store, StepProgress(err, enabled=show and not (map_reduce or evidence_only)) as progress:
        refs = resolve_or_ingest(store, refs, on_file=lambda p: show and err.print(
            f"ingesting {printable(str(p))} first (not in the database yet)"))

        def on_token(delta: str) -> None:
            if progress.active:
                progress.stop()
                err.print("draft (unverified): ", end="")
            err.file.write(terminal_safe(delta))
            err.file.flush()

        if map_reduce:
            run = _map_reduce(Runtime(store), refs, question, settings)
        else:
            run = run_ask(Runtime(store), refs, question, settings, on_token=on_token if stream else None,
                          on_progress=progress.step if show else None)
        if stream and not progress.active:
            err.print()
    if as_json:
        print_json(run_json(run))
    else:
        print_run(run, show_draft=show_draft)


class StepProgress:
    """Where a long `ask` is, on stderr: the step (retrieving, loading model, prefilling,
    generating, verifying) with the elapsed time, and while prefilling the prompt tokens
    done / total with the rate and the time left. On a terminal: a spinner line rewritten in
    place (stopped when the draft starts streaming). Elsewhere: one line per step, and a
    prefill line whenever another tenth of the prompt is done. (An evidence-only ask takes
    under a second and shows none.)"""

    def __init__(self, console, *, enabled: bool):
        self.console, self.enabled = console, enabled
        self.live = enabled and console.is_terminal
        self.t0 = time.monotonic()
        self.active = False
        self._status = None
        self._last = ("", -1)  # (step, tenth) last printed as a line

    def __enter__(self) -> StepProgress:
        if self.live:
            self._status = self.console.status("starting", spinner="dots")
            self._status.start()
            self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.active:
            self._status.stop()
            self.active = False

    def step(self, name: str, done: int = 0, total: int = 0) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        text = f"{name} ({elapsed:.0f} s)"
        tenth = -1
        if name == "prefilling" and total:
            if done >= total:  # the prompt is in: say so (a one-chunk prompt has no other line)
                if not self.live and self._last[0] != "prefilling":
                    self.console.print(f"prefilling {total:,}/{total:,} prompt tokens ({elapsed:.0f} s)")
                name, text = "generating", f"generating ({elapsed:.0f} s)"
            else:
                self._prefill_t0 = getattr(self, "_prefill_t0", None) or (time.monotonic(), done)
                t_start, d_start = self._prefill_t0
                rate = (done - d_start) / max(time.monotonic() - t_start, 1e-9)
                eta = f", {(total - done) / rate:.0f} s left" if rate > 0 and done > d_start else ""
                text = (f"prefilling {done:,}/{total:,} prompt tokens"
                        + (f" ({rate:.0f} tok/s{eta})" if done > d_start else "") + f" ({elapsed:.0f} s)")
                tenth = done * 10 // total
        if self.active:
            self._status.update(text)
        elif not self.live and (name, tenth) != self._last:
            self._last = (name, tenth)
            self.console.print(text)


def _map_reduce(runtime, refs, question, settings):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .mapreduce import map_reduce

    with Progress(TextColumn("reading segments"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("map", total=None)
        return map_reduce(runtime, refs, question, settings,
                          on_progress=lambda done, total: progress.update(task, completed=done, total=total))


def run_json(run) -> dict:
    """The `ask --json` shape of SPEC §3 (plus status, run id, evidence)."""
    cites = run.citations if run.status != "evidence_only" else run.evidence
    return {
        "answer": run.answer,
        "status": run.status,
        "citations": [c.model_dump(exclude={"char_start", "char_end"}) for c in cites],
        "evidence": [c.model_dump(exclude={"char_start", "char_end"}) for c in run.evidence],
        # A withheld answer (or free text shown only as its quotes): what the model wrote and the
        # citations it wrote, each with its verdicts.
        "draft": ({"answer": run.draft, "citations": [c.model_dump(exclude={"char_start", "char_end"})
                                                      for c in run.draft_citations]}
                  if run.draft else None),
        "model": run.model,
        "timings": run.timings,
        "run_id": run.id,
        "question": run.question,
    }


def citation_line(c, *, multi: bool = False) -> str:
    """One citation as the CLI shows it: verified (the words are on those lines) and whether the
    quote answers the question, as two separate verdicts. The second is said as what was checked
    — the model's own yes after the rules, or the rules alone (a stored run, a review) — and not
    as "supports": no judgement measured on the corpus gold yet makes ≥ 90 % of the answers it
    passes right (bench/results/answers.md)."""
    if not c.verified:
        return f"UNVERIFIED {c.label(with_doc=multi)} ({c.note}), not shown as support"
    moved = " (re-pointed: the model named other lines)" if c.relocated else ""
    support = {True: "the model says it answers" if c.confirm_logodds is not None else "on the question's subject",
               False: "does NOT support", None: "support not judged"}[c.supports]
    why = f" ({c.note.removeprefix('does not support the answer: ')})" if c.supports is False and c.note else ""
    return f"verified, {support}{why} {c.label(with_doc=multi)}{moved}: \"{short(c.quote)}\""


def print_run(run, *, show_draft: bool = False) -> None:
    from ..pipelines.answer.query import preview
    from .runs import model_label

    multi = len(run.doc_ids) > 1
    if run.status == "answered":
        out.print(run.answer)
        out.print()
        out.print("citations:")
        for c in run.citations:
            out.print("  " + citation_line(c, multi=multi))
        if run.draft:  # free text shown as its supporting quotes
            out.print("(the model's own words are not shown: they state more than these quotes say"
                      + ("; its draft is below)" if show_draft else "; --show-draft shows them)"))
    elif run.status == "not_found" and run.draft_citations:
        # Withheld: the quotes verify, but none was judged to answer what was asked. That is not
        # "not in the document": the answer may well be in the evidence, so the user is sent there.
        out.print("No confirmed answer: the model quoted the document, but no quote was judged to answer "
                  "the question; read the evidence below"
                  + (" and the draft after it." if show_draft else " (--show-draft shows the draft)."))
    elif run.status == "not_found":
        out.print("Not found in the document (the model found no answer in the passages it read).")
    elif run.status == "unsupported":
        out.print("The model's answer could not be verified against the document, so it is not shown"
                  + (" (--show-draft shows it)." if not show_draft else "; its draft is below."))
    if run.evidence:
        out.print()
        out.print("evidence:")
        for i, c in enumerate(run.evidence, 1):
            out.print(f"  {i}. {c.label(with_doc=multi)} {preview(c.quote, run.question, 160)}")
    if show_draft and run.draft:
        out.print()
        out.print("withheld draft (not an answer):")
        out.print(f"  {short(run.draft, 400)}")
        for c in run.draft_citations:
            out.print("  " + citation_line(c, multi=multi))
    t = run.timings.get("total_s")
    out.file.flush()
    err.print(f"run {run.id}" + (f"  model {model_label(run.model)}" if run.model else "")
              + (f"  {t:.1f} s" if t else ""))


@app.command()
@cli_errors
def runs(
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 20,
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """List recent runs (answers) with their status.

    Example: docqa runs --limit 5 --json
    """
    from .runs import list_runs

    with open_store(db, write=False) as store:
        items = list_runs(store, limit=limit)
    if as_json:
        print_json([run_json(r) | {"created_at": r.created_at, "job_id": r.job_id} for r in items])
        return
    for r in items:
        out.print(f"{r.id}  {r.status:<13} {','.join(r.doc_ids)}  {short(r.question, 70)}")


# The command modules, each mounted the one way: engine (a group), review / export / browse,
# docs / show / path, summarize, chat, serve (imported here: they use the helpers above).
from . import chat, docs_cli, engine_cli, review_cli, serve, summarize  # noqa: E402

for _module in (engine_cli, review_cli, docs_cli, summarize, chat, serve):
    _module.register(app)


def main() -> None:
    app(prog_name="docqa")
