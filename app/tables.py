"""The tables `docqa docs` and `docqa review` print: readable at 80 columns. Narrow columns
(ids, counts, status) never wrap; the long one (a title, an answer) wraps — folding a file
name without spaces — so no column is ever dropped or cut to a few characters."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from .clikit import printable, terminal_safe


def docs_table(infos) -> Table:
    """One row per document (`Store.list_documents()`): id, type, pages, sections, and its
    title with the file name under it (the file alone when it has no title)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("doc id", no_wrap=True, min_width=12)
    table.add_column("type", no_wrap=True)
    table.add_column("pages", justify="right", no_wrap=True)
    table.add_column("sections", justify="right", no_wrap=True)
    table.add_column("title / file", overflow="fold", ratio=1)
    for i in infos:
        name = printable(Path(i.path).name)
        shown = Text(name)
        if i.title and i.title != Path(i.path).name:
            shown = Text(printable(i.title))
            shown.append(f"\n{name}", style="dim")
        table.add_row(i.doc_id, i.type, str(i.pages), str(i.sections), shown)
    return table


def review_table(rows: list[tuple[str, str, str]]) -> Table:
    """A review job's items for one document: (item id, status, answer or top citation)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    width = max((len(item) for item, _, _ in rows), default=4)
    table.add_column("item", no_wrap=True, min_width=min(width, 30), overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("answer / top citation", overflow="fold", ratio=1)
    for item, status, text in rows:
        table.add_row(printable(item), status, Text(terminal_safe(text)))
    return table
