"""More of the front door (issue 12) in a real JupyterLab: the keyboard path through New chat and the
composer, the model picker with a model whose credentials are missing, steering a running turn, a
command whose outcome is unknown after a machine restart, and the notification of failed work.

Real ``jupyter lab`` processes (tests/browser.py), headless Debian Chromium through Playwright;
controls are found by role and accessible name.
"""

from __future__ import annotations

import json
import os
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
    notifications,
    require_chromium,
    run_jupyter_lab,
    send,
    session_view,
    transcript,
    wait_until,
)
from .servers import running_shell, write_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()

#: an API key variable nobody sets: the named model that reads it has no credentials
MISSING_KEY_ENV = "JUPYTER_GOALS_TEST_NEVER_SET_KEY"


def focused(page: Page, locator: Locator) -> None:
    """``locator`` has the keyboard focus; if not, the failure names the element that has it (and the
    focus moves seen meanwhile) so that a focus taken by something else says what took it."""
    from playwright.sync_api import expect

    try:
        expect(locator).to_be_focused()
    except AssertionError as exc:
        active = page.evaluate("() => { const a = document.activeElement; return a ? a.outerHTML.slice(0, 300) : null }")
        raise AssertionError(f"{exc}\nthe focus is on: {active}") from exc


def test_keyboard_creates_a_chat_reaches_message_then_send_and_enter_sends(browser: Browser, tmp_path: Path) -> None:
    """Only the keyboard: Enter on "New chat" opens the form with Title focused; Tab walks Title,
    Working folder, Model, Permission mode, Allowed tools; Enter creates the chat. In the session view
    Tab goes from the transcript to "Message", then to "Send"; Shift+Enter adds a line (nothing is
    sent), Enter sends the two lines as one message, and Enter on the focused Send button sends too."""
    from playwright.sync_api import expect

    with run_jupyter_lab(tmp_path) as server:
        goals_ready(server)
        lab = LabPage.open(browser, server)
        page = lab.page
        try:
            lab.open_goals_sidebar()
            page.get_by_role("button", name="New chat", exact=True).focus()
            page.keyboard.press("Enter")
            dialog = page.get_by_role("dialog")
            focused(page, dialog.get_by_label("Title"))
            page.keyboard.type("keyboard chat")
            for name in ("Working folder", "Model", "Permission mode", "Allowed tools (comma separated)"):
                page.keyboard.press("Tab")
                focused(page, dialog.get_by_label(name))
            page.keyboard.type("shell")
            page.keyboard.press("Enter")

            view = session_view(lab).filter(has=page.get_by_role("heading", name="keyboard chat"))
            view.wait_for(timeout=20_000)
            session_id = str(view.get_attribute("data-session-id"))
            session = api(server, "GET", f"sessions/{session_id}")["session"]
            assert session["title"] == "keyboard chat"
            assert session["permissions"]["allow"] == ["shell"], session["permissions"]

            box = view.get_by_role("textbox", name="Message")
            send_button = view.get_by_role("button", name="Send", exact=True)
            view.get_by_role("log", name="Transcript").focus()
            page.keyboard.press("Tab")
            focused(page, box)
            page.keyboard.press("Tab")
            focused(page, send_button)

            page.keyboard.press("Shift+Tab")
            focused(page, box)
            page.keyboard.type("first line")
            page.keyboard.press("Shift+Enter")  # a new line, not a send
            page.keyboard.type("list")
            expect(box).to_have_value("first line\nlist")
            assert view.locator('[data-testid="goals-outgoing"]').count() == 0
            page.keyboard.press("Enter")
            expect(box).to_have_value("")
            item(view, "assistant", "Those are the files").wait_for(timeout=60_000)

            box.focus()
            page.keyboard.type("hello")
            page.keyboard.press("Tab")
            focused(page, send_button)
            page.keyboard.press("Enter")  # the focused Send button
            item(view, "assistant", "I am the offline demo model").wait_for(timeout=60_000)
            users = [i["content"] for i in transcript(server, session_id) if i["kind"] == "user"]
            assert users == ["first line\nlist", "hello"], users
            assert lab.console_errors == [], lab.console_errors
        finally:
            lab.close()


def test_model_picker_shows_missing_credentials_creates_with_the_chosen_model_and_failed_work_notifies_once(
    browser: Browser, tmp_path: Path
) -> None:
    """A server configured (``GoalsApp.models``) with "nokey", a hosted model whose key variable is not
    set, and "refusing", a scripted model that answers every request with a 401: the New chat form lists
    "nokey (credentials missing)" and says it cannot answer yet; choosing it (not the default "demo")
    creates a session with that model. A chat on "refusing" fails: the JupyterLab notification
    "Work failed: …" appears once, also after later events reached the page."""
    from playwright.sync_api import expect

    assert MISSING_KEY_ENV not in os.environ
    refusing = write_script(tmp_path / "refusing.json", [],
                            default={"error": {"status": 401, "message": "invalid api key"}})
    models = {
        "nokey": {"provider": "openai", "model": "gpt-test", "api_key_env": MISSING_KEY_ENV,
                  "description": "A hosted model."},
        "refusing": {"provider": "scripted", "model": refusing.removeprefix("scripted:"),
                     "description": "Refuses every request."},
    }
    with run_jupyter_lab(tmp_path, extra_args=(f"--GoalsApp.models={json.dumps(models)}",)) as server:
        goals_ready(server)
        listed = {m["name"]: m for m in api(server, "GET", "models")["models"]}
        assert listed["nokey"]["credentials_present"] is False, listed
        assert listed["demo"]["default"] is True, listed
        lab = LabPage.open(browser, server)
        page = lab.page
        try:
            lab.open_goals_sidebar()
            page.get_by_role("button", name="New chat", exact=True).click()
            dialog = page.get_by_role("dialog")
            picker = dialog.get_by_label("Model")
            expect(picker).to_have_value("demo")  # the server's default is proposed
            options = picker.locator("option").all_inner_texts()
            assert "nokey (credentials missing)" in options, options
            assert "refusing" in options and "demo" in options, options
            about = dialog.locator('[data-testid="goals-new-chat-model-description"]')
            picker.select_option("nokey")
            expect(about).to_contain_text("A hosted model.")
            expect(about).to_contain_text("Its credentials are not set on the server, so it cannot answer yet.")
            picker.select_option("refusing")
            expect(about).to_have_text("Refuses every request.")
            picker.select_option("nokey")
            dialog.get_by_label("Title").fill("nokey chat")
            dialog.get_by_role("button", name="Create").click()
            view = session_view(lab).filter(has=page.get_by_role("heading", name="nokey chat"))
            view.wait_for(timeout=20_000)
            nokey_id = str(view.get_attribute("data-session-id"))
            assert api(server, "GET", f"sessions/{nokey_id}")["session"]["model"] == "nokey"
            expect(view.locator('[data-testid="goals-session-model"]')).to_contain_text("(credentials missing)")

            failed_id = new_chat_from_panel(lab, "refusing chat", model="refusing")
            failed_session = api(server, "GET", f"sessions/{failed_id}")["session"]
            assert failed_session["model"] == refusing, failed_session["model"]
            failed_view = session_view(lab, failed_id)
            send(failed_view, "hi")
            failed_view.and_(page.locator('[data-phase="failed"]')).wait_for(timeout=60_000)
            work = api(server, "GET", f"sessions/{failed_id}")["work"]
            assert work["phase"] == "failed" and "401" in work["reason"], work
            toasts = page.locator(".jp-toast-message").filter(has_text="Work failed:")
            toasts.first.wait_for(timeout=10_000)
            assert "401" in toasts.first.inner_text(), toasts.first.inner_text()

            # later events reached the page (a demo chat answered in its view): still one notification
            demo_id = new_chat_from_panel(lab, "later chat", mode="bypass")
            send(session_view(lab, demo_id), "hello")
            item(session_view(lab, demo_id), "assistant", "I am the offline demo model").wait_for(timeout=60_000)
            assert notifications(lab, "Work failed:") == 1
        finally:
            lab.close()


OUTBOX_LINE = """(text) => {
  window.__outboxLine = {shown: null, removed: null};
  const check = () => {
    const line = window.__outboxLine;
    const rows = [...document.querySelectorAll('[data-testid="goals-outgoing"]')].filter(
      (row) => row.querySelector('.jp-goals-outgoing-text')?.textContent === text);
    if (rows.length > 0 && line.shown === null && rows[0].textContent.includes('joins the running turn')) {
      line.shown = Date.now();
    } else if (rows.length === 0 && line.shown !== null && line.removed === null) {
      line.removed = Date.now();
    }
  };
  new MutationObserver(check).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def test_steer_chosen_in_the_composer_joins_the_running_turn(browser: Browser, tmp_path: Path) -> None:
    """While "slow" runs the composer offers Queue / Steer; the person picks Steer and sends "list":
    the message is accepted as `steer` into the running work (REST: its `message.accepted` event), the
    outbox line says it joins the running turn and stays until the server put the message into the
    transcript (the step after the command: not when the 202 came), and the same work reads it after
    the command: the answer to "list" follows the slow command's result in one piece of work."""
    from playwright.sync_api import expect

    with run_jupyter_lab(tmp_path) as server:
        goals_ready(server)
        lab = LabPage.open(browser, server)
        try:
            session_id = new_chat_from_panel(lab, "steer chat", mode="bypass")
            view = session_view(lab, session_id)
            send(view, "slow")
            call_state = item(view, "tool_call").first.locator('[data-testid="goals-effect-state"]')
            call_state.and_(lab.page.locator('[data-value="dispatched"]')).wait_for(timeout=30_000)
            slow_work = api(server, "GET", f"sessions/{session_id}")["work"]["work_id"]

            queue, steer = view.get_by_role("radio", name="Queue"), view.get_by_role("radio", name="Steer")
            expect(queue).to_be_checked()
            steer.check()
            expect(steer).to_be_checked()
            lab.page.evaluate(OUTBOX_LINE, "list")
            send(view, "list")
            wait_until(lambda: lab.page.evaluate("() => window.__outboxLine.shown !== null"),
                       "the outbox line saying the message joins the running turn", 10)

            accepted = [e for e in api(server, "GET", "events?format=json&after=0&limit=5000")["events"]
                        if e["kind"] == "message.accepted" and e["session_id"] == session_id]
            assert [(e["payload"]["delivery"], e["work_id"]) for e in accepted][-1] == ("steer", slow_work), accepted
            message_id = accepted[-1]["payload"]["message_id"]
            assert len(effect_events(server, session_id, "committed")) == 0  # it came while the command ran

            item(view, "assistant", "Those are the files").wait_for(timeout=60_000)
            line = view.locator('[data-testid="goals-outgoing"]')
            wait_until(lambda: line.count() == 0, "the outbox to empty")
            items = transcript(server, session_id)
            steered = next(i for i in items if i["kind"] == "user" and i["content"] == "list")
            assert steered["item_id"] == f"steer:{message_id}" and steered["work_id"] == slow_work, steered
            slow_result = next(i for i in items if i["kind"] == "tool_result")
            assert slow_result["seq"] < steered["seq"], items
            assert api(server, "GET", f"sessions/{session_id}")["work"]["work_id"] == slow_work
            committed = next(e["ts"] for e in api(server, "GET", "events?format=json&after=0&limit=5000")["events"]
                             if e["kind"] == "transcript.item" and e["payload"]["item_id"] == f"steer:{message_id}")
            removed = lab.page.evaluate("() => window.__outboxLine.removed") / 1000
            assert removed >= committed, f"the outbox line went {committed - removed:.1f} s before the message was in the transcript"
        finally:
            lab.close()


def test_command_killed_by_a_machine_restart_shows_outcome_unknown(browser: Browser, tmp_path: Path) -> None:
    """"slow" runs; the machine "restarts": the server is killed -9, the command's process group is
    killed too and the server starts again under a new boot id. The same page shows the call's effect
    state as "unknown" (its words: "outcome unknown"), its result says the command is not run again,
    and the interruption marker says the command's outcome is unknown; the command never wrote."""
    from playwright.sync_api import expect

    with run_jupyter_lab(tmp_path) as server:
        goals_ready(server)
        lab = LabPage.open(browser, server)
        try:
            session_id = new_chat_from_panel(lab, "reboot chat", mode="bypass")
            view = session_view(lab, session_id)
            send(view, "slow")
            effect_dir = running_shell(server.state_dir, session_id)
            call = item(view, "tool_call").first
            call_state = call.locator('[data-testid="goals-effect-state"]')
            call_state.and_(lab.page.locator('[data-value="dispatched"]')).wait_for(timeout=10_000)

            server.kill()
            assert kill_shell(effect_dir)
            wait_until(lambda: not group_members(effect_dir), "the command's process group to end", 10)
            server.env["JUPYTER_GOALS_BOOT_ID"] = "after-the-restart"
            server.restart()

            unknown = call_state.and_(lab.page.locator('[data-value="unknown"]'))
            unknown.wait_for(timeout=60_000)
            expect(unknown).to_have_attribute("title", "Effect state: outcome unknown")
            result = item(view, "tool_result").filter(
                has=lab.page.locator('[data-testid="goals-effect-state"][data-value="unknown"]'))
            expect(result).to_contain_text("the command's outcome is unknown and it is not run again")
            marker = view.locator('[data-testid="goals-interruption"]').first
            expect(marker).to_contain_text("Interrupted by a server restart; the command's outcome is unknown.")
            slow_call = effect_events(server, session_id, "dispatched")[0]["payload"]["call_id"]
            assert [e["payload"]["call_id"] for e in effect_events(server, session_id, "unknown")] == [slow_call]
            assert call.locator('[data-testid="goals-call-cancel"]').count() == 0
            assert not (server.root_dir / "slow-demo.log").exists()
        finally:
            lab.close()
