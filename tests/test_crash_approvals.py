"""Approvals, live tool processes and unknown effects across kill -9 (issue 3), with real servers.

Side effects are counted as lines in files on disk; only the model is scripted. Every test runs on both
stores (``backend``: SQLite, and the control store and ledger in private PostgreSQL schemas).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.host.effect_files import group_members, kill_shell, shell_alive
from tests.servers import (
    ROOT,
    ServerProcess,
    db_rows,
    fired,
    lines,
    spawned,
    stored_server_env,
    wait_for,
    wait_spawned,
)
from tests.storekit import Backend

pytestmark = pytest.mark.slow

TRUSTED_TOOLS = {"read_secret_writer": {"impl": "tests.sample_tools:read_secret_writer", "capability": "unknown"}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


RULES: list[dict[str, Any]] = [
    {"when": {"last_tool_result_contains": "denied by the user"}, "respond": {"text": "Understood, not done."}},
    {"when": {"last_user_contains": "approve-me", "last_tool_result_contains": "exit status: 0"}, "respond": {"text": "Appended."}},
    {"when": {"last_user_contains": "approve-me"}, "respond": call("shell", command="echo line >> approved.txt")},
    {"when": {"last_user_contains": "deny-me"}, "respond": call("shell", command="echo line >> denied.txt")},
    {"when": {"last_user_contains": "slow-bg", "last_tool_result_contains": "exit status"}, "respond": {"text": "Background done."}},
    {"when": {"last_user_contains": "slow-bg"}, "respond": call("shell", command="sleep 3; echo line >> bg.txt")},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "exit status: 0"}, "respond": {"text": "Finished."}},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "appended a line"}, "respond": {"text": "All done."}},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "wrote "}, "respond": call("read_secret_writer")},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "probe-content"},
     "respond": call("write_file", path="notes.md", content="after the crash")},
    {"when": {"last_user_contains": "longjob", "tool_result_unknown": True}, "respond": call("read_file", path="probe.txt")},
    {"when": {"last_user_contains": "longjob"}, "respond": call("shell", command="sleep 5; echo done >> f.txt")},
]


@pytest.fixture
def env(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    with stored_server_env(tmp_path, RULES, backend, base_env={"PYTHONPATH": str(ROOT)}) as e:
        yield e


def session(server: ServerProcess, root: Path, permissions: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {"title": "t", "cwd": str(root)}
    if permissions is not None:
        body["permissions"] = permissions
    return str(server.client().create_session(**body)["session"]["session_id"])


def effect_dirs(state: Path) -> list[Path]:
    return sorted(p.parent for p in (state / "effects").glob("*/proc.json"))


def test_pending_approval_survives_restart_and_crash_during_recovery_and_runs_once(env: dict[str, Any]) -> None:
    root, state = env["root"], env["state"]
    server = env["make"]().start()
    cl = server.client()
    ask, deny, bg = session(server, root), session(server, root), session(server, root, {"mode": "bypass"})
    cl.send(ask, "approve-me: append a line")
    cl.send(deny, "deny-me: append a line")
    for sid in (ask, deny):
        assert cl.wait(sid, phases=("waiting",), timeout=30)["work"]["reason_code"] == "awaiting_approval"
    pending = {a["tool"] + a["session_id"]: a for a in cl.approvals("pending")}
    assert len(pending) == 2
    cl.send(bg, "slow-bg: run")  # a running attempt, so that the restart has a recovery to crash in
    wait_spawned(state)
    server.kill()

    server = env["make"]().start(crash_at="recovery.after_claim", wait=False)
    assert server.wait_exit(timeout=30) == 86  # another crash, during recovery
    assert fired(state, "recovery.after_claim")
    server = env["make"]().start()
    cl = server.client()
    cl.wait(bg, timeout=60)
    assert lines(root / "bg.txt") == 1
    assert {a["approval_id"] for a in cl.approvals("pending")} == {a["approval_id"] for a in pending.values()}
    assert lines(root / "approved.txt") == 0  # never approved automatically
    by_session = {a["session_id"]: a for a in cl.approvals("pending")}
    assert cl.session(ask)["work"]["reason_code"] == "awaiting_approval"

    cl.approve(by_session[ask]["approval_id"])
    with pytest.raises(GoalsError) as conflict:
        cl.approve(by_session[ask]["approval_id"])
    assert conflict.value.status == 409
    cl.deny(by_session[deny]["approval_id"])
    assert cl.wait(ask, timeout=30)["work"]["phase"] == "done"
    snap = cl.wait(deny, timeout=30)
    assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "Understood, not done."
    assert lines(root / "approved.txt") == 1
    assert lines(root / "denied.txt") == 0
    consumed = db_rows(state, "SELECT state, consumed_by_attempt FROM approvals WHERE approval_id = ?",
                       (by_session[ask]["approval_id"],))
    assert consumed[0]["state"] == "consumed" and consumed[0]["consumed_by_attempt"]


def test_live_shell_is_reconnected_after_worker_and_server_kill_and_its_real_result_committed(env: dict[str, Any]) -> None:
    root, state = env["root"], env["state"]
    # the whole server dies at the point (faults.py); a live server would reconnect to the command
    # before the restart that is under test
    server = env["make"](env={"JUPYTER_GOALS_CRASH_SCOPE": "group"}).start(crash_at="tool.after_dispatch")
    sid = session(server, root, {"mode": "bypass"})
    server.client().send(sid, "longjob: run it")
    assert server.wait_exit(timeout=60) == -9  # the worker died there, and the server with it
    assert fired(state, "tool.after_dispatch")
    [effect_dir] = effect_dirs(state)
    proc_before = json.loads((effect_dir / "proc.json").read_text())
    assert shell_alive(effect_dir)  # still running when the server comes back

    server = env["make"]().start()
    snap = server.client().wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done"
    assert lines(root / "f.txt") == 1
    assert spawned(state) == 1  # never started again
    assert json.loads((effect_dir / "proc.json").read_text()) == proc_before  # same pid and start time
    results = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result" and i["tool"] == "shell"]
    assert len(results) == 1
    assert results[0]["state"] == "committed" and "exit status: 0" in results[0]["content"]
    [effect] = db_rows(state, "SELECT state, result FROM effects WHERE tool = 'shell'")
    assert effect["state"] == "committed" and "exit status: 0" in effect["result"]
    assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "Finished."


def test_killed_tool_process_is_unknown_and_restricts_the_next_turn(env: dict[str, Any]) -> None:
    root, state = env["root"], env["state"]
    (root / "probe.txt").write_text("probe-content")
    extra = [f"--GoalsApp.trusted_tools={json.dumps(TRUSTED_TOOLS)}"]
    server = env["make"](extra, env={"JUPYTER_GOALS_CRASH_SCOPE": "group"}).start(crash_at="tool.after_dispatch")
    # neither bypass nor allow rules may waive the approval that follows unknown effects
    sid = session(server, root, {"mode": "bypass", "allow": ["write_file", "read_secret_writer"]})
    server.client().send(sid, "longjob: run it")
    assert server.wait_exit(timeout=60) == -9  # the whole server died at the point (faults.py)
    assert fired(state, "tool.after_dispatch")
    [effect_dir] = effect_dirs(state)
    assert kill_shell(effect_dir)  # the tool's process group dies too
    wait_for(lambda: not group_members(effect_dir), 10, "the command's process group to end")

    server = env["make"](extra).start()
    cl = server.client()
    assert cl.wait(sid, phases=("waiting",), timeout=60)["work"]["reason_code"] == "awaiting_approval"
    [shell_effect] = db_rows(state, "SELECT call_id, state FROM effects WHERE tool = 'shell'")
    assert shell_effect["state"] == "unknown"
    assert [r["state"] for r in db_rows(state, "SELECT state FROM effects WHERE tool = 'read_file'")] == ["committed"]
    [write] = cl.approvals("pending")
    assert write["tool"] == "write_file"
    assert [u["call_id"] for u in write["unknown_effects"]] == [shell_effect["call_id"]]
    assert not (root / "notes.md").exists()
    cl.approve(write["approval_id"])

    cl.wait(sid, phases=("waiting",), timeout=30)
    [custom] = cl.approvals("pending")
    assert (custom["tool"], custom["capability"]) == ("read_secret_writer", "unknown")
    assert (root / "notes.md").read_text() == "after the crash"
    assert lines(root / "secret.txt") == 0
    cl.deny(custom["approval_id"])
    assert cl.wait(sid, timeout=30)["work"]["phase"] == "done"
    assert lines(root / "secret.txt") == 0
    assert lines(root / "f.txt") == 0
