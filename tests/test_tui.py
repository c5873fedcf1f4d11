"""`docqa browse` driven by textual's pilot at 80x24: job -> answer -> cited page."""

import asyncio

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.app.store import Store
from docqa.app.tui import AnswerScreen, BrowseApp, HomeScreen, PageScreen, HIGHLIGHT
from docqa.fixtures.make_pdf import write_sample_contract_pdf


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tui")
    pdf = write_sample_contract_pdf(tmp / "sample_contract.pdf")
    db = tmp / "t.db"
    r = CliRunner().invoke(app, ["review", str(pdf), "--checklist", "contract_review", "--job", "tui",
                                 "--evidence-only", "--db", str(db)], env={"DOCQA_DEBUG": "1"})
    assert r.exit_code == 0, r.output
    return db


def test_job_answer_and_highlighted_citation(db):
    asyncio.run(_job_answer_and_highlighted_citation(db))


async def _job_answer_and_highlighted_citation(db):
    with Store(db) as store:
        browse = BrowseApp(store)
        async with browse.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert isinstance(browse.screen, HomeScreen) and browse.screen.shown == ("job", "tui")
            await pilot.press("tab")
            # termination_for_convenience is the checklist's 9th item.
            await pilot.press(*["down"] * 8, "enter")
            await pilot.pause()
            screen = browse.screen
            assert isinstance(screen, AnswerScreen)
            assert screen.shown_run.item_id == "termination_for_convenience"
            await pilot.press("enter")  # the top evidence
            await pilot.pause()
            page = browse.screen
            assert isinstance(page, PageScreen) and (page.page_n, page.cited) == (2, (7, 8))
            text = page.page_text()
            lit = {text.plain[s.start:s.end].strip() for s in text.spans if str(s.style) == HIGHLIGHT}
            # Exactly the two source lines of clause 3.2 are highlighted.
            assert lit == {"3.2 Termination for Convenience. Customer may terminate this Agreement for convenience upon",
                           "ninety (90) days' prior written notice to Licensor."}
            await pilot.press("n")
            assert page.page_n == 3 and not any(str(s.style) == HIGHLIGHT for s in page.page_text().spans)
            await pilot.press("escape", "escape")
            await pilot.pause()
            assert isinstance(browse.screen, HomeScreen)


def test_documents_and_runs_nodes(db):
    asyncio.run(_documents_and_runs_nodes(db))


async def _documents_and_runs_nodes(db):
    with Store(db) as store:
        browse = BrowseApp(store)
        async with browse.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            home = browse.screen
            await pilot.press("down", "down")  # past the job to Runs
            await pilot.pause()
            assert home.shown == ("runs", None)
            await pilot.press("down", "down")  # Documents, then the document
            await pilot.pause()
            assert home.shown[0] == "doc"
            await pilot.press("tab", "down", "enter")
            await pilot.pause()
            assert isinstance(browse.screen, PageScreen) and browse.screen.page_n == 2
            await pilot.press("q")
