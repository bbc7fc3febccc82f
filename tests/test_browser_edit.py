"""Every reason with its action, in JupyterLab (issue 32 item 1, item 3): Edit Goal raises a budget-stopped
Goal's budget and it runs again; the chat's Permissions revoke an always-allowed tool and the next such call
asks; Stop all work says how many chats stop and stops them durably; the chat header shows its usage.

A real server and JupyterLab with the built labextension, headless Chromium driven by accessible names
(role + label), scripted models. Setup as in ``test_browser.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
    from playwright.sync_api import Browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()



def known_tokens(server: object, goal_id: str) -> int:
    usage = api(server, "GET", f"usage?goal_id={goal_id}")  # type: ignore[arg-type]
    tokens = usage["known_tokens"] or {"input": 0, "output": 0}
    return int(tokens["input"]) + int(tokens["output"])


def test_edit_goal_raises_a_budget_stopped_goals_budget_and_it_runs_again(browser: Browser, tmp_path: Path) -> None:
    """Each model answer reports 110 tokens (a write, then a word: 220 a turn); a Goal whose requirement is never met stops at its 250-token budget.
    In the session view the Goal line offers Edit Goal; the dialog shows the budget with what is spent,
    the person raises it to 600 and saves: the Goal runs again (revision 2) until the new budget stops it,
    and the header's usage line counts the tokens."""
    usage = {"input_tokens": 100, "output_tokens": 10}
    model = write_script(tmp_path / "spend.json", [
        {"when": {"last_tool_result_contains": "wrote"}, "respond": {"text": "step", "usage": usage}},
    ], default={"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "p.txt", "content": "x"}}],
                "usage": usage})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "budget chat", "model": model,
                                               "permissions": {"mode": "bypass"}})["session_id"]
        goal = api(server, "POST", "goals", {
            "session_id": sid, "objective": "Spend tokens",
            "requirements": [{"id": "r1", "text": "never.txt exists", "kind": "file_exists", "path": "never.txt"}],
            "budget": {"max_tokens": 250}})
        gid = goal["goal_id"]
        wait_until(lambda: api(server, "GET", f"goals/{gid}")["state"] == "budget_exhausted", "budget stop", 60)
        # the ledger applies receipts from the outbox after they commit: wait for it to count them
        wait_until(lambda: known_tokens(server, gid) >= 250, "the spent tokens in the ledger", 30)
        spent = known_tokens(server, gid)
        assert spent < 600

        lab = LabPage.open(browser, server)
        try:
            view = open_session_view(lab, sid)
            view.get_by_role("button", name="Edit Goal").click()
            dialog = lab.page.get_by_role("dialog")
            assert dialog.get_by_label("Objective").input_value() == "Spend tokens"
            assert dialog.get_by_label("Requirements").input_value() == "never.txt exists"
            tokens = dialog.get_by_label("Budget in tokens")
            assert tokens.input_value() == "250"
            assert f"{spent} tokens" in dialog.inner_text()  # what is spent, beside the limit
            tokens.fill("600")
            dialog.get_by_role("button", name="Save Goal").click()
            wait_until(lambda: api(server, "GET", f"goals/{gid}")["revision"] == 2, "revision 2")
            now = api(server, "GET", f"goals/{gid}")
            assert now["budget"]["max_tokens"] == 600
            assert now["requirements"][0]["id"] == "r1"  # the unchanged line kept its requirement: no waiver
            wait_until(lambda: known_tokens(server, gid) >= 600, "the Goal ran again up to its new budget", 60)
            wait_until(lambda: api(server, "GET", f"goals/{gid}")["state"] == "budget_exhausted", "stopped again", 60)
            usage = view.locator('[data-testid="goals-session-usage"]')
            wait_until(lambda: f"{known_tokens(server, gid):,} tokens" in usage.inner_text(), "usage in the header")
            lab.screenshot(tmp_path / "edit-goal.png")

            # A stale edit: the Goal is revised elsewhere while the dialog is open; Save shows the 409 in words.
            view.get_by_role("button", name="Edit Goal").click()
            dialog = lab.page.get_by_role("dialog")
            api(server, "PATCH", f"goals/{gid}", {"expected_revision": 2, "objective": "Spend tokens, carefully"})
            dialog.get_by_label("Budget in tokens").fill("900")
            dialog.get_by_role("button", name="Save Goal").click()
            alert = view.locator('[data-testid="goals-composer-alert"], [role="alert"]').filter(has_text="changed meanwhile")
            alert.first.wait_for(timeout=10_000)
            assert api(server, "GET", f"goals/{gid}")["budget"]["max_tokens"] == 600  # nothing half-saved
        finally:
            lab.close()


def test_permissions_dialog_revokes_an_always_allowed_tool_and_the_next_call_asks(browser: Browser, tmp_path: Path) -> None:
    """An ask chat with write_file always allowed writes without asking; the person opens Permissions from
    the chat header and presses Revoke write_file (saved at once); the next write waits for an approval."""
    model = write_script(tmp_path / "write.json", [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "written"}},
    ], default={"tool_calls": [{"name": "write_file", "arguments": {"path": "w.txt", "content": "x"}}]})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "allow chat", "model": model,
                                               "permissions": {"mode": "ask", "allow": ["write_file"]}})["session_id"]
        api(server, "POST", f"sessions/{sid}/messages", {"text": "write it", "client_request_id": "m-1"})
        wait_until(lambda: api(server, "GET", f"sessions/{sid}")["work"]["phase"] == "done", "the allowed write", 60)
        assert api(server, "GET", "approvals?state=pending")["approvals"] == []

        lab = LabPage.open(browser, server)
        try:
            view = open_session_view(lab, sid)
            view.get_by_role("button", name="Permissions", exact=True).click()
            dialog = lab.page.get_by_role("dialog")
            assert dialog.get_by_label("Permission mode").input_value() == "ask"
            dialog.get_by_role("button", name="Revoke write_file").click()  # saved at once
            dialog.locator('[data-testid="goals-permissions-status"]').filter(
                has_text="Revoked write_file").wait_for(timeout=10_000)
            dialog.get_by_role("button", name="Save permissions").click()  # nothing else changed: nothing sent
            wait_until(lambda: api(server, "GET", f"sessions/{sid}")["session"]["permissions"]["allow"] == [],
                       "the rule revoked")
            view.locator('[data-testid="goals-session-permissions"]').filter(
                has_text="ask before writes").wait_for(timeout=10_000)
            assert "allowed without asking" not in view.locator('[data-testid="goals-session-permissions"]').inner_text()

            api(server, "POST", f"sessions/{sid}/messages", {"text": "write again", "client_request_id": "m-2"})
            view.get_by_role("button", name="Approve", exact=True).wait_for(timeout=30_000)
            pending = api(server, "GET", "approvals?state=pending")["approvals"]
            assert [(a["session_id"], a["tool"]) for a in pending] == [(sid, "write_file")]
        finally:
            lab.close()


def test_stop_all_work_says_how_many_chats_stop_and_stops_them_durably(browser: Browser, tmp_path: Path) -> None:
    """Two chats whose turns take long and one finished chat: Stop all work asks first, naming 2 chats;
    Cancel changes nothing; confirmed, both work items are stopped (desired_state cancelled) and the panel
    says so."""
    slow = write_script(tmp_path / "slow.json", [], default={"text": "still working", "delay_s": 60})
    quick = write_script(tmp_path / "quick.json", [], default={"text": "done"})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        busy = []
        for n in range(2):
            sid = api(server, "POST", "sessions", {"title": f"busy {n}", "model": slow})["session_id"]
            busy.append(api(server, "POST", f"sessions/{sid}/messages",
                            {"text": "work", "client_request_id": f"b-{n}"})["work_id"])
        done_sid = api(server, "POST", "sessions", {"title": "finished", "model": quick})["session_id"]
        api(server, "POST", f"sessions/{done_sid}/messages", {"text": "hi", "client_request_id": "d-1"})
        wait_until(lambda: api(server, "GET", f"sessions/{done_sid}")["work"]["phase"] == "done", "finished chat")

        def desired() -> list[str]:
            works = [api(server, "GET", f"sessions/{s['session_id']}")["work"]
                     for s in api(server, "GET", "sessions")["sessions"] if s["title"].startswith("busy")]
            return sorted(w["desired_state"] for w in works)

        lab = LabPage.open(browser, server)
        try:
            lab.open_goals_sidebar()
            stop_all = lab.page.get_by_role("button", name="Stop all work")
            stop_all.click()
            dialog = lab.page.get_by_role("dialog")
            assert "Work in 2 chats stops now" in dialog.inner_text()
            dialog.get_by_role("button", name="Cancel").click()
            assert desired() == ["run", "run"]

            stop_all.click()
            dialog = lab.page.get_by_role("dialog")
            dialog.get_by_role("button", name="Stop all work").click()
            lab.page.locator('[data-testid="goals-stop-all-result"]').filter(
                has_text="Stopped 2 work items").wait_for(timeout=10_000)
            assert desired() == ["cancelled", "cancelled"]
        finally:
            lab.close()


def test_the_attention_inbox_lists_what_waits_with_its_action_and_counts_it_on_the_goals_tab(
        browser: Browser, tmp_path: Path) -> None:
    """An approval waiting in an ask chat and a Goal stopped at its budget: the Goals panel's "Waiting for
    you" lists both with their actions, and the Goals tab shows 2. Approve in the inbox: the write runs,
    the approval leaves, the tab shows 1. After kill -9 and a restart, a reloaded page rebuilds the inbox
    from the server: the budget stop with Edit Goal."""
    write = write_script(tmp_path / "write.json", [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "written"}},
    ], default={"tool_calls": [{"name": "write_file", "arguments": {"path": "w.txt", "content": "x"}}]})
    usage = {"input_tokens": 100, "output_tokens": 10}
    spend = write_script(tmp_path / "spend.json", [
        {"when": {"last_tool_result_contains": "wrote"}, "respond": {"text": "step", "usage": usage}},
    ], default={"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "p.txt", "content": "x"}}],
                "usage": usage})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        ask = api(server, "POST", "sessions", {"title": "ask chat", "model": write})["session_id"]
        api(server, "POST", f"sessions/{ask}/messages", {"text": "write it", "client_request_id": "a-1"})
        sid = api(server, "POST", "sessions", {"title": "budget chat", "model": spend,
                                               "permissions": {"mode": "bypass"}})["session_id"]
        gid = api(server, "POST", "goals", {
            "session_id": sid, "objective": "Spend tokens", "budget": {"max_tokens": 250},
            "requirements": [{"id": "r1", "text": "never.txt exists", "kind": "file_exists", "path": "never.txt"}],
        })["goal_id"]
        wait_until(lambda: api(server, "GET", "attention")["count"] == 2, "two things waiting", 60)

        lab = LabPage.open(browser, server)
        try:
            tab = lab.page.locator(lab.sidebar_tab())
            wait_until(lambda: tab.get_attribute("data-count") == "2", "the tab's count")
            lab.open_goals_sidebar()
            inbox = lab.page.locator(lab.sidebar).get_by_role("region", name="Waiting for you")
            items = inbox.locator('[data-testid="goals-inbox-item"]')
            wait_until(lambda: items.count() == 2, "two inbox items")
            approval = items.filter(has_text="ask chat")
            assert approval.get_attribute("data-kind") == "approval"
            budget = items.filter(has_text="budget chat")
            assert budget.get_attribute("data-kind") == "budget"
            assert "token budget" in budget.inner_text()
            assert budget.get_by_role("button", name="Edit Goal").is_enabled()
            lab.screenshot(tmp_path / "inbox.png")
            # the badge draws the number on the tab, also while the tab is the current one (JupyterLab draws
            # that tab's border with ::after over the whole tab: a badge there lost its number to it)
            badge = tab.evaluate("(t) => { const s = getComputedStyle(t, '::before');"
                                 " return [s.content, s.position, s.width, t.classList.contains('lm-mod-current')]; }")
            assert badge[0] == '"2"' and badge[1] == "absolute" and badge[3] is True, badge
            assert float(badge[2].removesuffix("px")) < 30, badge  # a small badge, not the whole tab

            approval.get_by_role("button", name="Approve").click()
            wait_until(lambda: (server.root_dir / "w.txt").exists(), "the approved write", 30)
            wait_until(lambda: items.count() == 1, "the approval left the inbox")
            wait_until(lambda: tab.get_attribute("data-count") == "1", "the tab's count down to 1")

            server.kill()
            server.restart()
            lab.reload()
            lab.open_goals_sidebar()
            inbox = lab.page.locator(lab.sidebar).get_by_role("region", name="Waiting for you")
            items = inbox.locator('[data-testid="goals-inbox-item"]')
            wait_until(lambda: items.count() == 1, "the inbox rebuilt after the restart", 60)
            assert items.first.get_attribute("data-kind") == "budget"
            assert items.first.get_by_role("button", name="Edit Goal").is_visible()
            assert api(server, "GET", f"goals/{gid}")["state"] == "budget_exhausted"
        finally:
            lab.close()
