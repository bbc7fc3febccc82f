"""Snapshots of every screen of the terminal UI at 80x24 (issue 31's acceptance: "plus snapshot tests"),
against one real ``jupyter server`` with the scripted model: the picker, a session whose transcript holds
a tool call and its result, the approval modal over its session, the Goal panel, the attention list,
help, the permissions screen and the model picker. Each screen is drawn as the terminal shows it
(tests/tuikit.py ``screen_text``: the render of ``App.export_screenshot`` as plain text), times, ids,
ports, durations and temporary paths masked, and compared with ``tests/snapshots/tui/<name>.txt``
(``JG_UPDATE_SNAPSHOTS=1`` rewrites them). Fixed titles, fixed scripted answers and no unmasked clock
make them the same on every run and machine. pytest-textual-snapshot is not used: it needs syrupy 4,
which needs pytest < 9, and it compares SVGs without a way to mask what differs between runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual")

from textual.widgets import Static  # noqa: E402

from jupyter_goals.clients.rest import GoalsClient  # noqa: E402
from jupyter_goals.clients.tui.approval import ApprovalScreen  # noqa: E402
from jupyter_goals.clients.tui.keys import HelpScreen  # noqa: E402
from jupyter_goals.clients.tui.panels import AttentionScreen, GoalScreen  # noqa: E402
from jupyter_goals.clients.tui.permissions import ModelScreen, PermissionsScreen  # noqa: E402
from jupyter_goals.clients.tui.picker import PickerScreen  # noqa: E402
from jupyter_goals.clients.tui.session import SessionScreen  # noqa: E402
from jupyter_goals.testing import ServerFactory, ServerProcess, wait_for  # noqa: E402
from tests.tuikit import SIZE, Snapshots, shown, tui, until  # noqa: E402

OBJECTIVE = "write the report"
RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "goal_objective_contains": "report", "last_tool_result_contains": "todo version"},
     "respond": {"text": "Writing it.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo done > report.md"}}]}},
    {"when": {"purpose": "work", "goal_objective_contains": "report"},
     "respond": {"text": "Planning.", "tool_calls": [{"name": "todo_write", "arguments": {"items": [
         {"text": "write report.md", "status": "in_progress", "required": True},
         {"text": "read it again", "status": "pending", "required": False}]}}]}},
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "Appended one line.", "usage": {"input_tokens": 12, "output_tokens": 4}}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo line >> out.txt"}}],
                 "usage": {"input_tokens": 10, "output_tokens": 6}}},
    {"when": {"last_user_contains": "hello"},
     "respond": {"text": "Hello from the scripted model.", "usage": {"input_tokens": 3, "output_tokens": 2}}},
]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path, RULES)
    try:
        yield factory
    finally:
        factory.close()


def seed(client: GoalsClient) -> dict[str, str]:
    """Four sessions, each done with before the next starts (the picker's order is their activity)."""
    ids = {"idle": client.create_session(title="notes, nothing sent yet")["session_id"]}
    ids["tools"] = client.create_session(title="a tool call", permissions={"mode": "bypass"})["session_id"]
    client.send(ids["tools"], "hello", client_request_id="h")
    client.wait(ids["tools"])
    client.send(ids["tools"], "append a line", client_request_id="a")
    client.wait(ids["tools"])
    ids["asks"] = client.create_session(title="asks first", permissions={
        "mode": "ask", "allow": [{"tool": "write_file", "path": "notes/*.md"}, "grep"]})["session_id"]
    client.send(ids["asks"], "append a line", client_request_id="a")
    wait_for(lambda: len(client.approvals()) == 1, what="the first approval")
    ids["goal"] = client.create_session(title="a goal")["session_id"]
    client.create_goal(ids["goal"], OBJECTIVE, requirements=[
        {"id": "r1", "text": "report.md exists", "kind": "file_exists", "path": "report.md"}])
    wait_for(lambda: len(client.approvals()) == 2, what="the Goal's approval")
    return ids


async def test_every_screen_matches_its_snapshot_at_80x24(servers: ServerFactory) -> None:
    server: ServerProcess = servers.make().start()
    ids = seed(server.client())
    snaps = Snapshots()
    app = tui(server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, PickerScreen) and len(app.screen.sessions) == 4
                    and "| connected" in shown(app), "the picker")
        await snaps.check(pilot, "picker")
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        await snaps.check(pilot, "help")
        await pilot.press("escape", "f9")
        await until(pilot, lambda: isinstance(app.screen, AttentionScreen) and shown(app).count("approval: shell") == 2,
                    "the attention list")
        await snaps.check(pilot, "attention")

    app = tui(server, resume=ids["tools"])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "Appended one line." in shown(app) and "| connected" in shown(app)
                    and "(see result below)" in shown(app), "the transcript")
        await snaps.check(pilot, "session")
        await pilot.press("f10")
        await until(pilot, lambda: isinstance(app.screen, PermissionsScreen) and "Mode: bypass" in shown(app),
                    "the permissions")
        await snaps.check(pilot, "permissions_bypass")

    app = tui(server, resume=ids["asks"])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval")
        await until(pilot, lambda: "waiting" in screen_below(app), "the session under it")
        await snaps.check(pilot, "approval")
        await pilot.press("escape", "f10")
        await until(pilot, lambda: isinstance(app.screen, PermissionsScreen) and "notes/*.md" in shown(app),
                    "the permissions with two rules")
        await snaps.check(pilot, "permissions_rules")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ModelScreen) and "in use" in shown(app), "the models")
        await snaps.check(pilot, "models")

    app = tui(server, resume=ids["goal"])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the Goal's approval")
        await pilot.press("escape", "f8")
        await until(pilot, lambda: isinstance(app.screen, GoalScreen) and "write report.md" in shown(app)
                    and "(none)" in shown(app), "the Goal panel")
        await snaps.check(pilot, "goal")
    snaps.verify()


def screen_below(app: Any) -> str:
    """The words of the session screen under a modal."""
    session = app.session_screen()
    return str(session.query_one("#status", Static).content) if isinstance(session, SessionScreen) else ""
