"""Stop means stop (issue 15): Stop, End, stop_all, a Goal's end and a parent's stop cancel a running
command at once — its whole process group is signalled, the call is committed ``cancelled`` with its
real exit status and output — and the cancellation survives crashes between the stop's commit and the
kill. ``cancel_tool`` cancels one call and the turn goes on. Real servers, real processes, kill -9."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.effect_files import group_members
from tests.servers import ServerProcess, db_rows, running_shell, server_env, wait_for

pytestmark = pytest.mark.slow

SLOW = "sleep 60; echo done >> out.txt"
RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "last_tool_result_contains": "cancelled this call"},
     "respond": {"text": "You cancelled the command, so I will not run it again."}},
    {"when": {"purpose": "work", "last_user_contains": "delegate", "last_tool_result_contains": "started subtask"},
     "respond": {"text": "Waiting for the subtask."}},
    {"when": {"purpose": "work", "last_user_contains": "delegate"},
     "respond": {"tool_calls": [{"name": "spawn_subtask", "arguments": {"task": "run the slow sleep"}}]}},
    {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"purpose": "work", "any_text_contains": "slow"},
     "respond": {"text": "Running it.", "tool_calls": [{"name": "shell", "arguments": {"command": SLOW}}]}},
]


def gone_within(effect_dir: Path, seconds: float) -> float:
    """Seconds until the process group has no live member; fails past ``seconds``."""
    start = time.monotonic()
    wait_for(lambda: not group_members(effect_dir), timeout=seconds, what=f"process group gone within {seconds}s")
    return time.monotonic() - start


def effect(state: Path, effect_dir: Path) -> dict[str, Any]:
    return db_rows(state, "SELECT * FROM effects WHERE effect_id = ?", (effect_dir.name,))[0]


def assert_nothing_reruns_after_restart(server: ServerProcess, env: dict[str, Any], sid: str) -> None:
    """A restart finds the work stopped: no new attempt, no new call, no line in out.txt. ``start()``
    returns once the server serves with its workers up, which is after its first recovery pass decided
    every unfinished item (the server answers 503 ``starting`` until then)."""
    attempts = len(db_rows(env["state"], "SELECT attempt_id FROM attempts"))
    calls = len(db_rows(env["state"], "SELECT effect_id FROM effects"))
    server.stop()
    server.start()
    cl = server.client()
    snap = cl.session(sid)
    assert snap["work"]["phase"] == "cancelled", snap["work"]
    assert len(db_rows(env["state"], "SELECT attempt_id FROM attempts")) == attempts
    assert len(db_rows(env["state"], "SELECT effect_id FROM effects")) == calls
    assert not (env["root"] / "out.txt").exists()


@pytest.mark.parametrize("how", ["stop", "stop_all", "goal_end", "parent_stop"])
def test_stop_kills_the_running_command_within_two_seconds_and_a_restart_changes_nothing(
    tmp_path: Path, how: str
) -> None:
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title=how, cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        goal_id = ""
        if how == "goal_end":
            goal = cl.create_goal(sid, "run the slow command", requirements=[{"text": "it ran", "kind": "semantic"}])
            goal_id = goal["goal_id"]
        elif how == "parent_stop":
            cl.send(sid, "delegate it", client_request_id="p1")
        else:
            cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        stopped_at = time.monotonic()
        if how == "stop" or how == "parent_stop":
            cl.action(sid, "stop")
        elif how == "stop_all":
            cl.stop_all()
        else:
            cl.goal_action(goal_id, "end", cl.goal(goal_id)["revision"])
        wait_for(lambda: not group_members(effect_dir), timeout=2.0 - (time.monotonic() - stopped_at) + 0.001,
                 what="the process group gone within 2 s of the stop")
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "cancelled", timeout=10, what="cancelled effect")
        eff = effect(env["state"], effect_dir)
        assert "exit status:" in eff["result"] and "the person stopped the work" in eff["result"]
        if how == "parent_stop":  # the child's session holds the call; the parent's stop reached it
            child = db_rows(env["state"], "SELECT session_id FROM work_items WHERE work_id = ?", (eff["work_id"],))[0]
            assert child["session_id"] != sid
            wait_for(lambda: cl.session(child["session_id"])["work"]["phase"] == "cancelled", timeout=10,
                     what="the subtask cancelled")
        snap = cl.wait(sid, phases=("cancelled",), timeout=10)
        if how != "parent_stop":
            items = snap["transcript"]["items"]
            result = next(i for i in items if i["kind"] == "tool_result")
            assert result["state"] == "cancelled"
            assert any(i["kind"] == "interruption" and "Stopped by the person" in i["content"] for i in items)
        assert not (env["root"] / "out.txt").exists()
        assert_nothing_reruns_after_restart(server, env, sid)


@pytest.mark.parametrize("point,whole_server", [
    ("control.after_stop_commit", True),   # the server dies right after committing the stop
    ("tool.before_cancel_kill", False),    # the worker dies just before signalling; the server lives
    ("tool.before_cancel_kill", True),     # ... and then the whole server is killed too
])
def test_a_stop_survives_a_crash_before_the_kill(tmp_path: Path, point: str, whole_server: bool) -> None:
    """After the restart (or the worker's), the Coordinator finds the process by its identity, kills
    it and commits it ``cancelled``; the line never appears and nothing re-runs. Where the whole server
    dies, it dies at the point itself (``JUPYTER_GOALS_CRASH_SCOPE=group``): killing it from here once the
    point fired would race the survivors (the server recovers a dead worker's work at once, a worker sees
    a committed stop within 50 ms), and the command might be gone before the restart had to find it."""
    with server_env(tmp_path, RULES) as env:
        scope = {"JUPYTER_GOALS_CRASH_SCOPE": "group"} if whole_server else {}
        server = env["make"]().start(crash_at=point, env=scope)
        cl = server.client()
        sid = str(cl.create_session(title="crash", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        fired = env["state"] / "faults" / f"{point}.fired"
        try:
            cl.action(sid, "stop")
        except Exception:  # noqa: BLE001 - the server may die before it answers (control.after_stop_commit)
            assert point == "control.after_stop_commit"
        wait_for(fired.exists, timeout=10, what=f"{point} fired")
        if whole_server:
            assert server.wait_exit(timeout=30) == -9  # the server and its workers died at the point
            assert group_members(effect_dir), "the detached command outlives the server until it is cancelled"
            server.start()
            cl = server.client()
        gone_within(effect_dir, 30)
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "cancelled", timeout=30, what="cancelled effect")
        assert cl.wait(sid, phases=("cancelled",), timeout=30)["work"]["reason_code"] == "user_stopped"
        assert not (env["root"] / "out.txt").exists()
        assert_nothing_reruns_after_restart(server, env, sid)


def test_cancel_tool_ends_one_call_and_the_turn_continues_with_that_result(tmp_path: Path) -> None:
    """``cancel_tool`` on a running call: killed, committed ``cancelled``; the work is not stopped, and the
    next model request carries the cancelled result (the scripted rule on it answers)."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="one", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        answer = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool", "effect_id": effect_dir.name})
        assert answer.status_code == 200, answer.text
        gone_within(effect_dir, 2.0)
        snap = cl.wait(sid, phases=("done",), timeout=30)
        assistant = [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"]
        assert assistant[-1] == "You cancelled the command, so I will not run it again."
        assert effect(env["state"], effect_dir)["state"] == "cancelled"
        assert not (env["root"] / "out.txt").exists()
        # a second cancel, a cancel without effect_id, an unknown call: 409, 400, 404
        again = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool", "effect_id": effect_dir.name})
        assert again.status_code == 409 and again.json()["error"] == "conflict"
        missing = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool"})
        assert missing.status_code == 400
        unknown = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool", "effect_id": "eff_nope"})
        assert unknown.status_code == 404
        # usage kept as it was: each of the two model requests counted once
        assert len(db_rows(env["state"], "SELECT request_id FROM requests")) == 2
