"""The terminal UI (issue 31) driven by Textual's Pilot (``App.run_test``, 80x24) against real ``jupyter
server`` processes with the scripted model: one test per screen (picker, session, approval, Goal panel,
attention list, help), the approval that a key typed as it arrives never answers, and a server killed -9
and restarted under an open TUI (tests/test_tui_tmux.py runs the same in a real terminal)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual")

from textual.command import CommandList, CommandPalette  # noqa: E402

from jupyter_goals.clients.tui import approval as approval_module  # noqa: E402
from jupyter_goals.clients.tui.approval import ApprovalScreen  # noqa: E402
from jupyter_goals.clients.tui.keys import SCREENS, HelpScreen, key_rows  # noqa: E402
from jupyter_goals.clients.tui.link import UNREACHABLE  # noqa: E402
from jupyter_goals.clients.tui.panels import AttentionScreen, GoalScreen, RecordScreen  # noqa: E402
from jupyter_goals.clients.tui.picker import PICKER_PAGE, PickerScreen  # noqa: E402
from jupyter_goals.clients.tui.session import SessionScreen  # noqa: E402
from jupyter_goals.testing import ServerFactory, ServerProcess, wait_for  # noqa: E402
from tests.tuikit import SIZE, shown, tui, until  # noqa: E402

RULES: list[dict[str, Any]] = [
    {"when": {"last_tool_result_contains": "denied by the user"}, "respond": {"text": "Understood, not done."}},
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "Appended one line."}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo line >> out.txt"}}]}},
    {"when": {"last_user_contains": "hello"},
     "respond": {"text": "Hello from the scripted model.", "usage": {"input_tokens": 3, "output_tokens": 2}}},
    {"when": {"last_user_contains": "long", "last_tool_result_contains": "exit status"}, "respond": {"text": "Long done."}},
    {"when": {"last_user_contains": "long"},
     "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60; echo line >> long.txt"}}]}},
    {"when": {"last_user_contains": "stream"},
     "respond": {"stream_chunks": ["Streaming ", "one ", "piece ", "at a time."], "chunk_delay_s": 0.4}},
]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path, RULES)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    return servers.make().start()


def pending(server: ServerProcess) -> list[dict[str, Any]]:
    return server.client().approvals()


def out_lines(servers: ServerFactory) -> int:
    out = servers.root / "out.txt"
    return len(out.read_text().splitlines()) if out.exists() else 0


async def test_picker_pages_every_session_and_filters_by_text_and_state(server: ServerProcess) -> None:
    client = server.client()
    for i in range(PICKER_PAGE + 12):
        client.create_session(title=f"alpha {i:02d}")
    beta = client.create_session(title="beta notes")["session_id"]
    app = tui(server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, PickerScreen) and len(app.screen.sessions) >= PICKER_PAGE,
                    "the first page")
        picker = app.screen
        assert isinstance(picker, PickerScreen)
        assert len(picker.sessions) == PICKER_PAGE and picker.cursor  # paged like GET /sessions
        assert "more below" in shown(app)
        for _ in range(8):
            await pilot.press("pagedown")
        await until(pilot, lambda: len(picker.sessions) == PICKER_PAGE + 13, "every session after paging")
        await pilot.press(*"beta")
        await until(pilot, lambda: [s["session_id"] for s in picker.sessions] == [beta], "the text filter")
        await pilot.press("ctrl+t")  # state filter: working/queued/recovering: none of them
        await until(pilot, lambda: picker.sessions == [] and "state: working" in shown(app), "the state filter")
        for _ in range(6):
            await pilot.press("ctrl+t")  # … → idle
        await until(pilot, lambda: [s["session_id"] for s in picker.sessions] == [beta], "state idle")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and app.screen.session_id == beta,
                    "the session opened")


async def test_session_screen_shows_transcript_streams_answers_and_sends_with_actions(server: ServerProcess) -> None:
    client = server.client()
    sid = client.create_session(title="chat one")["session_id"]
    client.send(sid, "hello", client_request_id="first")
    client.wait(sid)
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "Hello from the scripted model." in shown(app) and "| connected" in shown(app),
                    "the transcript and the stream connected")
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        text = shown(app)
        assert "chat one | scripted | ask | send: queue | connected" in text
        assert "Known $" in text and "active " in text
        assert "off: Pause, Resume, Stop, Retry" in text  # the work is done: nothing to act on
        assert "why off: The request finished" in text  # disabled with the server's reason
        await pilot.press("f3")  # Resume is off: said, nothing sent
        await until(pilot, lambda: any("Resume is not available now" in str(n.message) for n in app._notifications),
                    "the refusal in words")
        await pilot.press("ctrl+p")  # the command palette: the same action, the same refusal
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the command palette")
        await pilot.press(*"Retry")

        def offered() -> str:
            options = app.screen.query_one(CommandList)
            return str(options.get_option_at_index(0).prompt) if options.option_count else ""

        await until(pilot, lambda: offered().startswith("Retry") and "(off: The request finished" in offered(),
                    "the palette's Retry, off with the server's reason")
        await pilot.press("enter")
        await until(pilot, lambda: any("Retry is not available now" in str(n.message) for n in app._notifications),
                    "the palette's refusal in words")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), "the palette closed")
        await pilot.press(*"stream it", "enter")
        await until(pilot, lambda: "assistant (streaming): Streaming" in shown(app), "the streamed draft")
        assert "at a time." not in shown(app).split("(streaming)")[1]  # seen before the whole answer
        await until(pilot, lambda: "assistant: Streaming one piece at a time." in shown(app), "the committed answer")
        user_items = [i for i in screen.state.items.values() if i["kind"] == "user" and i["content"] == "stream it"]
        assert len(user_items) == 1 and screen.outbox.messages == []
        await pilot.press("ctrl+t")
        await until(pilot, lambda: "send: steer" in shown(app), "steer mode")


async def test_stop_by_key_cancels_the_running_command_and_says_so_in_words(server: ServerProcess,
                                                                            servers: ServerFactory) -> None:
    client = server.client()
    sid = client.create_session(title="stop me", permissions={"mode": "bypass"})["session_id"]
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and bool(app.screen.state.snap), "the session")
        await pilot.press(*"long one", "enter")
        await until(pilot, lambda: "(dispatched)" in shown(app) and "keys: F2 Pause  F4 Stop" in shown(app),
                    "the command running, Stop offered", within=60)
        await pilot.press("f4")
        await until(pilot, lambda: "-- stopped: Stopped by you" in shown(app), "the Stop marker in words")
        await until(pilot, lambda: "cancelled" in shown(app).splitlines()[1], "the phase")
        assert "a command still running was terminated" in shown(app)
    assert client.session(sid)["work"]["phase"] == "cancelled"
    assert not (servers.root / "long.txt").exists()


async def test_older_pages_are_read_when_scrolled_to_the_top(server: ServerProcess) -> None:
    client = server.client()
    sid = client.create_session(title="long")["session_id"]
    for i in range(3):
        client.send(sid, f"hello {i}", client_request_id=f"h{i}")
        client.wait(sid)
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and bool(app.screen.state.items), "loaded")
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        screen.state.items.clear()  # pretend only the newest page was read: ask for it again with a small page
        page = await screen.link.get(f"/sessions/{sid}", {"before": "latest", "limit": 2})
        screen.state.prev_cursor = None
        screen.state.take_page(page)
        assert screen.state.prev_cursor and min(screen.state.items) == 5
        await pilot.press("ctrl+b")
        await until(pilot, lambda: min(screen.state.items) == 1, "the older page")


async def test_key_typed_as_the_approval_arrives_never_answers_it(server: ServerProcess, servers: ServerFactory,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    client = server.client()
    sid = client.create_session(title="ask")["session_id"]
    # A loaded machine can stall the test's own loop for more than the real half second between the modal
    # appearing and the key: while the key is pressed the guard is a minute, then the real one again.
    monkeypatch.setattr(approval_module, "GUARD_S", 60.0)
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and bool(app.screen.state.snap), "the session")
        await pilot.press(*"append", "enter")
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval modal", within=60)
        await pilot.press("y")  # the instant it appears
        await pilot.press("y")
        assert "Key ignored" in shown(app)
        monkeypatch.setattr(approval_module, "GUARD_S", 0.5)
        assert [a["state"] for a in await asyncio.to_thread(pending, server)] == ["pending"]
        modal = app.screen
        assert isinstance(modal, ApprovalScreen)
        text = shown(app)
        assert "Tool: shell" in text and "echo line >> out.txt" in text and "always allows shell" in text
        await until(pilot, lambda: time.monotonic() - modal.shown_at > 0.5, "the guard to pass")
        await pilot.press("y")
        await until(pilot, lambda: "Appended one line." in shown(app), "the approved call's answer", within=60)
        assert out_lines(servers) == 1
        assert client.approvals(state="approved") == [] and client.approvals(state="pending") == []


async def test_pending_approval_is_shown_again_on_the_next_start_and_a_denies_nothing(server: ServerProcess,
                                                                                      servers: ServerFactory) -> None:
    client = server.client()
    sid = client.create_session(title="left pending")["session_id"]
    client.send(sid, "append", client_request_id="x")
    wait_for(lambda: bool(client.approvals()), what="an approval")
    app = tui(server, continue_last=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval, again")
        modal = app.screen
        assert isinstance(modal, ApprovalScreen)
        await until(pilot, lambda: time.monotonic() - modal.shown_at > 0.5, "the guard to pass")
        await pilot.press("n")
        await until(pilot, lambda: "Understood, not done." in shown(app), "the denial's answer", within=60)
    assert out_lines(servers) == 0
    assert [a["state"] for a in client.approvals(state=None)] == ["denied"]


async def test_always_allow_adds_a_session_rule_and_runs_the_call(server: ServerProcess, servers: ServerFactory) -> None:
    client = server.client()
    sid = client.create_session(title="always")["session_id"]
    client.send(sid, "append", client_request_id="x")
    wait_for(lambda: bool(client.approvals()), what="an approval")
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval")
        modal = app.screen
        assert isinstance(modal, ApprovalScreen)
        await until(pilot, lambda: time.monotonic() - modal.shown_at > 0.5, "the guard to pass")
        await pilot.press("a")
        await until(pilot, lambda: "Appended one line." in shown(app), "the call's answer", within=60)
    assert out_lines(servers) == 1
    assert client.session(sid)["session"]["permissions"]["allow"] == ["shell"]


async def test_goal_panel_attention_list_and_help(server: ServerProcess) -> None:
    client = server.client()
    other = client.create_session(title="elsewhere")["session_id"]
    client.send(other, "append", client_request_id="x")
    wait_for(lambda: bool(client.approvals()), what="an approval in another session")
    sid = client.create_session(title="with a goal")["session_id"]
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and bool(app.screen.state.snap), "the session")
        await pilot.press(*"/goal write the report", "enter")
        await until(pilot, lambda: bool(client.goals(sid)), "the Goal created")
        await pilot.press("f8")
        await until(pilot, lambda: isinstance(app.screen, GoalScreen) and "Goal: write the report" in shown(app),
                    "the Goal panel")
        assert "State:" in shown(app) and "Requirements:" in shown(app)
        goal_screen = app.screen
        await until(pilot, lambda: bool((goal_screen.goal or {}).get("actions", {}).get("can_end")), "End offered")
        await pilot.press("e")  # End: the Goal becomes a read-only history entry
        await until(pilot, lambda: "cancelled: write the report" in shown(app), "the ended Goal in the history")
        await pilot.press("tab", "enter")
        await until(pilot, lambda: isinstance(app.screen, RecordScreen), "the record opened")
        assert "Read-only record of an ended Goal (cancelled)" in shown(app) and "Goal: write the report" in shown(app)
        await pilot.press("escape", "escape")
        await until(pilot, lambda: "-- Goal cancelled: write the report (its record: F8) --" in shown(app),
                    "the terminal record's marker in the transcript")
        await pilot.press("f9")
        await until(pilot, lambda: isinstance(app.screen, AttentionScreen) and "approval: shell" in shown(app),
                    "the attention list")
        assert "(elsewhere)" in shown(app)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the other session's approval")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and app.screen.session_id == other, "its session")
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        text = shown(app)
        for _, screen in SCREENS:
            for key, _description in key_rows(list(screen.BINDINGS)):
                assert key in text
        for key in ("f1", "f9 / ctrl+l", "ctrl+q", "ctrl+p", "enter"):
            assert key in text


@pytest.mark.slow
async def test_server_killed_under_the_tui_is_caught_up_and_a_message_typed_meanwhile_is_sent_once(
        servers: ServerFactory) -> None:
    server = servers.make().start()
    client = server.client()
    sid = client.create_session(title="restarts")["session_id"]
    client.send(sid, "hello", client_request_id="first")
    client.wait(sid)
    app = tui(server, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "Hello from the scripted model." in shown(app) and "| connected" in shown(app),
                    "the session")
        await asyncio.to_thread(server.kill)
        await until(pilot, lambda: UNREACHABLE in shown(app), "the connection state")
        assert "Hello from the scripted model." in shown(app)  # the screen is kept
        await pilot.press(*"hello again", "enter")
        await until(pilot, lambda: "(sending…): hello again" in shown(app), "the message waiting to be sent")
        await asyncio.to_thread(server.start, same_port=True)
        await until(pilot, lambda: "| connected" in shown(app), "connected again", within=60)
        screen = app.screen
        assert isinstance(screen, SessionScreen)

        def answered() -> bool:
            return sum(1 for i in screen.state.items.values() if i["kind"] == "assistant") == 2

        await until(pilot, answered, "the answer to the message typed while down", within=60)
    items = client.session(sid, after=0, limit=500)["transcript"]["items"]
    assert [i["content"] for i in items if i["kind"] == "user"] == ["hello", "hello again"]


@pytest.mark.slow
async def test_continue_after_a_restart_opens_the_last_active_session_with_its_transcript(
        servers: ServerFactory) -> None:
    server = servers.make().start()
    client = server.client()
    sid = client.create_session(title="last active")["session_id"]
    client.create_session(title="newer, idle")
    client.send(sid, "hello", client_request_id="first")  # activity: now the most recent
    client.wait(sid)
    server.kill()
    server.start(same_port=True)
    app = tui(server, continue_last=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen), "a session")
        screen = app.screen
        assert isinstance(screen, SessionScreen) and screen.session_id == sid
        await until(pilot, lambda: "> you: hello" in shown(app) and "Hello from the scripted model." in shown(app),
                    "its transcript")
