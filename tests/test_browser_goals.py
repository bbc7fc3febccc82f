"""Goal UI in a real JupyterLab (headless Chromium, the built labextension, a real server, scripted models).

The sidebar's session view (work state, Goal, approvals, history, backend actions, 409s, live
updates) and the notebook's id-only MIME outputs rendered live from REST. Setup as in
``test_browser.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .browser import (
    LabPage,
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
    from playwright.sync_api import Browser, Locator, Request, Route

GOAL_MIME = "application/vnd.jupyter-goals.goal+json"
HISTORY_MIME = "application/vnd.jupyter-goals.history+json"
APPROVAL_MIME = "application/vnd.jupyter-goals.approval+json"


pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()


def slow_model(tmp: Path) -> str:
    """Each turn takes a while and makes no tool call: a Goal stays active and working."""
    return write_script(tmp / "slow.json", [], default={"text": "still working", "delay_s": 10})


def test_sidebar_goal_panel_pause_resume_conflict_approvals_and_history(browser: Browser, tmp_path: Path) -> None:
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "goal session", "model": slow_model(tmp_path),
                                               "permissions": {"mode": "bypass"}})["session_id"]
        goal = api(server, "POST", "goals", {"session_id": sid, "objective": "Write report.md",
                                             "requirements": [{"text": "report.md exists", "kind": "file_exists",
                                                               "path": "report.md"},
                                                              {"text": "the report is polite"}]})
        gid = goal["goal_id"]
        api(server, "POST", "sessions", {"title": "plain chat"})

        lab = LabPage.open(browser, server)
        try:
            lab.open_goals_sidebar()
            lab.wait_for_text("goals-session-title", "plain chat")

            # A chat without a Goal shows its work state and no Goal UI.
            lab.page.locator(lab.testid("goals-session")).filter(has_text="plain chat").click()
            lab.wait_for_text("goals-detail-title", "plain chat")
            assert lab.page.locator(lab.testid("goals-goal")).count() == 0

            # The Goal session: state, phase, reason sentence, requirements with verdicts, backend actions.
            lab.page.locator(lab.testid("goals-session")).filter(has_text="goal session").click()
            lab.wait_for_text("goals-goal-objective", "Write report.md")
            goal_box = lab.page.locator(lab.testid("goals-goal"))
            assert goal_box.get_attribute("data-goal-id") == gid
            assert lab.text("goals-goal-state") == "active"
            reqs = lab.page.locator(lab.testid("goals-goal-requirement"))
            assert reqs.count() == 2
            assert [reqs.nth(i).get_attribute("data-verdict") for i in range(2)] == ["unknown", "unknown"]
            assert lab.page.locator(lab.testid("goals-goal-todo")).count() == 0  # empty Todo: nothing shown
            lab.wait_for_text("goals-goal-usage", "")
            pause, resume = button(lab, "goals-goal-pause"), button(lab, "goals-goal-resume")
            assert pause.is_enabled() and not resume.is_enabled()
            assert button(lab, "goals-goal-end").is_enabled()

            # Pause: the server says paused, Resume becomes enabled (from the backend's actions).
            pause.click()
            lab.wait_for_text("goals-goal-state", "paused")
            assert api(server, "GET", f"goals/{gid}")["state"] == "paused"
            wait_until(lambda: button(lab, "goals-goal-resume").is_enabled(), "Resume enabled")
            assert not button(lab, "goals-goal-pause").is_enabled()
            lab.wait_for_text("goals-goal-reason", "")  # the reason sentence for user_paused
            assert lab.text("goals-goal-reason")
            lab.wait_for_text("goals-detail-phase", "paused")
            lab.screenshot(tmp_path / "goal-paused.png")

            # A stale action: the events feed is cut, the Goal is edited elsewhere (revision 2), then
            # Resume (still at revision 1) is clicked: the 409 is shown and the view re-read.
            # Cut for real: new requests to the feed are refused, and the open stream breaks when the
            # browser goes offline; wait for that break, for two reconnects the route refused (the second
            # after the feed's backoff, so a view re-read due to an event that came just before the cut
            # has started) and for the views' reads in flight to finish.
            refused: list[str] = []
            reading: set[Request] = set()

            def refuse(route: Route) -> None:
                refused.append(route.request.url)
                route.abort()

            def events_request(request: Request) -> bool:
                return "/api/goals/events" in request.url

            def started(request: Request) -> None:
                if "/api/goals/" in request.url and not events_request(request):
                    reading.add(request)

            def ended(request: Request) -> None:
                reading.discard(request)

            lab.page.on("request", started)
            lab.page.on("requestfinished", ended)
            lab.page.on("requestfailed", ended)
            lab.page.route("**/api/goals/events*", refuse)
            with lab.page.expect_event("requestfailed", predicate=events_request, timeout=10_000):
                lab.page.context.set_offline(True)
            lab.page.context.set_offline(False)
            lab.page.wait_for_event("requestfailed", predicate=lambda r: events_request(r) and len(refused) >= 2,
                                    timeout=10_000)
            wait_until(lambda: lab.page.evaluate("() => true") and not reading, "the views' reads to finish")
            api(server, "PATCH", f"goals/{gid}", {"expected_revision": 1, "objective": "Write report.md, edited"})
            button(lab, "goals-goal-resume").click()
            lab.wait_for_text("goals-action-error", "Conflict (409)")
            wait_until(lambda: goal_box_attr(lab, "data-revision") == "2", "the view re-read revision 2")
            lab.wait_for_text("goals-goal-objective", "edited")
            assert api(server, "GET", f"goals/{gid}")["state"] == "paused"

            # The feed reconnects: the view is rebuilt from REST and follows changes made elsewhere.
            lab.page.unroute("**/api/goals/events*")
            api(server, "POST", f"goals/{gid}/actions", {"action": "resume", "expected_revision": 2})
            lab.wait_for_text("goals-goal-state", "active", timeout_ms=20_000)

            # Ending it leaves a read-only record and no Goal UI.
            button(lab, "goals-goal-end").click()
            lab.wait_for_text("goals-history-objective", "edited")
            wait_until(lambda: lab.page.locator(lab.testid("goals-goal")).count() == 0, "the Goal UI to go")
            record = lab.page.locator(lab.testid("goals-history-record")).first
            assert record.get_attribute("data-state") == "cancelled"
            details = lab.page.locator(lab.testid("goals-history-details")).first
            details.focus()
            details.press("Enter")
            dialog = lab.page.locator('[data-testid="goals-history-dialog"]')
            dialog.wait_for(state="visible")
            assert dialog.locator('[data-testid="goals-goal-readonly"]').is_visible()
            assert dialog.locator('[data-testid="goals-goal-actions"]').count() == 0  # read-only: no buttons
            assert "edited" in dialog.locator('[data-testid="goals-goal-objective"]').inner_text()
            lab.page.keyboard.press("Escape")
            dialog.wait_for(state="detached")
            assert lab.page.evaluate("() => document.activeElement?.dataset?.testid") == "goals-history-details"

            # Approvals: a plain chat in ask mode asks before writing; Approve runs it once.
            asker = api(server, "POST", "sessions", {"title": "asking chat", "model": asking_model(tmp_path)})
            api(server, "POST", f"sessions/{asker['session_id']}/messages",
                {"text": "write a.txt", "client_request_id": "browser-ask-1"})
            lab.page.locator(lab.testid("goals-session")).filter(has_text="asking chat").click()
            lab.wait_for_text("goals-approval-tool", "write_file", timeout_ms=30_000)
            assert lab.page.locator(lab.testid("goals-goal")).count() == 0
            lab.click_testid("goals-approval-approve")
            wait_until(lambda: (server.root_dir / "a.txt").exists(), "a.txt written after approval", timeout=30)
            wait_until(lambda: lab.page.locator(lab.testid("goals-approval")).count() == 0, "the approval to go")
            assert api(server, "GET", "approvals")["approvals"][0]["state"] in ("approved", "consumed")
        finally:
            lab.screenshot(tmp_path / "goal-sidebar-final.png")
            lab.close()


def button(lab: LabPage, testid: str) -> Locator:
    return lab.page.locator(lab.testid(testid)).first


def goal_box_attr(lab: LabPage, name: str) -> str | None:
    box = lab.page.locator(lab.testid("goals-goal"))
    return box.get_attribute(name) if box.count() else None


def notebook_with_outputs(path: Path, outputs: list[dict[str, Any]]) -> None:
    cell = {"cell_type": "code", "execution_count": 1, "id": "goal-cell", "metadata": {},
            "source": ["%goal Write report.md"], "outputs": outputs}
    nb = {"cells": [cell], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                       "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def test_goal_mime_output_in_a_notebook_is_live_from_rest(browser: Browser, tmp_path: Path) -> None:
    """A saved notebook whose output holds only ids, opened without running anything: the output
    shows the Goal from REST, follows changes made elsewhere, and its buttons act."""
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "nb", "model": slow_model(tmp_path),
                                               "permissions": {"mode": "bypass"}})["session_id"]
        gid = api(server, "POST", "goals", {"session_id": sid, "objective": "Tidy the notes",
                                            "requirements": [{"text": "notes are tidy"}]})["goal_id"]
        ended = api(server, "POST", "sessions", {"title": "old"})["session_id"]
        old = api(server, "POST", "goals", {"session_id": ended, "objective": "An older Goal",
                                            "requirements": [{"text": "x"}]})
        api(server, "POST", f"goals/{old['goal_id']}/actions", {"action": "end", "expected_revision": 1})
        record = api(server, "GET", f"sessions/{ended}/history")["records"][0]
        asker = api(server, "POST", "sessions", {"title": "asking", "model": asking_model(tmp_path)})["session_id"]
        api(server, "POST", f"sessions/{asker}/messages", {"text": "write a.txt", "client_request_id": "nb-ask-1"})
        wait_until(lambda: bool(api(server, "GET", "approvals?state=pending")["approvals"]), "a pending approval", 30)
        approval = api(server, "GET", "approvals?state=pending")["approvals"][0]
        notebook_with_outputs(server.root_dir / "goal.ipynb", [
            {"output_type": "display_data", "metadata": {},
             "data": {GOAL_MIME: {"goal_id": gid, "session_id": sid},
                      "text/html": "<b>SNAPSHOT-FALLBACK</b>", "text/plain": "Goal (snapshot)"}},
            {"output_type": "display_data", "metadata": {},
             "data": {HISTORY_MIME: {"record_id": record["record_id"], "session_id": ended},
                      "text/html": "<b>HISTORY-FALLBACK</b>", "text/plain": "record"}},
            {"output_type": "display_data", "metadata": {},
             "data": {APPROVAL_MIME: {"approval_id": approval["approval_id"], "session_id": asker},
                      "text/html": "<b>APPROVAL-FALLBACK</b>", "text/plain": "approval"}},
        ])

        lab = LabPage.open(browser, server)
        try:
            lab.page.evaluate("(p) => window.jupyterapp.commands.execute('docmanager:open', {path: p})", "goal.ipynb")
            output = lab.page.locator('[data-testid="goals-output"][data-kind="goal"]')
            output.locator('[data-testid="goals-goal-objective"]').filter(has_text="Tidy the notes").wait_for()
            assert lab.page.get_by_text("SNAPSHOT-FALLBACK").count() == 0  # our renderer, not the snapshot
            state = output.locator('[data-testid="goals-goal-state"]')
            assert state.inner_text() == "active"
            history = lab.page.locator('[data-testid="goals-output"][data-kind="history"]')
            history.locator('[data-testid="goals-history-objective"]').filter(has_text="An older Goal").wait_for()

            # the kernel goes away; the output does not depend on it
            for kernel in server.request("GET", "api/kernels")[1]:
                server.request("DELETE", f"api/kernels/{kernel['id']}")
            wait_until(lambda: server.request("GET", "api/kernels")[1] == [], "no kernel left")

            # changed elsewhere (REST): the output follows through the event feed
            api(server, "POST", f"goals/{gid}/actions", {"action": "pause", "expected_revision": 1})
            output.locator('[data-testid="goals-goal-state"]').filter(has_text="paused").wait_for(timeout=20_000)

            # its own buttons act through REST
            resume = output.locator('[data-testid="goals-goal-resume"]')
            wait_until(resume.is_enabled, "Resume enabled in the output")
            resume.click()
            output.locator('[data-testid="goals-goal-state"]').filter(has_text="active").wait_for(timeout=20_000)
            assert api(server, "GET", f"goals/{gid}")["state"] == "active"

            # a read failure says so, with Refresh, and keeps the last view; Refresh recovers (the card
            # shows its session's current Goal from the page's store: the failing read is the session's)
            lab.page.route(f"**/api/goals/sessions/{sid}?*", lambda route: route.fulfill(
                status=503, content_type="application/json",
                body=json.dumps({"error": "storage_unavailable", "message": "control.db is locked"})))
            api(server, "POST", f"goals/{gid}/actions", {"action": "pause", "expected_revision": 1})
            error = output.locator('[data-testid="goals-output-error-text"]')
            error.filter(has_text="State temporarily unavailable").wait_for(timeout=20_000)
            assert "control.db is locked" in output.locator('[data-testid="goals-output-error-detail"]').inner_text()
            assert output.locator('[data-testid="goals-goal-objective"]').is_visible()  # last good view kept
            lab.page.unroute(f"**/api/goals/sessions/{sid}?*")
            output.locator('[data-testid="goals-output-error-refresh"]').click()
            output.locator('[data-testid="goals-goal-state"]').filter(has_text="paused").wait_for(timeout=20_000)
            assert error.count() == 0
            assert server.request("GET", "api/kernels")[1] == []

            # the approval output: pending with Approve / Deny; Approve runs the tool once
            card = lab.page.locator('[data-testid="goals-output"][data-kind="approval"]')
            card.locator('[data-testid="goals-approval-tool"]').filter(has_text="write_file").wait_for()
            assert card.locator('[data-testid="goals-approval-state"]').inner_text() == "pending"
            card.locator('[data-testid="goals-approval-approve"]').click()
            wait_until(lambda: card.locator('[data-testid="goals-approval"]').get_attribute("data-state")
                       in ("approved", "consumed"), "the approval output to follow the decision")
            assert card.locator('[data-testid="goals-approval-approve"]').count() == 0
            wait_until(lambda: (server.root_dir / "a.txt").exists(), "a.txt written after approval", timeout=30)
            assert lab.page.get_by_text("APPROVAL-FALLBACK").count() == 0
        finally:
            lab.screenshot(tmp_path / "goal-notebook.png")
            lab.close()
