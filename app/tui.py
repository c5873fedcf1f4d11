"""`docqa browse`: documents, review jobs, runs and answers in the terminal (textual).

Three screens, each a step deeper: `HomeScreen` (a tree of jobs, runs and documents on the
left, the selected node's rows on the right), `AnswerScreen` (one run: question, answer,
its citations and evidence) and `PageScreen` (one page's numbered lines with the cited
lines highlighted and scrolled into view). Enter goes deeper, escape goes back, q quits.
Everything fits 80x24. Document text is shown as `rich.text.Text`, never parsed as markup.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, OptionList, Static, Tree
from textual.widgets.option_list import Option

from ..pipelines.answer.citations import Citation
from .clikit import printable, terminal_safe
from .jobs import get_job, job_runs, list_jobs
from .runs import Run, get_run, list_runs
from .store import Store

HIGHLIGHT = "bold black on yellow"
STATUS_STYLE = {"answered": "green", "evidence_only": "cyan", "not_found": "dim",
                "unsupported": "dark_orange", "pending": "dim"}


def _one_line(text: str | None, n: int = 60) -> str:
    """On one line, control characters escaped: names, titles and text are data (a file name
    with `\x1b[31m` in it must not drive the terminal)."""
    text = printable(" ".join((text or "").split()))
    return text if len(text) <= n else text[: n - 1] + "…"


# Each view's footer lists every key that does something there. The widgets' own enter keys
# are hidden by textual, so they are re-declared, shown, with what enter does in that view.


class NavTree(Tree):
    BINDINGS = [Binding("enter", "select_cursor", "show rows")]


class Rows(DataTable):
    BINDINGS = [Binding("enter", "select_cursor", "open")]


class Cites(OptionList):
    BINDINGS = [Binding("enter", "select", "open cited page"), Binding("n", "cursor_down", "next", show=False),
                Binding("p", "cursor_up", "previous", show=False)]


class HomeScreen(Screen):
    BINDINGS = [Binding("tab", "app.focus_next", "next pane"), Binding("q", "app.quit", "quit")]
    DEFAULT_CSS = """
    #nav { width: 28; border-right: solid $primary-darken-2; }
    #rows { width: 1fr; }
    """

    def __init__(self, store: Store):
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal():
            yield NavTree("docqa", id="nav")
            yield Rows(id="rows", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        tree = self.query_one("#nav", Tree)
        tree.show_root = False
        jobs = tree.root.add("Jobs", expand=True, data=("jobs", None))
        for job in list_jobs(self.store):
            jobs.add_leaf(Text(_one_line(job.id, 24)), data=("job", job.id))
        tree.root.add_leaf("Runs", data=("runs", None))
        docs = tree.root.add("Documents", expand=True, data=("docs", None))
        for info in self.store.list_documents():
            # a Text label: a str would be read as markup ("[31m" in a name)
            docs.add_leaf(Text(_one_line(info.title or info.path.rsplit("/", 1)[-1], 24)), data=("doc", info.doc_id))
        tree.focus()
        first = next((n for n in jobs.children), None)
        self.show(first.data if first else ("runs", None))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data and event.node.data[0] in ("job", "runs", "doc"):
            self.show(event.node.data)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        if event.node.data and event.node.data[0] in ("job", "runs", "doc"):
            self.query_one("#rows", DataTable).focus()

    def show(self, data: tuple[str, str | None]) -> None:
        """Fill the right pane with the rows of a job, the recent runs, or a document's pages."""
        kind, key = data
        table = self.query_one("#rows", DataTable)
        table.clear(columns=True)
        self.shown = data
        if kind == "job":
            job = get_job(self.store, key)
            runs = job_runs(self.store, key)
            table.add_columns("doc", "item", "status", "answer / evidence")
            for doc_id, _ in job.documents:
                for item in job.checklist.items:
                    run = runs.get((doc_id, item.id))
                    status = run.status if run else "pending"
                    top = (run.answer or (run.evidence[0].quote if run.evidence else "")) if run else ""
                    table.add_row(doc_id[:8], Text(_one_line(item.id)), Text(status, style=STATUS_STYLE.get(status, "")),
                                  Text(_one_line(top, 40)), key=f"run:{run.id}" if run else f"none:{doc_id}:{item.id}")
        elif kind == "runs":
            table.add_columns("run", "status", "question")
            for run in list_runs(self.store, limit=200):
                table.add_row(run.id[-13:], Text(run.status, style=STATUS_STYLE.get(run.status, "")),
                              Text(_one_line(run.question, 50)), key=f"run:{run.id}")
        elif kind == "doc":
            table.add_columns("page", "lines", "first line")
            doc = self.store.get_document(key)
            for p in doc.pages:
                body = [ln.text for ln in p.lines if ln.role == "body" and ln.text.strip()]
                table.add_row(str(p.n) + (f" {p.label}" if p.label else ""), str(len(p.lines)),
                              Text(_one_line(body[0] if body else "", 50)), key=f"page:{key}:{p.n}")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value or ""
        if key.startswith("run:"):
            run = get_run(self.store, key[4:])
            self.app.push_screen(SummaryScreen(self.store, run) if run.kind == "summary" else AnswerScreen(self.store, run))
        elif key.startswith("page:"):
            _, doc_id, n = key.split(":")
            self.app.push_screen(PageScreen(self.store, doc_id, int(n)))


class AnswerScreen(Screen):
    """One run: its question, status and answer above, its citations below."""

    BINDINGS = [Binding("escape", "app.pop_screen", "back"), Binding("q", "app.quit", "quit")]
    DEFAULT_CSS = """
    #answer { height: auto; max-height: 45%; border-bottom: solid $primary-darken-2; padding: 0 1; }
    #cites { height: 1fr; }
    """

    def __init__(self, store: Store, run: Run):
        super().__init__()
        self.store = store
        self.shown_run = run
        shown = [c for c in run.citations if c.verified]
        self.cites: list[tuple[str, Citation]] = ([("cited", c) for c in shown] + [("evidence", c) for c in run.evidence]
                                                  + [("draft", c) for c in run.draft_citations if c.verified])

    def answer_text(self) -> Text:
        r = self.shown_run
        t = Text()
        t.append(f"{_one_line(r.item_id or r.kind)}  ", style="bold")
        t.append(r.status, style=STATUS_STYLE.get(r.status, ""))
        t.append(f"  {r.id}\n", style="dim")
        t.append(_one_line(r.question, 400) + "\n", style="italic")
        if r.answer:
            t.append("\n" + terminal_safe(r.answer))
        elif r.status == "evidence_only":
            t.append("\nNo model: the ranked evidence is below.", style="dim")
        if r.draft_citations:  # withheld: its quotes verify, none supports an answer
            t.append("\n\nWithheld draft (no citation supports it): ", style="dim")
            t.append(_one_line(r.raw_answer or "", 400), style="dim")
        return t

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with VerticalScroll(id="answer"):
            yield Static(self.answer_text(), id="answer-text")
        options = []
        for i, (role, c) in enumerate(self.cites):
            prompt = Text()
            prompt.append("✓ " if c.verified else "✗ ", style="green" if c.verified else "red")
            if c.supports is False:  # verified (on its lines) but not an answer to the question
                prompt.append("≠ ", style="yellow")
            prompt.append(f"{role:<8} {c.label()} ", style="bold")
            prompt.append(_one_line(c.quote, 200))
            options.append(Option(prompt, id=f"c{i}"))
        yield Cites(*options, id="cites")
        yield Footer()

    def on_mount(self) -> None:
        cites = self.query_one("#cites", OptionList)
        cites.focus()
        if cites.option_count:
            cites.highlighted = 0  # enter opens the first citation without a move first

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        _, c = self.cites[int(event.option.id[1:])]
        page = c.span.page if c.span.page is not None else self._page_of_section(c)
        self.app.push_screen(PageScreen(self.store, c.doc_id, page, (c.span.line_start, c.span.line_end)))

    def _page_of_section(self, c: Citation) -> int:
        row = self.store.db.execute("SELECT n FROM pages WHERE doc_id = ? AND label = ?",
                                    [c.doc_id, c.span.element_id]).fetchone()
        return row[0] if row else 1


class SummaryScreen(Screen):
    """A summary (`docqa summarize`): its blocks, one line per sentence with its citations;
    enter on a sentence opens the page with its first cited lines highlighted."""

    BINDINGS = [Binding("escape", "app.pop_screen", "back"), Binding("q", "app.quit", "quit")]

    def __init__(self, store: Store, run: Run):
        from .summarize import get_summary

        super().__init__()
        self.store = store
        self.shown_run = run
        self.summary = get_summary(store, run.id)
        self.rows: list[Citation | None] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        options = []
        multi = len(self.summary.doc_ids) > 1 if self.summary else False
        for b in self.summary.blocks if self.summary else []:
            options.append(Option(Text(_one_line(b.title, 200), style="bold underline"), id=f"s{len(self.rows)}", disabled=True))
            self.rows.append(None)
            for sent in b.sentences:
                prompt = Text()
                prompt.append("✓ ", style="green")
                prompt.append(_one_line(sent.text, 400))
                prompt.append(" " + " ".join(c.label(with_doc=multi) for c in sent.citations), style="dim")
                options.append(Option(prompt, id=f"s{len(self.rows)}"))
                self.rows.append(sent.citations[0])
        yield OptionList(*options, id="sentences")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"{_one_line(self.shown_run.question)}  {self.shown_run.id}"
        self.query_one("#sentences", OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        c = self.rows[int(event.option.id[1:])]
        if c is None:
            return
        page = c.span.page
        if page is None:
            row = self.store.db.execute("SELECT n FROM pages WHERE doc_id = ? AND label = ?",
                                        [c.doc_id, c.span.element_id]).fetchone()
            page = row[0] if row else 1
        self.app.push_screen(PageScreen(self.store, c.doc_id, page, (c.span.line_start, c.span.line_end)))


class PageScreen(Screen):
    """A page's numbered lines; the cited ones highlighted. n/p turn pages."""

    BINDINGS = [Binding("escape", "app.pop_screen", "back"), Binding("n", "turn(1)", "next page"),
                Binding("p", "turn(-1)", "previous page"), Binding("q", "app.quit", "quit")]

    def __init__(self, store: Store, doc_id: str, page: int, cited: tuple[int, int] | None = None):
        super().__init__()
        self.store = store
        self.doc_id = doc_id
        self.page_n = page
        self.cited = cited
        self.cited_page = page if cited else None
        self.pages = store.info(doc_id).pages

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with VerticalScroll(id="page"):
            yield Static(id="page-text")
        yield Footer()

    def on_mount(self) -> None:
        self.render_page()

    def page_text(self) -> Text:
        _, page = self.store.get_page(self.doc_id, self.page_n)
        lo, hi = self.cited if self.cited and self.page_n == self.cited_page else (0, -1)
        width = len(str(len(page.lines)))
        t = Text()
        for ln in page.lines:
            style = HIGHLIGHT if lo <= ln.n <= hi else ("dim" if ln.role != "body" else "")
            t.append(f"{ln.n:>{width}} ", style="dim")
            t.append(printable(ln.text) + "\n", style=style)
        return t

    def render_page(self) -> None:
        label = f"{self.doc_id} page {self.page_n}/{self.pages}"
        if self.cited and self.page_n == self.cited_page:
            label += f", cited lines {self.cited[0]}-{self.cited[1]}"
        self.title = label
        self.query_one("#page-text", Static).update(self.page_text())
        scroll = self.query_one("#page", VerticalScroll)
        target = max(0, self.cited[0] - 3) if self.cited and self.page_n == self.cited_page else 0
        self.call_after_refresh(scroll.scroll_to, y=target, animate=False)

    def action_turn(self, step: int) -> None:
        n = self.page_n + step
        if 1 <= n <= self.pages:
            self.page_n = n
            self.render_page()


class BrowseApp(App):
    TITLE = "docqa browse"

    def __init__(self, store: Store):
        super().__init__()
        self.store = store

    def on_mount(self) -> None:
        self.push_screen(HomeScreen(self.store))
