"""An interrupted answer keeps its text in JupyterLab (issue 32 item 5): kill -9 of the server while an
answer streams, start it again; the same page shows the partial answer with its marker ("Interrupted by a
server restart"), then the interruption marker, then the answer of the resumed turn, which read the cut text.

A real ``jupyter lab`` with the built labextension, headless Chromium, a scripted model streaming slowly;
items found by their test ids and text. Setup as in ``test_browser.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .browser import (
    LabPage,
    api,
    goals_ready,
    item,
    jp_asyncio_loop,  # noqa: F401 - Playwright keeps its own loop (see there)
    open_session_view,
    require_chromium,
    run_jupyter_lab,
    transcript,
    wait_until,
)
from .servers import write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()

CHUNKS = [f"alpha-{i} " for i in range(60)]
CUT_TEXT = "alpha-0 alpha-1 alpha-2"
CONTINUED = "Continued after the cut."


def test_kill_9_mid_stream_shows_the_partial_answer_with_its_marker(browser: Browser, tmp_path: Path) -> None:
    model = write_script(tmp_path / "stream.json", [
        {"when": {"any_text_contains": CUT_TEXT}, "respond": {"text": CONTINUED}},
        {"when": {"last_user_contains": "stream please"}, "respond": {"stream_chunks": CHUNKS, "chunk_delay_s": 0.25}},
    ])
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "stream chat", "model": model,
                                               "permissions": {"mode": "bypass"}})["session_id"]
        lab = LabPage.open(browser, server)
        try:
            view = open_session_view(lab, sid)
            lab.page.evaluate("() => { window.__goalsSamePage = true; }")
            api(server, "POST", f"sessions/{sid}/messages", {"text": "stream please", "client_request_id": "m1"})
            draft = view.locator('[data-testid="goals-draft"]')
            draft.filter(has_text=CUT_TEXT + " alpha-3").wait_for(timeout=30_000)  # streaming, shown live

            server.kill()
            server.restart()
            goals_ready(server)

            partial = item(view, "assistant", CUT_TEXT).filter(has_text="Interrupted by a server restart")
            partial.wait_for(timeout=60_000)
            assert "the answer was cut short here; its partial text is kept" in partial.inner_text()
            item(view, "assistant", CONTINUED).wait_for(timeout=60_000)  # the resumed turn read the cut text
            draft.wait_for(state="hidden", timeout=10_000)
            kinds = view.locator('[data-testid="goals-item"]').evaluate_all(
                "(nodes) => nodes.map((n) => [n.dataset.kind, n.textContent])")
            order = [kind for kind, _ in kinds if kind in ("assistant", "interruption")]
            assert order == ["assistant", "interruption", "assistant"], kinds
            assert lab.page.evaluate("() => window.__goalsSamePage === true"), "the page was reloaded"
            items = transcript(server, sid)
            cut = [i for i in items if i["meta"].get("interrupted")]
            assert len(cut) == 1 and cut[0]["meta"]["interrupted"] == "restart"
            wait_until(lambda: api(server, "GET", f"sessions/{sid}")["work"]["phase"] == "done", "the turn to finish")
            lab.screenshot(tmp_path / "partial-answer.png")
        finally:
            lab.close()
