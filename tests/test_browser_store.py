"""The page's one client-side store (issue 32 item 8): every view of a session shows what one store holds,
fed by the event stream. A rename is shown from its event in the chat's heading, the panel's row and its
detail with no REST read at all; a message's answer reaches the chat and the panel's detail through the
store's shared forward read (no whole-snapshot, history or Goal read of the session); an answered approval
leaves the "Waiting for you" list from its event alone.

Each absence is proved against the evidence that the change was shown: with views that read REST on
events, the new title or the emptied list could only appear after the read, so the read would be in the
page's request log before the change showed. A real server and JupyterLab with the built labextension,
headless Chromium, a scripted model. Setup as in ``test_browser.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from .browser import (
    LabPage,
    api,
    goals_ready,
    jp_asyncio_loop,  # noqa: F401 - Playwright keeps its own loop (see there)
    open_session_view,
    require_chromium,
    run_jupyter_lab,
    wait_until,
)
from .servers import write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Request

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()


class Requests:
    """The REST requests the page starts (the event stream left out), as ``METHOD path?query``."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []

    def __call__(self, request: Request) -> None:
        parts = urlsplit(request.url)
        if "/api/goals/" in parts.path and not parts.path.rstrip("/").endswith("/api/goals/events"):
            path = parts.path.split("/api/goals/", 1)[1]
            query = "&".join(q for q in parts.query.split("&") if q and not q.split("=")[0].isdigit())
            self.seen.append((time.monotonic(), f"{request.method} {path}" + (f"?{query}" if query else "")))

    def since(self, start: float) -> list[str]:
        return [what for at, what in self.seen if at >= start]

    def quiet(self, lab: LabPage, seconds: float = 1.5, within: float = 20) -> None:
        """Until the page made no request for ``seconds`` (the views' first reads are over)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            lab.page.wait_for_timeout(200)
            last = self.seen[-1][0] if self.seen else 0.0
            if time.monotonic() - last >= seconds:
                return
        raise AssertionError(f"the page never went quiet: {self.seen[-10:]}")


def test_views_of_a_session_share_the_store_and_apply_whole_changes_without_reading(
        browser: Browser, tmp_path: Path) -> None:
    model = write_script(tmp_path / "store.json", [
        {"when": {"last_user_contains": "ping"}, "respond": {"text": "pong"}},
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "written"}},
        {"when": {"last_user_contains": "write"},
         "respond": {"tool_calls": [{"name": "write_file", "arguments": {"path": "w.txt", "content": "x"}}]}},
    ], default={"text": "ok"})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "Store chat", "model": model,
                                               "permissions": {"mode": "ask"}})["session_id"]
        lab = LabPage.open(browser, server)
        requests = Requests()
        lab.page.on("request", requests)
        try:
            lab.open_goals_sidebar()
            row = lab.page.locator(f'{lab.sidebar} [data-testid="goals-session"][data-session-id="{sid}"]')
            row.click()  # selects it (the panel's detail) and opens its chat in the main area
            view = open_session_view(lab, sid)
            view.get_by_role("heading", name="Store chat").wait_for()
            detail = lab.page.locator(f'{lab.sidebar} [data-testid="goals-detail"]')
            detail.locator('[data-testid="goals-detail-title"]').filter(has_text="Store chat").wait_for()
            requests.quiet(lab)

            # a rename: its event carries the new title, shown by the chat, the row and the detail unread
            start = time.monotonic()
            api(server, "PATCH", f"sessions/{sid}", {"title": "Renamed chat"})
            view.get_by_role("heading", name="Renamed chat").wait_for(timeout=10_000)
            row.locator('[data-testid="goals-session-title"]').filter(has_text="Renamed chat").wait_for(timeout=10_000)
            detail.locator('[data-testid="goals-detail-title"]').filter(has_text="Renamed chat").wait_for(
                timeout=10_000)
            assert requests.since(start) == [], requests.since(start)

            # a message: the chat and the detail are fed by the same forward reads of the store
            start = time.monotonic()
            api(server, "POST", f"sessions/{sid}/messages", {"text": "ping", "client_request_id": "store-1"})
            view.locator('[data-testid="goals-item"][data-kind="assistant"]').filter(has_text="pong").wait_for(
                timeout=30_000)
            detail.locator('[data-testid="goals-detail-phase"]').filter(has_text="done").wait_for(timeout=30_000)
            reads = [r for r in requests.since(start) if r.startswith(f"GET sessions/{sid}")]
            assert reads and all("after=" in r and "limit=500" in r for r in reads), reads
            assert not [r for r in requests.since(start) if "/history" in r or r.startswith("GET goals/")], \
                requests.since(start)

            # an approval: listed in "Waiting for you"; approved elsewhere, it leaves the list from its event
            api(server, "POST", f"sessions/{sid}/messages", {"text": "write it", "client_request_id": "store-2"})
            inbox = lab.page.locator(f'{lab.sidebar} [data-testid="goals-inbox-item"][data-kind="approval"]')
            inbox.wait_for(timeout=30_000)
            wait_until(lambda: bool(api(server, "GET", "approvals?state=pending")["approvals"]), "the approval")
            [approval] = api(server, "GET", "approvals?state=pending")["approvals"]
            requests.quiet(lab)
            start = time.monotonic()
            api(server, "POST", f"approvals/{approval['approval_id']}", {"decision": "approve"})
            inbox.wait_for(state="detached", timeout=10_000)
            assert "GET attention" not in requests.since(start), requests.since(start)
            view.locator('[data-testid="goals-item"][data-kind="assistant"]').filter(has_text="written").wait_for(
                timeout=30_000)
            assert (server.root_dir / "w.txt").read_text() == "x"
            assert lab.console_errors == [], lab.console_errors
        finally:
            lab.close()
