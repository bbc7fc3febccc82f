"""``%load_ext jupyter_goals`` and ``%goal`` / ``%%goal`` in a real IPython shell, against a real server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import CapturedIO, capture_output

from jupyter_goals.notebook import cards
from jupyter_goals.notebook.magics import parse_requirements
from tests.servers import ServerProcess, write_script

slow = pytest.mark.slow  # a real jupyter server process


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("magics")
    root = tmp / "root"
    root.mkdir()
    model = write_script(tmp / "script.json", [], default={"text": "still working", "delay_s": 0.2})
    s = ServerProcess(tmp / "state", root, model=model).start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture
def shell(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("JUPYTER_GOALS_SERVER_URL", server.url)  # what the extension sets for its kernels
    monkeypatch.setenv("JUPYTER_GOALS_TOKEN", server.token)
    ip = InteractiveShell.instance()
    ip.run_line_magic("reload_ext", "jupyter_goals")  # a fresh GoalMagics (no remembered session) per test
    yield ip


def run(ip: InteractiveShell, source: str) -> tuple[CapturedIO, Any]:
    with capture_output() as cap:
        result = ip.run_cell(source)
    return cap, result


def bundles(cap: CapturedIO, mime: str) -> list[dict[str, Any]]:
    return [o.data for o in cap.outputs if mime in o.data]


@slow
def test_goal_cell_magic_creates_a_goal_with_requirements_and_displays_an_id_only_bundle(
        shell: InteractiveShell, server: ServerProcess) -> None:
    cap, result = run(shell, "%%goal --bypass Write report.md and make the check pass\n"
                             "file_exists: report.md\n"
                             "command: python check.py\n"
                             "# a comment\n"
                             "\n"
                             "the report explains the results\n")
    assert result.error_in_exec is None, result.error_in_exec
    [bundle] = bundles(cap, cards.GOAL_MIME)
    ids = bundle[cards.GOAL_MIME]
    assert set(ids) == {"goal_id", "session_id"}  # ids only: the renderer reads the rest itself
    assert "Write report.md" in bundle["text/html"] and "snapshot" in bundle["text/html"]

    client = server.client()
    goal = client.goal(ids["goal_id"])
    assert goal["objective"] == "Write report.md and make the check pass"
    assert [(r["kind"], r.get("path"), r.get("command")) for r in goal["requirements"]] == [
        ("file_exists", "report.md", None), ("command", None, "python check.py"), ("semantic", None, None)]
    assert client.session(ids["session_id"])["session"]["permissions"]["mode"] == "bypass"
    client.goal_action(goal["goal_id"], "end", goal["revision"])


@slow
def test_goal_line_magics_pause_resume_status_end_and_history(shell: InteractiveShell, server: ServerProcess) -> None:
    client = server.client()
    cap, result = run(shell, "%goal --new Keep the notes tidy")
    assert result.error_in_exec is None, result.error_in_exec
    ids = bundles(cap, cards.GOAL_MIME)[0][cards.GOAL_MIME]
    goal_id, session_id = ids["goal_id"], ids["session_id"]

    cap, result = run(shell, "%goal pause")
    assert result.error_in_exec is None, result.error_in_exec
    assert "Goal paused" in cap.stdout
    assert client.goal(goal_id)["state"] == "paused"

    # not allowed now (the backend's actions say so): a clear error, nothing sent
    cap, result = run(shell, "%goal pause")
    assert isinstance(result.error_in_exec, UsageError)
    assert "cannot pause" in str(result.error_in_exec)

    cap, result = run(shell, "%goal resume")
    assert result.error_in_exec is None, result.error_in_exec
    assert client.goal(goal_id)["state"] == "active"

    cap, result = run(shell, "%goal status")
    assert result.error_in_exec is None, result.error_in_exec
    assert [b[cards.GOAL_MIME]["goal_id"] for b in bundles(cap, cards.GOAL_MIME)] == [goal_id]

    # a second Goal while this one runs: the server's 409 is shown, not swallowed
    cap, result = run(shell, "%goal Another objective")
    assert isinstance(result.error_in_exec, UsageError)
    assert "409" in str(result.error_in_exec)

    cap, result = run(shell, "%goal history")
    assert "No ended Goals" in cap.stdout

    cap, result = run(shell, "%goal end")
    assert result.error_in_exec is None, result.error_in_exec
    assert client.goal(goal_id)["state"] == "cancelled"

    cap, result = run(shell, "%goal history")
    assert result.error_in_exec is None, result.error_in_exec
    [record] = bundles(cap, cards.HISTORY_MIME)
    assert record[cards.HISTORY_MIME] == {"record_id": client.history(session_id)[0]["record_id"],
                                          "session_id": session_id}
    assert "Keep the notes tidy" in record["text/html"]

    # the remembered session gets the next Goal
    cap, result = run(shell, "%goal Next objective")
    assert result.error_in_exec is None, result.error_in_exec
    nxt = bundles(cap, cards.GOAL_MIME)[0][cards.GOAL_MIME]
    assert nxt["session_id"] == session_id and nxt["goal_id"] != goal_id
    client.goal_action(nxt["goal_id"], "end", client.goal(nxt["goal_id"])["revision"])


@slow
def test_status_shows_pending_approvals_of_the_goal_session(shell: InteractiveShell, server: ServerProcess,
                                                            tmp_path: Path) -> None:
    client = server.client()
    sid = client.create_session(title="approvals", model=write_script(tmp_path / "s.json", [], default={
        "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}]}))["session_id"]
    cap, result = run(shell, f"%goal --session={sid} Write a.txt")
    assert result.error_in_exec is None, result.error_in_exec
    for _ in range(100):
        if client.approvals("pending"):
            break
        time.sleep(0.1)
    [approval] = [a for a in client.approvals("pending") if a["session_id"] == sid]
    cap, result = run(shell, "%goal status")
    assert result.error_in_exec is None, result.error_in_exec
    [card] = bundles(cap, cards.APPROVAL_MIME)
    assert card[cards.APPROVAL_MIME] == {"approval_id": approval["approval_id"], "session_id": sid}
    run(shell, "%goal end")


def test_requirement_lines() -> None:
    assert parse_requirements("- file_digest: data.csv abc123\n* semantic: tidy: yes\nplain words") == [
        {"text": "data.csv has sha256 abc123…", "kind": "file_digest", "path": "data.csv", "sha256": "abc123"},
        {"text": "tidy: yes", "kind": "semantic"},
        {"text": "plain words", "kind": "semantic"},
    ]
    assert parse_requirements("note: this is text") == [{"text": "note: this is text", "kind": "semantic"}]
    with pytest.raises(UsageError):
        parse_requirements("file_digest: only-a-path")
    with pytest.raises(UsageError):
        parse_requirements("command:")
