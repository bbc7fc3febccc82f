"""A chat's "always allow" rules in JupyterLab (issue 32 item 1): approved with Always allow, listed in
Permissions with who added them and when, revoked with their Revoke button, after which the next call
asks again; a Revoke decided on a stale view is refused (409) and the dialog shows the current rules.

A real server and JupyterLab with the built labextension, headless Chromium driven by accessible names
(role + label), a scripted model. Setup as in ``test_browser.py``.
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
    send,
    wait_until,
)
from .servers import write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()


def test_always_allow_lists_the_rule_with_who_and_when_and_revoking_it_makes_the_next_call_ask(
        browser: Browser, tmp_path: Path) -> None:
    """An ask chat whose model runs `echo ran` for every message. The first call waits for approval;
    Always allow runs it and adds `shell` to the chat's rules. Permissions lists it "added by <the user>,
    <time> (approving a call)"; Revoke shell saves at once (the rule is gone over REST); the next message's
    shell call waits for an approval again. Then a stale Revoke: the dialog shows grep, the rules change
    elsewhere meanwhile (glob added), Revoke grep answers 409, the dialog says so, lists the current rules
    (grep and glob), and nothing was revoked."""
    model = write_script(tmp_path / "shell.json", [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "it ran"}},
    ], default={"tool_calls": [{"name": "shell", "arguments": {"command": "echo ran >> ran.log"}}]})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "rules chat", "model": model,
                                               "permissions": {"mode": "ask"}})["session_id"]
        lab = LabPage.open(browser, server)
        try:
            view = open_session_view(lab, sid)
            send(view, "run it")
            view.get_by_role("button", name="Always allow").click()
            wait_until(lambda: (server.root_dir / "ran.log").exists(), "the approved command", 30)
            wait_until(lambda: api(server, "GET", f"sessions/{sid}")["work"]["phase"] == "done", "the turn", 30)
            [rule] = api(server, "GET", f"sessions/{sid}")["allow_rules"]
            assert (rule["rule"], rule["via"]) == ("shell", "approval") and rule["added_by"], rule
            assert rule["added_by"].startswith("Anonymous")  # a token-authenticated Jupyter user

            view.get_by_role("button", name="Permissions", exact=True).click()
            dialog = lab.page.get_by_role("dialog")
            listed = dialog.locator('[data-testid="goals-permissions-rule"]')
            wait_until(lambda: listed.count() == 1, "the rule listed")
            text = listed.first.inner_text()
            assert "shell" in text and f"added by {rule['added_by']}," in text and "(approving a call)" in text, text
            lab.screenshot(tmp_path / "rules.png")
            dialog.get_by_role("button", name="Revoke shell").click()
            dialog.locator('[data-testid="goals-permissions-status"]').filter(
                has_text="Revoked shell").wait_for(timeout=10_000)
            assert api(server, "GET", f"sessions/{sid}")["session"]["permissions"]["allow"] == []
            assert dialog.get_by_text("No tool is always allowed.").is_visible()
            dialog.get_by_role("button", name="Cancel").click()

            send(view, "run it again")
            view.get_by_role("button", name="Approve", exact=True).wait_for(timeout=30_000)
            pending = api(server, "GET", "approvals?state=pending")["approvals"]
            assert [(a["session_id"], a["tool"]) for a in pending] == [(sid, "shell")]
            assert len((server.root_dir / "ran.log").read_text().splitlines()) == 1  # it did not run unasked

            # a stale Revoke: the work waits (unfinished), so a permission change elsewhere moves its version
            api(server, "PATCH", f"sessions/{sid}", {"permissions": {"mode": "ask", "allow": ["grep"]}})
            view.get_by_role("button", name="Permissions", exact=True).click()
            dialog = lab.page.get_by_role("dialog")
            wait_until(lambda: listed.count() == 1, "grep listed")
            api(server, "PATCH", f"sessions/{sid}", {"permissions": {"mode": "ask", "allow": ["grep", "glob"]}})
            dialog.get_by_role("button", name="Revoke grep").click()
            dialog.locator('[data-testid="goals-permissions-status"]').filter(
                has_text="changed meanwhile").wait_for(timeout=10_000)
            wait_until(lambda: listed.count() == 2, "the current rules shown")
            assert [listed.nth(i).get_attribute("data-rule") for i in range(2)] == ["grep", "glob"]
            assert api(server, "GET", f"sessions/{sid}")["session"]["permissions"]["allow"] == ["grep", "glob"]
            dialog.get_by_role("button", name="Cancel").click()
        finally:
            lab.close()


def test_always_allow_from_the_panels_inbox_runs_the_call_and_records_the_rule(
        browser: Browser, tmp_path: Path) -> None:
    """The Goals panel's "Waiting for you" list offers Always allow beside Approve and Deny (as the chat view,
    the panel's session detail and the notebook's approval card do): it runs the waiting call once and adds its
    tool to the chat's rules, recorded as added through an approval."""
    model = write_script(tmp_path / "shell.json", [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "it ran"}},
    ], default={"tool_calls": [{"name": "shell", "arguments": {"command": "echo ran >> ran.log"}}]})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "inbox chat", "model": model,
                                               "permissions": {"mode": "ask"}})["session_id"]
        api(server, "POST", f"sessions/{sid}/messages", {"text": "run it", "client_request_id": "i-1"})
        wait_until(lambda: api(server, "GET", "attention")["count"] == 1, "the approval waiting", 60)
        lab = LabPage.open(browser, server)
        try:
            lab.open_goals_sidebar()
            inbox = lab.page.locator(lab.sidebar).get_by_role("region", name="Waiting for you")
            item = inbox.locator('[data-testid="goals-inbox-item"]').filter(has_text="inbox chat")
            item.get_by_role("button", name="Always allow").click()
            wait_until(lambda: (server.root_dir / "ran.log").exists(), "the approved command", 30)
            wait_until(lambda: api(server, "GET", f"sessions/{sid}")["work"]["phase"] == "done", "the turn", 30)
            [rule] = api(server, "GET", f"sessions/{sid}")["allow_rules"]
            assert (rule["rule"], rule["via"]) == ("shell", "approval") and rule["added_by"], rule
            assert len((server.root_dir / "ran.log").read_text().splitlines()) == 1
        finally:
            lab.close()
