"""`docqa chat DOC…`: one question after another over the same documents, nothing reloaded.

A session holds what `docqa ask` would load for every question: the documents and their
passages (the retrieval state), the model (the engine, or a model server's resolved name),
and — with `--read-all` — the per-document prefix cache, so the second question on a document
prefills only the question. Each answer is stored as a run, exactly as `ask` stores it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from . import config
from .clikit import cli_errors, db_option, err, json_option, open_store, out, printable, terminal_safe

if TYPE_CHECKING:  # `docqa --help` must not import the model stack
    from .runs import Run
    from .service import AskSettings
    from .store import Store

QUIT = frozenset({"quit", "exit", ":q", "/quit", "/exit"})


class ChatSession:
    """Documents, passages and model loaded once; `ask()` per question."""

    def __init__(self, store: Store, refs: list[str], settings: AskSettings):
        from .service import Runtime

        self.refs, self.settings = refs, settings
        self.runtime = Runtime(store)
        self.docs, _ = self.runtime.library.load(refs)  # a bad reference fails here, before any question
        self.model_s = 0.0
        if not settings.evidence_only:
            t = time.perf_counter()
            model = self.runtime.model(settings)  # loads the engine (kept by the runtime) or checks the server
            # A server's model, once resolved, is named so later questions skip /v1/models.
            if model.engine is None:
                self.settings = replace(settings, model=model.name)
            self.model_s = time.perf_counter() - t

    def ask(self, question: str, on_token: Callable[[str], None] | None = None) -> Run:
        from .service import ask

        return ask(self.runtime, self.refs, question, self.settings, on_token=on_token, kind="chat")


def questions(lines: Iterable[str]) -> Iterable[str]:
    """Questions from input lines: blank lines skipped, a quit word ends the session."""
    for line in lines:
        q = line.strip()
        if q.lower() in QUIT:
            return
        if q:
            yield q


def register(app) -> None:
    """Mount `docqa chat` on the CLI."""

    @app.command()
    @cli_errors
    def chat(
        refs: Annotated[list[str], typer.Argument(help="Documents (doc id, id prefix or ingested path).",
                                                  metavar="DOC...")],
        model: Annotated[Optional[str], typer.Option(
            "--model", help="GGUF file, HF checkpoint dir or openai:http://HOST:PORT/v1#MODEL "
            "[default: $DOCQA_MODEL, else SmolLM2-135M-Instruct]")] = None,
        evidence_only: Annotated[bool, typer.Option("--evidence-only", help="No model: ranked cited passages.")] = False,
        read_all: Annotated[bool, typer.Option("--read-all", help="The engine reads the whole document once; "
                                               "later questions prefill only the question.")] = False,
        show_draft: Annotated[bool, typer.Option("--show-draft", help="Show withheld drafts.")] = False,
        free_text: Annotated[bool, typer.Option("--free-text", help="Free text instead of quote-constrained decoding.")] = False,
        max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Longest answer, in tokens.")] = config.AskSettings.max_tokens,
        device: Annotated[Optional[str], typer.Option("--device", help="cpu, cuda, cuda:N or auto")] = None,
        db: db_option = None,
        as_json: json_option = False,
    ) -> None:
        """Ask questions about documents one after another, keeping model and documents loaded.

        Reads one question per line from the terminal (or stdin); an empty line is skipped,
        "quit" or end of input (Ctrl-D) ends the session. Each answer is printed as `docqa ask`
        prints it (with --json: one JSON object per line) and stored as a run.

        Example: docqa chat contract.pdf --read-all
        """
        from .cli import print_run, run_json
        from .ingest import resolve_or_ingest
        from .models import check_ask
        from .service import AskSettings

        settings = AskSettings(model=model, evidence_only=evidence_only, read_all=read_all, quote=not free_text,
                               max_tokens=max_tokens, device=device)
        check_ask(settings)
        interactive = sys.stdin.isatty() and not as_json
        stream = err.is_terminal and not as_json and not evidence_only

        def on_token(delta: str) -> None:
            err.file.write(terminal_safe(delta))
            err.file.flush()

        with open_store(db) as store:
            refs = resolve_or_ingest(store, refs, on_file=lambda p: err.print(
                f"ingesting {printable(str(p))} first (not in the database yet)"))
            session = ChatSession(store, refs, settings)
            if interactive:
                names = ", ".join(printable(d.title or d.doc_id) for d in session.docs.values())
                err.print(f"chat over {names}" + (f" (model loaded in {session.model_s:.1f} s)" if session.model_s else "")
                          + "; one question per line, 'quit' or Ctrl-D ends.")

            def lines():
                while True:
                    try:
                        yield input("? ") if interactive else next(iter_stdin)
                    except (EOFError, StopIteration):
                        return

            iter_stdin = iter(sys.stdin)
            for q in questions(lines()):
                if not (interactive or as_json):  # read from a pipe: each answer under its question
                    out.print(f"? {printable(q)}")
                if stream:
                    err.print("draft (unverified): ", end="")
                run = session.ask(q, on_token=on_token if stream else None)
                if stream:
                    err.print()
                if as_json:  # one object per line, so a script can read answers as they come
                    sys.stdout.write(json.dumps(run_json(run), ensure_ascii=False) + "\n")
                    sys.stdout.flush()
                else:
                    print_run(run, show_draft=show_draft)
                    err.print()

