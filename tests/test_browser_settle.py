"""Unknown outcomes a person can settle, in JupyterLab (issue 32 item 2): after a kill -9 and a restart under a
new boot id, the call whose command was killed shows "It ran", "It did not run" and "Check again"; the next
write waits for an approval even in bypass. The person presses "It did not run": the transcript says so (who,
when), the approval is withdrawn and the write runs without one, counted on disk; the Goals panel's inbox had
the same three buttons on its "Outcome unknown" item, and the item leaves once settled. (The page is loaded
again after the restart: JupyterLab's own "Server Connection Error" dialog from the kill covers it otherwise.)

A real ``jupyter lab`` with the built labextension, headless Chromium driven by role and accessible name, a
scripted model (setup as in ``test_browser.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jupyter_goals.host.effect_files import group_members, kill_shell

from .browser import (
    LabPage,
    api,
    goals_ready,
    item,
    jp_asyncio_loop,  # noqa: F401 - Playwright keeps its own loop (see there)
    open_session_view,
    require_chromium,
    run_jupyter_lab,
    wait_until,
)
from .servers import lines, running_shell, write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()



def test_settle_an_unknown_outcome_as_it_did_not_run_and_the_next_write_in_bypass_runs_without_approval(
    browser: Browser, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    model = write_script(tmp_path / "reboot.json", [
        {"when": {"last_tool_result_contains": "exit status", "any_text_contains": "the user says it did not run"},
         "respond": {"text": "Understood: the first command did not run."}},
        {"when": {"tool_result_unknown": True},
         "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "echo again >> out.txt"}}]}}],
        default={"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 30; echo once >> out.txt"}}]})
    with run_jupyter_lab(tmp_path) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "reboot chat", "model": model, "cwd": str(server.root_dir),
                                               "permissions": {"mode": "bypass"}})["session_id"]
        lab = LabPage.open(browser, server)
        try:
            view = open_session_view(lab, sid)
            api(server, "POST", f"sessions/{sid}/messages", {"text": "deploy", "client_request_id": "m-1"})
            effect_dir = running_shell(server.state_dir, sid)

            server.kill()  # the machine "restarts": the server and the command killed -9, a new boot id
            assert kill_shell(effect_dir)
            wait_until(lambda: not group_members(effect_dir), "the command's process group to end", 10)
            server.env["JUPYTER_GOALS_BOOT_ID"] = "after-the-restart"
            server.restart()
            goals_ready(server)
            wait_until(lambda: bool(api(server, "GET", "approvals?state=pending")["approvals"]),
                       "the approval that follows the unknown outcome", 60)
            [pending] = api(server, "GET", "approvals?state=pending")["approvals"]
            assert pending["arguments"] == {"command": "echo again >> out.txt"}  # bypass, and yet it asks
            # JupyterLab's own "Server Connection Error" dialog from the kill would cover the page: load it again
            lab.reload()
            view = open_session_view(lab, sid)

            # the inbox lists the unknown outcome with the same answers
            lab.open_goals_sidebar()
            inbox_item = lab.page.locator('[data-testid="goals-inbox-item"][data-kind="unknown_outcome"]')
            inbox_item.wait_for(timeout=30_000)
            for name in ("It ran", "It did not run", "Check again"):
                expect(inbox_item.get_by_role("button", name=name, exact=True)).to_be_visible()

            call = item(view, "tool_call").first
            answers = call.get_by_role("group", name="Did this shell run?")
            answers.wait_for(timeout=30_000)
            for name in ("It ran", "Check again"):
                expect(answers.get_by_role("button", name=name, exact=True)).to_be_visible()
            answers.get_by_role("button", name="It did not run", exact=True).click()

            said = item(view, "reconciliation", "You said it did not run")
            said.wait_for(timeout=30_000)
            expect(said).to_contain_text("settled by")
            wait_until(lambda: lines(server.root_dir / "out.txt") == 1, "the write to run", 60)
            assert (server.root_dir / "out.txt").read_text() == "again\n"  # without an approval; never "once"
            assert api(server, "GET", "approvals?state=pending")["approvals"] == []
            expect(answers).to_have_count(0)  # settled: no answers left on the call
            expect(call.locator('[data-testid="goals-effect-state"]')).to_have_attribute("data-value", "reconciled")
            expect(item(view, "assistant", "Understood: the first command did not run.")).to_be_visible(timeout=30_000)
            expect(inbox_item).to_have_count(0)  # the inbox item left
        finally:
            lab.close()
