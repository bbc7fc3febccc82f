"""The terminal UI's permissions screen, model picker and quit question (issue 31), driven by Textual's
Pilot at 80x24 against real ``jupyter server`` processes with the scripted model: a revoked allow rule
makes the next call ask again, the mode switch and the model choice read back over REST, a change sent
against a stale control version answers 409 and shows the state as it is now, and quitting while a
message typed with the server down is not sent asks first."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual")

from jupyter_goals.clients.tui.approval import ApprovalScreen  # noqa: E402
from jupyter_goals.clients.tui.link import UNREACHABLE  # noqa: E402
from jupyter_goals.clients.tui.permissions import ModelScreen, PermissionsScreen  # noqa: E402
from jupyter_goals.clients.tui.quit import QuitScreen  # noqa: E402
from jupyter_goals.clients.tui.session import SessionScreen  # noqa: E402
from jupyter_goals.testing import ServerFactory, ServerProcess, wait_for  # noqa: E402
from tests.tuikit import SIZE, shown, tui, until  # noqa: E402

RULES: list[dict[str, Any]] = [
    {"when": {"last_tool_result_contains": "denied by the user"}, "respond": {"text": "Understood, not done."}},
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "Appended one line."}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo line >> out.txt"}}]}},
    {"when": {"last_user_contains": "hello"}, "respond": {"text": "Hello from the scripted model."}},
]
MISSING_KEY_ENV = "JG_TUI_TEST_KEY_NOT_SET"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path, RULES)
    try:
        yield factory
    finally:
        factory.close()


def out_lines(servers: ServerFactory) -> int:
    out = servers.root / "out.txt"
    return len(out.read_text().splitlines()) if out.exists() else 0


def user_messages(server: ServerProcess, sid: str) -> list[str]:
    items = server.client().session(sid, after=0, limit=500)["transcript"]["items"]
    return [i["content"] for i in items if i["kind"] == "user"]


async def test_revoked_allow_rule_makes_the_next_call_ask_again_and_the_mode_switches(servers: ServerFactory) -> None:
    server = servers.make().start()
    client = server.client()
    sid = client.create_session(title="rules", permissions={"mode": "ask", "allow": ["shell"]})["session_id"]
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and "| connected" in shown(app), "the session")
        await pilot.press(*"append", "enter")
        await until(pilot, lambda: "Appended one line." in shown(app), "the call the rule allowed", within=60)
        assert client.approvals(state=None) == [] and out_lines(servers) == 1
        await pilot.press("f10")
        await until(pilot, lambda: isinstance(app.screen, PermissionsScreen) and "every shell call" in shown(app),
                    "the permissions screen with the rule")
        assert "Mode: ask" in shown(app)
        await pilot.press("d")
        await until(pilot, lambda: "(none)" in shown(app) and "Revoked: shell asks again" in shown(app), "revoked")
        assert client.session(sid)["session"]["permissions"]["allow"] == []
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), "back to the session")
        await pilot.press(*"append again", "enter")
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the same call asks now", within=60)
        modal = app.screen
        assert isinstance(modal, ApprovalScreen) and "Tool: shell" in shown(app)
        await until(pilot, lambda: time.monotonic() - modal.shown_at > 0.5, "the guard to pass")
        await pilot.press("n")
        await until(pilot, lambda: "Understood, not done." in shown(app), "the denial's answer", within=60)
        await pilot.press("ctrl+s")  # the other key of the same screen
        await until(pilot, lambda: isinstance(app.screen, PermissionsScreen) and "Mode: ask" in shown(app), "permissions")
        await pilot.press("m")
        await until(pilot, lambda: "Mode: bypass" in shown(app), "the mode switched")
        permissions = client.session(sid)["session"]["permissions"]
        assert (permissions["mode"], permissions["allow"]) == ("bypass", [])
        await pilot.press("escape")
        await until(pilot, lambda: "| bypass |" in shown(app), "the status line's mode")
    assert out_lines(servers) == 1


async def test_model_picker_marks_missing_credentials_and_a_stale_change_shows_the_current_state(
        servers: ServerFactory) -> None:
    models = {"nokey": {"provider": "openai", "model": "gpt-test", "api_key_env": MISSING_KEY_ENV,
                        "description": "A hosted model whose key is not set."}}
    server = servers.make([f"--GoalsApp.models={json.dumps(models)}"]).start()
    client = server.client()
    sid = client.create_session(title="models")["session_id"]
    client.send(sid, "append", client_request_id="x")  # unfinished work (waiting): its version moves with a change
    wait_for(lambda: bool(client.approvals()), what="an approval")
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval")
        await pilot.press("escape")  # answer later
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), "the session")
        await pilot.press("ctrl+p")
        await pilot.press(*"Permissions", "enter")
        await until(pilot, lambda: isinstance(app.screen, PermissionsScreen) and "(none)" in shown(app),
                    "the permissions screen from the palette")
        screen = app.screen
        assert isinstance(screen, PermissionsScreen)
        stale = await screen.link.get(f"/sessions/{sid}", {"before": "latest", "limit": 1})
        await asyncio.to_thread(client.set_permissions, sid, {"mode": "ask", "allow": ["grep"]})  # someone else
        await until(pilot, lambda: "every grep call" in shown(app), "the screen following that change")
        # as drawn when the key is pressed before that change reached the screen: stop following first, and let
        # the reads already started by its events land, so that none lands after the stale drawing
        screen.link.listeners.remove(screen._event)
        await screen.workers.wait_for_complete()
        screen.show(stale)
        assert "every grep call" not in shown(app)
        await pilot.press("m")
        await until(pilot, lambda: "Conflict (409)" in shown(app), "the conflict in words")
        assert "Nothing changed by you. Now: mode ask, 1 allow rule(s)" in shown(app) and "every grep call" in shown(app)
        assert client.session(sid)["session"]["permissions"]["mode"] == "ask"
        screen.link.listeners.append(screen._event)  # following again, as the screen does
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ModelScreen) and "nokey" in shown(app), "the models")
        text = shown(app)
        assert "nokey no credentials: cannot answer yet" in text
        assert "scripted: script.json in use, default, has credentials" in text
        await pilot.press("down")
        await until(pilot, lambda: "openai:gpt-test: A hosted model whose key is not set." in shown(app), "its line")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, PermissionsScreen), "back with the model chosen")
        await until(pilot, lambda: "Model: nokey" in shown(app) or "Model: openai:gpt-test" in shown(app),
                    "the new model on the permissions screen")
        assert any("no credentials on the server" in str(n.message) for n in app._notifications)
    assert client.session(sid)["session"]["model"] in ("nokey", "openai:gpt-test")


@pytest.mark.slow
async def test_quit_with_a_message_not_sent_asks_first_and_n_keeps_it_until_it_is_sent(servers: ServerFactory) -> None:
    server = servers.make().start()
    sid = server.client().create_session(title="quit")["session_id"]
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and "| connected" in shown(app), "the session")
        await asyncio.to_thread(server.kill)
        await until(pilot, lambda: UNREACHABLE in shown(app), "the server gone")
        await pilot.press(*"hello while down", "enter")
        await until(pilot, lambda: "(sending…): hello while down" in shown(app), "the message waiting")
        await pilot.press("ctrl+q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen), "the question")
        assert "1 message not sent: quit anyway? y/n" in shown(app)
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), "stayed")
        assert not app._exit and app.link.unsent() == 1
        await asyncio.to_thread(server.start, same_port=True)
        await until(pilot, lambda: app.link.unsent() == 0, "the message acknowledged", within=60)
        await pilot.press("ctrl+q")  # nothing waits now: quits at once
        await until(pilot, lambda: app._exit, "quit")
        assert not any(isinstance(s, QuitScreen) for s in app.screen_stack)
    assert user_messages(server, sid) == ["hello while down"]


async def test_quit_anyway_with_y_loses_the_message_it_named(servers: ServerFactory) -> None:
    server = servers.make().start()
    sid = server.client().create_session(title="quit anyway")["session_id"]
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and "| connected" in shown(app), "the session")
        await asyncio.to_thread(server.kill)
        await until(pilot, lambda: UNREACHABLE in shown(app), "the server gone")
        await pilot.press(*"one", "enter", *"two", "enter")
        await until(pilot, lambda: app.link.unsent() == 2, "two messages waiting")
        await pilot.press("ctrl+q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen), "the question")
        assert "2 messages not sent: quit anyway? y/n" in shown(app)
        await pilot.press("y")
        await until(pilot, lambda: app._exit, "quit")
    server.start(same_port=True)
    assert user_messages(server, sid) == []
