"""Stored names, titles and text are data on the terminal (issue 31 item 2): a file name or a
document line with control characters (`\\n`, `\\x1b[31m`) is printed escaped by `ingest`,
`docs`, `show` and `browse`, kept exactly in `--json`, and never read as markup by the TUI."""

import asyncio
import json

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.app.store import Store
from docqa.app.tui import BrowseApp, HomeScreen, PageScreen

NAME = "bad\nline\x1b[31mname [bold]x.txt"
SHOWN = "bad\\nline\\x1b[31mname [bold]x.txt"
BODY = "1. TERMS \x1b[32mGREEN\n\nThe Supplier shall deliver\x07 the goods.\n"


def invoke(*args):
    return CliRunner().invoke(app, list(args), env={"DOCQA_DEBUG": "1"})


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("names")
    path = tmp / NAME
    path.write_text(BODY)
    db = tmp / "n.db"
    r = invoke("ingest", str(path), "--db", str(db))
    assert r.exit_code == 0, r.output
    assert SHOWN in r.stdout and "\x1b" not in r.output
    with Store(db) as store:
        (info,) = store.list_documents()
    return db, path, info.doc_id


def test_docs_and_show_escape_the_name_and_json_keeps_it(ingested):
    db, path, doc_id = ingested
    for args in (["docs"], ["show", doc_id]):
        r = invoke(*args, "--db", str(db))
        assert r.exit_code == 0 and "\x1b" not in r.output and "\x07" not in r.output, r.output
        assert SHOWN in r.stdout.replace("\n", "") if args == ["docs"] else SHOWN in r.stdout
    shown = json.loads(invoke("show", doc_id, "--json", "--db", str(db)).stdout)
    assert shown["paths"] == [str(path)] and shown["path"] == str(path)
    assert json.loads(invoke("docs", "--json", "--db", str(db)).stdout)[0]["path"] == str(path)


def test_page_lines_titles_and_evidence_are_escaped(ingested):
    db, _, doc_id = ingested
    r = invoke("show", doc_id, "--page", "1", "--db", str(db))
    assert "1. TERMS \\x1b[32mGREEN" in r.stdout and "deliver\\x07 the" in r.stdout and "\x1b" not in r.output
    r = invoke("rename", doc_id, "Title \x1b]0;pwned\x07 set", "--db", str(db))
    assert r.exit_code == 0 and "Title \\x1b]0;pwned\\x07 set" in r.stdout and "\x1b" not in r.output
    r = invoke("docs", "--db", str(db))
    assert "Title \\x1b]0;pwned\\x07 set" in r.stdout and "\x1b" not in r.output
    r = invoke("ask", doc_id, "What shall the Supplier deliver?", "--evidence-only", "--db", str(db))
    assert r.exit_code == 0 and "deliver\\x07 the goods" in r.stdout and "\x07" not in r.output
    invoke("rename", doc_id, "plain", "--db", str(db))


def test_browse_shows_the_name_escaped_and_not_as_markup(ingested):
    db, _, doc_id = ingested
    asyncio.run(_browse(db, doc_id))


async def _browse(db, doc_id):
    with Store(db) as store:
        store.db.execute("UPDATE documents SET title = NULL")
        browse = BrowseApp(store)
        async with browse.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            home = browse.screen
            assert isinstance(home, HomeScreen)
            leaves = [n for n in home.query_one("#nav").root.children if str(n.label) == "Documents"][0].children
            # on one line (whitespace joined), the escape written out, the brackets as they are
            assert [n.label.plain for n in leaves] == ["bad line\\x1b[31mname [b…"]
            page = PageScreen(store, doc_id, 1)
            await browse.push_screen(page)
            await pilot.pause()
            plain = page.page_text().plain
            assert "TERMS \\x1b[32mGREEN" in plain and "\x1b" not in plain and "\x07" not in plain
