"""Every view of `docqa browse` lists its keys in the footer, and enter on the answer view's
first citation opens the cited page with the lines highlighted (issue 17: the answer view's
footer showed only `esc back  q quit`, and enter seemed to do nothing)."""

import asyncio

from docqa.app.store import Store
from docqa.app.tui import HIGHLIGHT, AnswerScreen, BrowseApp, HomeScreen, PageScreen

from test_tui import db  # noqa: F401  (the module fixture: an evidence-only review job)


def footer(screen) -> dict[str, str]:
    """What the footer shows: key -> description of the bindings active and shown."""
    return {key: b.binding.description for key, b in screen.active_bindings.items() if b.binding.show}


def test_footer_of_every_view_and_enter_on_a_citation(db):  # noqa: F811
    asyncio.run(_walk(db))


async def _walk(db):
    with Store(db) as store:
        browse = BrowseApp(store)
        async with browse.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            home = browse.screen
            assert isinstance(home, HomeScreen)
            assert footer(home) == {"enter": "show rows", "tab": "next pane", "q": "quit"}
            await pilot.press("tab")
            assert footer(home) == {"enter": "open", "tab": "next pane", "q": "quit"}
            await pilot.press("enter")  # the job's first row
            await pilot.pause()
            answer = browse.screen
            assert isinstance(answer, AnswerScreen)
            assert footer(answer) == {"enter": "open cited page", "escape": "back", "q": "quit"}
            await pilot.press("enter")  # no cursor move first: the first citation opens
            await pilot.pause()
            page = browse.screen
            assert isinstance(page, PageScreen)
            _, c = answer.cites[0]
            assert (page.page_n, page.cited) == (c.span.page, (c.span.line_start, c.span.line_end))
            text = page.page_text()
            lit = [text.plain[s.start:s.end] for s in text.spans if str(s.style) == HIGHLIGHT]
            assert len(lit) == c.span.line_end - c.span.line_start + 1
            assert footer(page) == {"escape": "back", "n": "next page", "p": "previous page", "q": "quit"}
            await pilot.press("escape")
            await pilot.pause()
            assert browse.screen is answer
            await pilot.press("q")
