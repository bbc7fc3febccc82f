"""Continuity and cost in a chat's view (issue 32 items 3 and 4): after a kill -9 and a restart the chat
whose work the recovery pass touched shows a banner once (when the server came back, what happened to
this chat's work, the action that fits; Dismiss, remembered across a reload), and the Goal box shows the
budget burn (known + reserved of the limit, in $ and tokens) with the hover explaining the unknowns.

A real server and JupyterLab with the built labextension, headless Chromium driven by accessible names
(role + label). Setup as in ``test_browser.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jupyter_goals.host.effect_files import group_members, kill_shell

from .browser import (
    LabPage,
    api,
    effect_events,
    goals_ready,
    item,
    jp_asyncio_loop,  # noqa: F401 - Playwright keeps its own loop (see there)
    new_chat_from_panel,
    open_session_view,
    require_chromium,
    run_jupyter_lab,
    send,
    session_view,
    wait_until,
)
from .servers import running_shell, write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Route

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()


def click_past_connection_errors(lab: LabPage, target: Locator) -> None:
    """Click ``target`` on a page that lived through the kill: JupyterLab's own "Server Connection Error"
    dialog (shown while the server was gone) covers it until dismissed; the banner is under it, not gone."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(5):
        lost = lab.page.locator('.jp-Dialog[aria-label^="Server Connection Error"]')
        if lost.count():
            lost.first.get_by_role("button", name="Close").click()
            lost.first.wait_for(state="detached", timeout=10_000)
        try:
            target.click(timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"could not click {target}")


def test_after_a_kill_9_mid_command_the_chat_shows_what_happened_once(browser: Browser, tmp_path: Path) -> None:
    """"slow" runs a 10 s command; the server is killed -9 while it runs and started again on the same port.
    The page, not reloaded, shows the banner in that chat: "The server came back at …" and "This chat's work
    continued from its last safe checkpoint." (the command is reattached, never started again). A second
    chat the pass did not touch shows no banner. Dismiss hides it; after a reload it stays hidden."""
    with run_jupyter_lab(tmp_path) as server:
        goals_ready(server)
        lab = LabPage.open(browser, server)
        try:
            quiet = new_chat_from_panel(lab, "quiet chat", mode="bypass")
            session_id = new_chat_from_panel(lab, "slow chat", mode="bypass")
            view = session_view(lab, session_id)
            send(view, "slow")
            wait_until(lambda: bool(effect_events(server, session_id, "dispatched")), "the command to start", 30)
            banner = view.get_by_role("region", name="After the restart")
            assert not banner.is_visible()

            server.kill()
            server.restart()
            banner.wait_for(timeout=60_000)
            text = banner.inner_text()
            assert "The server came back at" in text, text
            assert "This chat's work continued from its last safe checkpoint." in text, text
            [row] = api(server, "GET", f"recovery?session_id={session_id}")["items"]
            assert (row["outcome"], row["mode"], row["unknown_outcomes"]) == ("continued", "resume_checkpoint", [])
            assert api(server, "GET", f"recovery?session_id={quiet}")["items"] == []
            lab.screenshot(tmp_path / "banner.png")

            click_past_connection_errors(lab, banner.get_by_role("button", name="Dismiss"))
            wait_until(lambda: not banner.is_visible(), "the banner hidden")
            item(view, "assistant", "did not start it again").wait_for(timeout=60_000)
            lab.reload()
            view = open_session_view(lab, session_id)
            # the view read this chat's part of the pass again and found it dismissed: it stays hidden
            view.locator('[data-testid="goals-continuity"][data-state="dismissed"]').wait_for(
                state="attached", timeout=20_000)
            assert not view.get_by_role("region", name="After the restart").is_visible()
            other = open_session_view(lab, quiet)
            other.locator('[data-testid="goals-continuity"][data-state="none"]').wait_for(
                state="attached", timeout=20_000)
            assert not other.get_by_role("region", name="After the restart").is_visible()
        finally:
            lab.close()


def test_a_command_whose_outcome_is_unknown_after_a_restart_gets_a_banner_with_settle(
        browser: Browser, tmp_path: Path) -> None:
    """The machine "restarts" mid-command (the server and the command's process group killed, a new boot
    id): the banner says the work went on in a new turn after repair and that the command's outcome is
    unknown, naming the call; "Settle shell…" moves focus to the call's "It ran" button."""
    with run_jupyter_lab(tmp_path) as server:
        goals_ready(server)
        lab = LabPage.open(browser, server)
        try:
            session_id = new_chat_from_panel(lab, "reboot chat", mode="bypass")
            view = session_view(lab, session_id)
            send(view, "slow")
            effect_dir = running_shell(server.state_dir, session_id)
            server.kill()
            assert kill_shell(effect_dir)
            wait_until(lambda: not group_members(effect_dir), "the command's process group to end", 10)
            server.env["JUPYTER_GOALS_BOOT_ID"] = "after-the-restart"
            server.restart()

            banner = view.get_by_role("region", name="After the restart")
            banner.wait_for(timeout=60_000)
            call = effect_events(server, session_id, "dispatched")[0]["payload"]["call_id"]
            wait_until(lambda: call in banner.inner_text(), "the unknown call named")
            text = banner.inner_text()
            assert "went on in a new turn after repair" in text, text
            assert f"A command's outcome is unknown: shell ({call})" in text, text
            item(view, "assistant", "outcome is unknown").wait_for(timeout=60_000)  # the new turn's answer
            click_past_connection_errors(lab, banner.get_by_role("button", name="Settle shell…"))
            focused = "() => document.activeElement && document.activeElement.textContent"
            wait_until(lambda: lab.page.evaluate(focused) == "It ran", "focus on the call's It ran", 5)
            assert lab.page.evaluate(focused) == "It ran"
        finally:
            lab.close()


def test_the_goal_box_shows_known_and_reserved_spend_of_the_budget(browser: Browser, tmp_path: Path) -> None:
    """A priced scripted model ($100 / $1,000 per million input / output tokens): the Goal's first request
    spends 100 + 10 tokens ($0.02); its second takes 60 s, holding a reservation of 1,000 + 100 tokens
    ($0.20, from the per-request limits). While it runs the Goal box above the composer shows
    "$0.02 known + $0.20 reserved of $1.00" and "110 known + 1,100 reserved of 10,000 tokens", the same
    figures the snapshot's Goal carries, and its hover says a request's usage is not known yet."""
    usage = {"input_tokens": 100, "output_tokens": 10}
    model = write_script(tmp_path / "spend.json", [
        {"when": {"last_tool_result_contains": "wrote"}, "respond": {"text": "slow", "delay_s": 60, "usage": usage}},
    ], default={"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "p.txt", "content": "x"}}],
                "usage": usage})
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"version": "test", "extends_shipped": True, "models": {
        "scripted:*": {"input_usd_per_mtok": 100, "output_usd_per_mtok": 1000}}}))
    with run_jupyter_lab(tmp_path, extra_args=(f"--GoalsApp.price_table={prices}",)) as started:
        server = goals_ready(started)
        sid = api(server, "POST", "sessions", {"title": "budget chat", "model": model,
                                               "permissions": {"mode": "bypass"}})["session_id"]
        gid = api(server, "POST", "goals", {
            "session_id": sid, "objective": "Spend a little",
            "requirements": [{"id": "r1", "text": "never.txt exists", "kind": "file_exists", "path": "never.txt"}],
            "budget": {"max_cost_usd": 1.0, "max_tokens": 10_000, "max_input_tokens_per_request": 1000,
                       "max_output_tokens_per_request": 100}})["goal_id"]

        def status() -> dict[str, object]:
            goal = api(server, "GET", f"sessions/{sid}")["goal"]
            return dict(goal.get("budget_status") or {})

        wait_until(lambda: status().get("known_tokens") == 110 and status().get("uncertain_requests") == 1,
                   "the first request settled and the second in flight", 60)
        figures = status()
        assert (round(float(figures["known_cost_usd"]), 4), round(float(figures["reserved_usd"]), 4),  # type: ignore[arg-type]
                figures["reserved_tokens"]) == (0.02, 0.2, 1100), figures
        assert api(server, "GET", f"goals/{gid}")["budget_status"]["reserved_tokens"] == 1100

        lab = LabPage.open(browser, server)
        try:
            view = open_session_view(lab, sid)
            burn = view.locator('[data-testid="goals-composer-goal-budget"]')
            burn.wait_for(timeout=20_000)
            text = burn.inner_text()
            assert "$0.02 known + $0.20 reserved of $1.00" in text, text
            assert "110 known + 1,100 reserved of 10,000 tokens" in text, text
            assert "usage unknown for 1 request(s)" in text, text
            assert "1 request(s) whose usage is not known: still running" in (burn.get_attribute("title") or "")
            lab.screenshot(tmp_path / "budget.png")
        finally:
            lab.close()


def test_the_banner_offers_approve_for_a_waiting_call_and_resume_for_paused_work(
        browser: Browser, tmp_path: Path) -> None:
    """Two chats when the server is killed -9: an ask chat whose write waits for approval, and a chat paused
    while its command ran. After the restart (the page not reloaded) each chat's banner offers the action
    that fits: "Approve…" moves focus to the waiting call's Approve button (approved, the write runs once),
    "Resume" resumes the paused work (its intent is `run` again and it finishes).

    The view's own reads of the paused chat are held from before the pause until after Resume is clicked, so
    the view still shows the version before the pause: the banner acts on what it read itself, the version its
    actions were computed from (with the view's version the server refused the Resume as stale, 409: seen
    once in CI, where the view's read after the restart came after the banner's). A control made after the
    banner's read gets its Resume refused once: the refusal reads the banner again and the next click is taken."""
    model = write_script(tmp_path / "ask.json", [{"when": {"last_tool_result_contains": ""}, "respond": {"text": "written"}}],
                         default={"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}]})
    with run_jupyter_lab(tmp_path) as server:
        goals_ready(server)
        asking = api(server, "POST", "sessions", {"title": "asking chat", "model": model,
                                                  "permissions": {"mode": "ask"}})["session_id"]
        paused = api(server, "POST", "sessions", {"title": "paused chat", "permissions": {"mode": "bypass"}})["session_id"]
        lab = LabPage.open(browser, server)
        try:
            ask_view = open_session_view(lab, asking)
            send(ask_view, "write it")
            ask_view.get_by_role("button", name="Approve", exact=True).wait_for(timeout=30_000)
            slow_view = open_session_view(lab, paused)
            send(slow_view, "slow")
            wait_until(lambda: bool(effect_events(server, paused, "dispatched")), "the command to start", 30)
            held: list[Route] = []
            holding = True

            def hold(route: Route) -> None:  # once released, every read goes through
                if holding:
                    held.append(route)
                else:
                    route.continue_()

            lab.page.route(re.compile(rf"/api/goals/sessions/{paused}(\?|$)"), hold)
            version = api(server, "GET", f"sessions/{paused}")["work"]["control_version"]
            api(server, "POST", f"sessions/{paused}/actions", {"action": "pause", "expected_control_version": version})

            server.kill()
            server.restart()
            banner = slow_view.get_by_role("region", name="After the restart")
            banner.wait_for(timeout=60_000)
            wait_until(lambda: banner.get_by_role("button", name="Resume").count() == 1, "Resume offered", 60)
            # a control since the banner's read (a permission change over REST bumps the version, the work stays
            # paused; the view's reads are held, so nothing reads the banner again): its Resume is refused 409,
            # and the refusal reads the banner again, so the next click is taken
            shown = api(server, "GET", f"sessions/{paused}")["work"]["control_version"]
            api(server, "PATCH", f"sessions/{paused}", {"permissions": {"mode": "bypass"},
                                                        "expected_control_version": shown})
            stale = banner.get_by_role("button", name="Resume").element_handle()
            click_past_connection_errors(lab, banner.get_by_role("button", name="Resume"))
            stale.wait_for_element_state("hidden", timeout=20_000)  # replaced: the banner was read again
            alert = slow_view.get_by_test_id("goals-session-alert")
            assert "Conflict (409)" in (alert.text_content() or ""), alert.text_content()
            assert api(server, "GET", f"sessions/{paused}")["work"]["desired_state"] == "paused"
            click_past_connection_errors(lab, banner.get_by_role("button", name="Resume"))
            wait_until(lambda: api(server, "GET", f"sessions/{paused}")["work"]["desired_state"] == "run",
                       "the work resumed", 20, lambda: f"the view's alert: {alert.text_content()!r}")
            assert held, "the view read its snapshot while the test held its reads"
            holding = False
            for route in held:
                route.continue_()
            wait_until(lambda: banner.get_by_role("button", name="Resume").count() == 0, "Resume no longer offered", 30)
            item(slow_view, "assistant", "").last.wait_for(timeout=60_000)
            wait_until(lambda: api(server, "GET", f"sessions/{paused}")["work"]["phase"] == "done", "it finished", 60)

            lab.page.evaluate("([sid]) => window.jupyterapp.commands.execute('jupyter-goals:open-session', "
                              "{session_id: sid})", [asking])
            ask_banner = ask_view.get_by_role("region", name="After the restart")
            ask_banner.wait_for(timeout=30_000)
            click_past_connection_errors(lab, ask_banner.get_by_role("button", name="Approve…"))
            focused = "() => document.activeElement && document.activeElement.textContent"
            wait_until(lambda: lab.page.evaluate(focused) == "Approve", "focus on the waiting call's Approve", 5)
            lab.page.keyboard.press("Enter")
            item(ask_view, "assistant", "written").wait_for(timeout=60_000)
            assert (server.root_dir / "a.txt").read_text() == "x"
            assert len(effect_events(server, asking, "dispatched")) == 1
        finally:
            lab.close()
