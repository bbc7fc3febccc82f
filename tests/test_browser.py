"""The Goals sidebar in a real JupyterLab, in headless Chromium.

Needs /usr/bin/chromium (`.ci/install-chromium.sh`), Playwright (the `test` extra; it drives
the system Chromium, no browser download) and the built labextension (`pip install .`, or
`cd labextension && jlpm install && jlpm build:prod` for a working-tree build).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .browser import (
    LabPage,
    jp_asyncio_loop,  # noqa: F401 - Playwright keeps its own loop (see there)
    require_chromium,
    run_jupyter_lab,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Route

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()


def test_sidebar_shows_health_and_sessions(browser: Browser, tmp_path: Path) -> None:
    """Against the real jupyter_goals server extension: health, empty list, then a new session."""
    with run_jupyter_lab(tmp_path) as server:
        status, health = server.request("GET", "api/goals/health")
        for _ in range(100):  # the extension answers "starting" until its schema is migrated
            if status != 200 or not isinstance(health, dict) or health.get("status") != "starting":
                break
            time.sleep(0.1)
            status, health = server.request("GET", "api/goals/health")
        assert status == 200, (
            f"GET /api/goals/health -> {status} {str(health)[:200]!r}: is the jupyter_goals server "
            f"extension installed and enabled?\n{server.log_tail()}"
        )
        assert isinstance(health, dict) and health.get("status"), health

        lab = LabPage.open(browser, server)
        try:
            assert lab.has_plugin(), "plugin jupyter-goals:sidebar is not registered in the page"
            lab.open_goals_sidebar(via="tab")

            lab.wait_for_text("goals-health-status", str(health["status"]))
            if health.get("host_name"):
                lab.wait_for_text("goals-health-host", str(health["host_name"]))
            lab.wait_for_text("goals-sessions-empty", "No sessions yet")
            assert lab.page.locator(lab.testid("goals-error")).is_hidden()

            status, created = server.request("POST", "api/goals/sessions", {"title": "browser test"})
            assert status in (200, 201), f"POST /api/goals/sessions -> {status} {created!r}"

            lab.click_testid("goals-refresh")
            lab.wait_for_text("goals-session-title", "browser test")
            row = lab.page.locator(lab.testid("goals-session")).filter(has_text="browser test").first
            assert row.locator('[data-testid="goals-session-phase"]').inner_text().strip()
            assert lab.page.locator(lab.testid("goals-sessions-empty")).count() == 0
            assert lab.page.locator(lab.testid("goals-error")).is_hidden()
        finally:
            lab.screenshot(tmp_path / "goals-sidebar.png")
            lab.close()


def test_sidebar_error_state_and_recovery(browser: Browser, tmp_path: Path) -> None:
    """With the server extension off, /api/goals/* 404s: the panel says so and offers Refresh.

    Then a stand-in answers (Playwright routes), Refresh is clicked and the panel recovers.
    """
    with run_jupyter_lab(tmp_path, goals_server_extension=False) as server:
        status, _ = server.request("GET", "api/goals/health")
        assert status == 404, f"the jupyter_goals server extension should be disabled here, got {status}"

        lab = LabPage.open(browser, server)
        try:
            assert lab.has_plugin(), "plugin jupyter-goals:sidebar is not registered in the page"
            lab.open_goals_sidebar(via="command")

            lab.wait_for_text("goals-error-text", "State temporarily unavailable")
            assert "404" in lab.text("goals-error-detail")
            refresh = lab.page.locator(lab.testid("goals-error-refresh"))
            assert refresh.is_visible() and refresh.is_enabled()
            lab.screenshot(tmp_path / "goals-sidebar-error.png")

            # A stand-in server answers from now on.
            fake_health = {
                "status": "degraded",
                "databases": {"main": "ok"},
                "workers": 2,
                "recovery": "idle",
                "host_name": "stand-in-host",
                "boot_id": "b-1",
            }
            fake_sessions = {
                "sessions": [
                    {
                        "session_id": "s-1",
                        "title": "stand-in session",
                        "work": {
                            "phase": "paused",
                            "reason_code": "user_paused",
                            "reason": "Paused by you.",
                        },
                    },
                    {"session_id": "s-2", "title": "", "work": None},
                ]
            }

            def fulfill(body: object) -> Callable[[Route], None]:
                def handler(route: Route) -> None:  # serialised per request: later edits show up
                    route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

                return handler

            lab.page.route("**/api/goals/health*", fulfill(fake_health))
            lab.page.route("**/api/goals/sessions*", fulfill(fake_sessions))
            refresh.click()

            lab.wait_for_text("goals-health-status", "degraded")
            assert lab.page.locator(lab.testid("goals-error")).is_hidden()
            assert lab.text("goals-health-host") == "stand-in-host"
            assert lab.text("goals-health-workers") == "2"
            rows = lab.page.locator(lab.testid("goals-session"))
            assert rows.count() == 2
            assert rows.nth(0).get_attribute("data-session-id") == "s-1"
            assert (
                rows.nth(0).locator('[data-testid="goals-session-title"]').inner_text() == "stand-in session"
            )
            assert rows.nth(0).locator('[data-testid="goals-session-phase"]').inner_text() == "paused"
            assert (
                rows.nth(0).locator('[data-testid="goals-session-reason"]').inner_text() == "Paused by you."
            )
            assert (
                rows.nth(1).locator('[data-testid="goals-session-title"]').inner_text() == "Untitled session"
            )
            assert rows.nth(1).locator('[data-testid="goals-session-phase"]').inner_text() == "idle"

            # Nothing polls: the panel reads again when the event feed reaches the server again (its
            # reconnect), so a session made meanwhile shows up without a click.
            fake_sessions["sessions"].append(
                {
                    "session_id": "s-3",
                    "title": "polled session",
                    "work": {"phase": "working", "reason_code": "working", "reason": ""},
                }
            )
            lab.page.route("**/api/goals/events*", fulfill({"events": [], "last_seq": 1}))
            lab.wait_for_text("goals-session-title", "polled session", timeout_ms=12_000)
            lab.page.unroute("**/api/goals/events*")

            # The server goes away again: the error line comes back, last data kept but marked stale.
            lab.page.unroute("**/api/goals/health*")
            lab.page.unroute("**/api/goals/sessions*")
            lab.click_testid("goals-refresh")
            lab.wait_for_text("goals-error-text", "State temporarily unavailable")
            assert "jp-goals-mod-stale" in (
                lab.page.locator(lab.testid("goals-sessions")).get_attribute("class") or ""
            )

            # Reloaded, JupyterLab restores the open Goals panel, which reads the state at once.
            lab.reload()
            assert lab.page.locator(lab.sidebar).is_visible()
            lab.wait_for_text("goals-error-text", "State temporarily unavailable")
        finally:
            lab.screenshot(tmp_path / "goals-sidebar-final.png")
            lab.close()
