"""Notebook cards across a server crash, in a real JupyterLab (headless Chromium, the built labextension).

An open notebook holds the id-only outputs ``%goal`` / ``%chat`` make (Goal, approval, history and
chat cards, built by ``jupyter_goals.clients.notebook.cards``). The server is killed with SIGKILL and started
again on the same port; with no page reload the cards reconnect, re-read, and follow the next change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from jupyter_goals.clients.notebook import cards

from .browser import (
    LabPage,
    LabServer,
    api,
    asking_model,
    goals_ready,
    jp_asyncio_loop,  # noqa: F401 - Playwright keeps its own loop (see there)
    require_chromium,
    run_jupyter_lab,
    wait_until,
)
from .servers import write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()


def notebook(path: Path, bundles: list[dict[str, Any]]) -> None:
    """A saved notebook whose one cell shows ``bundles`` as display outputs (what the magics leave)."""
    outputs = [{"output_type": "display_data", "metadata": {}, "data": b} for b in bundles]
    cell = {"cell_type": "code", "execution_count": 1, "id": "cards", "metadata": {},
            "source": ["%goal status"], "outputs": outputs}
    path.write_text(json.dumps({"cells": [cell], "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))


def test_open_notebook_cards_stay_live_across_kill_9_and_restart_of_the_server(
        browser: Browser, tmp_path: Path) -> None:
    with run_jupyter_lab(tmp_path) as started:
        server: LabServer = goals_ready(started)
        slow = write_script(tmp_path / "slow.json", [
            {"when": {"purpose": "work", "last_user_contains": "hello"}, "respond": {"text": "Hello from the script."}},
        ], default={"text": "still working", "delay_s": 10})  # the Goal stays active, working
        sid = api(server, "PUT", "notebook-session", {"path": "cards.ipynb", "model": slow,
                                                      "permissions": {"mode": "bypass"}})["session_id"]
        old = api(server, "POST", "goals", {"session_id": sid, "objective": "An older Goal",
                                            "requirements": [{"text": "x"}]})
        api(server, "POST", f"goals/{old['goal_id']}/actions", {"action": "end", "expected_revision": 1})
        [record] = api(server, "GET", f"sessions/{sid}/history")["records"]
        sent = api(server, "POST", f"sessions/{sid}/messages", {"text": "hello", "client_request_id": "nb-chat-1"})
        wait_until(lambda: api(server, "GET", f"sessions/{sid}")["work"]["phase"] == "done", "the chat answer")
        goal = api(server, "POST", "goals", {"session_id": sid, "objective": "Tidy the notes",
                                             "requirements": [{"text": "notes are tidy"}]})
        asker = api(server, "POST", "sessions", {"title": "asking", "model": asking_model(tmp_path)})["session_id"]
        api(server, "POST", f"sessions/{asker}/messages", {"text": "write a.txt", "client_request_id": "nb-ask-1"})
        wait_until(lambda: bool(api(server, "GET", "approvals?state=pending")["approvals"]), "a pending approval", 30)
        [approval] = api(server, "GET", "approvals?state=pending")["approvals"]
        notebook(server.root_dir / "cards.ipynb", [
            cards.goal_bundle(api(server, "GET", f"goals/{goal['goal_id']}")),
            cards.approval_bundle(approval),
            cards.history_bundle(record),
            cards.chat_bundle(sid, sent["work_id"], sent["message_id"], "hello"),
        ])

        lab = LabPage.open(browser, server)
        try:
            lab.page.evaluate("(p) => window.jupyterapp.commands.execute('docmanager:open', {path: p})", "cards.ipynb")
            card = lab.page.locator('[data-testid="goals-output"][data-kind="goal"]')
            state = card.locator('[data-testid="goals-goal-state"]')
            state.filter(has_text="active").wait_for(timeout=30_000)
            approval_card = lab.page.locator('[data-testid="goals-output"][data-kind="approval"]')
            approval_card.locator('[data-testid="goals-approval-state"]').filter(has_text="pending").wait_for()
            history = lab.page.locator('[data-testid="goals-output"][data-kind="history"]')
            history.locator('[data-testid="goals-history-objective"]').filter(has_text="An older Goal").wait_for()
            chat = lab.page.locator('[data-testid="goals-output"][data-kind="chat"]')
            chat.locator('[data-testid="goals-chat-item"]').filter(has_text="Hello from the script.").wait_for()
            assert lab.page.get_by_text("snapshot taken").count() == 0  # our renderer, not the HTML fallback
            lab.page.evaluate("() => { window.__sameDocument = true; }")

            history_reads: list[str] = []
            lab.page.on("requestfinished", lambda r: history_reads.append(r.url)
                        if f"/api/goals/history/{record['record_id']}" in r.url else None)
            server.kill()  # SIGKILL: no shutdown hook runs
            server.restart()
            goals_ready(server)
            # a terminal record never changes, so no event concerns its card: only the feed's
            # "rebuild" after it reconnects makes the card read it again
            wait_until(lambda: lab.page.wait_for_timeout(100) or bool(history_reads),  # lets Playwright deliver events
                       "the history card to re-read after the reconnect", 30)

            # changes made after the restart reach the cards already on screen
            now = api(server, "GET", f"goals/{goal['goal_id']}")
            api(server, "POST", f"goals/{goal['goal_id']}/actions", {"action": "pause",
                                                                      "expected_revision": now["revision"]})
            state.filter(has_text="paused").wait_for(timeout=30_000)
            api(server, "POST", f"approvals/{approval['approval_id']}", {"decision": "deny"})
            wait_until(lambda: approval_card.locator('[data-testid="goals-approval"]').get_attribute("data-state")
                       == "denied", "the approval card to follow the decision", 30)
            # the cards re-read after the reconnect: none is left marked stale or unavailable
            wait_until(lambda: lab.page.locator('[data-testid="goals-output-error"]').count() == 0,
                       "no card left showing an error", 30)
            assert history.locator('[data-testid="goals-history-objective"]').inner_text() == "An older Goal"
            assert chat.locator('[data-testid="goals-chat-phase"]').inner_text() == "done"
            assert lab.page.evaluate("() => window.__sameDocument === true")  # no reload happened
        finally:
            lab.screenshot(tmp_path / "notebook-cards-restart.png")
            lab.close()
