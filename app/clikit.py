"""What every command module shares: consoles, options, error handling, exit codes.

Kept apart from `cli.py` so command modules (`engine_cli`, `review_cli`) import it without
importing each other.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer
from rich.console import Console

from . import config
from .errors import DocqaError

if TYPE_CHECKING:
    from .store import Store

# Exit codes (documented in `docqa ingest --help`).
EXIT_OK = 0
EXIT_ERROR = 1  # a typed error, or some files failed to ingest while others succeeded
EXIT_NOTHING_INGESTED = 3  # every file failed, or no ingestible file was found

class TextConsole(Console):
    """A console for text that is data (document text, names, titles, answers): brackets are
    never markup, `:name:` never an emoji, and a control character in a printed string is
    written as an escape (`terminal_safe`), so no document, file name or answer drives the
    terminal. Rich `Text` (tables) is built from escaped strings by its makers."""

    def __init__(self, **kwargs):
        super().__init__(highlight=False, markup=False, emoji=False, soft_wrap=True, **kwargs)

    def print(self, *objects, **kwargs) -> None:
        super().print(*(terminal_safe(o) if isinstance(o, str) else o for o in objects), **kwargs)


out = TextConsole()
err = TextConsole(stderr=True)

db_option = Annotated[
    Optional[Path],
    typer.Option(
        "--db",
        help="SQLite database file [default: $DOCQA_DB, else $XDG_DATA_HOME/docqa/docqa.db]",
        dir_okay=False,
        show_default=False,
    ),
]
json_option = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


# The store, the parsers and the engine are imported inside the functions that use them:
# `docqa --help`, `docs` and `show` must not pay for torch (see bench/startup.py).


def open_store(db: Path | None, *, write: bool = True) -> Store:
    """The database of `--db` (else the default). A damaged one is refused for a command that
    writes (`StoreDamaged`, before any work) and read with a one-line warning otherwise."""
    from .errors import StoreDamaged
    from .store import Store

    store = Store(db if db is not None else config.default_db_path())
    if store.damage is not None:
        if write:
            store.close()
            raise StoreDamaged(store.path, store.damage)
        err.print(f"warning: database {printable(str(store.path))} is damaged ({printable(store.damage)}): what is "
                  "read from it may be incomplete or wrong, and docqa will not write to it")
    return store


_CONTROL = {i: f"\\x{i:02x}" for i in (*range(0x20), *range(0x7f, 0xa0))} | {
    0x09: "\\t", 0x0a: "\\n", 0x0d: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"}


_CONTROL_BUT_LINES = {k: v for k, v in _CONTROL.items() if k not in (0x09, 0x0a)}


def printable(text: str) -> str:
    """Control characters written as escapes (`\\n`, `\\x1b`): a file name with a newline must
    not split a one-line message, nor one with ANSI codes drive the terminal. For every
    stored name and title, and anything shown on one line."""
    return text.translate(_CONTROL)


def terminal_safe(text: str) -> str:
    """As `printable`, but newlines and tabs kept: for text of several lines (an answer, a
    page). What `out` and `err` do to every string they print."""
    return text.translate(_CONTROL_BUT_LINES)


def error_line(message: str) -> None:
    err.print(f"error: {printable(message)}")


def cli_errors(command: Callable) -> Callable:
    """Turn typed errors into one stderr line and exit 1; hide tracebacks unless debugging."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException, KeyboardInterrupt, SystemExit):
            raise  # click prints a usage error (typer.BadParameter) with the usage line, exit 2
        except Exception as e:
            if isinstance(e, DocqaError):  # the pipelines' and the engine's errors included
                error_line(str(e))
                raise typer.Exit(EXIT_ERROR) from None
            if config.debug():
                raise
            error_line(f"unexpected {type(e).__name__}: {e} (DOCQA_DEBUG=1 shows the traceback)")
            raise typer.Exit(EXIT_ERROR) from None

    return wrapper


def print_json(value) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")


def collect_files(paths: list[Path]) -> list[Path]:
    """Files named directly (any type: an unsupported one is then reported) and, below
    folders, the files with a supported extension, sorted, skipping hidden ones."""
    from ..pipelines.ingest.source import EXTENSIONS
    from .ingest import STDIN

    found: list[Path] = []
    for p in paths:
        if p == STDIN:
            found.append(p)
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p).parts
                if f.is_file() and f.suffix.lower() in EXTENSIONS and not any(
                    part.startswith(".") for part in rel
                ):
                    found.append(f)
        else:
            found.append(p)
    return list(dict.fromkeys(found))


class IngestProgress:
    """Where an ingest is, on stderr: files done / total and, inside a PDF, its pages read /
    total with the parse rate and the time left (a 200-page filing takes minutes, and "0/3
    files" said nothing for all of them). On a terminal: a bar for the files and one for the
    current PDF's pages, rewritten in place and gone at the end. Elsewhere (a log, CI): a line
    each time another tenth of a PDF of `_LINE_PAGES` pages or more is read (smaller files
    take under a second) or of its pages to OCR, and none at all without `lines`."""

    _LINE_PAGES = 10
    # What each step counts: pages read, pages OCR'd, passages given their vectors.
    _STEPS = {"pages": ("pages", "pages"), "ocr": ("pages OCR'd", "pages"), "encoding": ("passages encoded", "passages")}
    clock = staticmethod(time.monotonic)  # a test sets its own

    def __init__(self, console: Console, files: int, *, lines: bool = True):
        self.console, self.files = console, files
        self.live = console.is_terminal
        self.lines = lines and not self.live
        self.name = ""
        self._bars = None
        self._step, self._t0, self._last = "", 0.0, 0.0  # the step, when it began, the last call
        self._tenth = ("", -1)

    def __enter__(self) -> IngestProgress:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                  console=self.console, transient=True)
            self._bars.start()
            self._files = self._bars.add_task("ingesting", total=self.files, rate="")
            self._pages = self._bars.add_task("  pages", total=None, visible=False, rate="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bars is not None:
            self._bars.stop()

    def start_file(self, name: str) -> None:
        self.name = printable(name)
        self._step, self._last = "", self.clock()
        self._tenth = ("", -1)
        if self._bars is not None:
            self._bars.update(self._files, description=self.name)
            self._bars.update(self._pages, visible=False, completed=0, total=None, rate="")

    def page(self, step: str, done: int, total: int) -> None:
        """The parser's `on_page` callback: step "pages" (text), "ocr" or "encoding" (passage vectors)."""
        now = self.clock()
        if step != self._step:
            # a step is timed from where the one before it ended (OCR follows the text pass)
            self._step, self._t0 = step, self._last
        self._last = now
        rate = done / max(now - self._t0, 1e-9)
        left = f", {(total - done) / rate:.0f} s left" if done < total and rate > 0 else ""
        what, unit = self._STEPS.get(step, (step, "items"))
        if self._bars is not None:
            self._bars.update(self._pages, visible=True, completed=done, total=total,
                              description=f"  {what}", rate=f"{rate:.1f} {unit}/s{left}")
        elif self.lines and (total >= self._LINE_PAGES or step == "ocr"):  # OCR: seconds a page
            tenth = done * 10 // total
            if (step, tenth) != self._tenth and tenth > 0:
                self._tenth = (step, tenth)
                self.console.print(f"{self.name}: {done:,}/{total:,} {what} ({rate:.1f} {unit}/s{left})")

    def file_done(self) -> None:
        if self._bars is not None:
            self._bars.advance(self._files)
            self._bars.update(self._pages, visible=False)


def short(text: str, n: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
