"""Subtasks and Jobs across kill -9 (issue 6): real ``jupyter server`` processes, real SIGKILLs.

Only the model is scripted. "Once" is counted on disk: lines in ``out.txt`` for the child's side
effect, delivered ``subtask_result`` items in the parent's transcript, rows in the control store. Every
test runs on both stores (``backend``: SQLite, and the control store and ledger in private PostgreSQL
schemas).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import (
    attempt_count,
    check_ownership,
    db_rows,
    fired,
    full_passes,
    lines,
    new_session,
    sample_until,
    stored_server_env,
    wait_for,
    wait_spawned,
)
from tests.storekit import Backend

pytestmark = pytest.mark.slow

QUOTA = 8


def call(name: str, text: str = "", **arguments: Any) -> dict[str, Any]:
    return {"text": text, "tool_calls": [{"name": name, "arguments": arguments}]}


RULES: list[dict[str, Any]] = [
    # parent: delegate, wait (an idle turn would answer IDLE), then use the delivered result
    {"when": {"last_user_contains": "child says 42"}, "respond": {"text": "Parent got 42."}},
    {"when": {"last_user_contains": "delegate", "last_tool_result_contains": "started subtask"},
     "respond": {"text": "IDLE TURN WHILE WAITING"}},
    {"when": {"last_user_contains": "delegate slowly"}, "respond": call("spawn_subtask", "Delegating.", task="append slowly")},
    {"when": {"last_user_contains": "delegate"}, "respond": call("spawn_subtask", "Delegating.", task="append once")},
    # child: append one line, then answer
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "child says 42"}},
    {"when": {"last_user_contains": "append slowly"}, "respond": call("shell", command="sleep 2; echo child >> out.txt")},
    {"when": {"last_user_contains": "append once"}, "respond": call("shell", command="echo child >> out.txt")},
    # storm: chats, Jobs and Goals; slow enough that creating all 50 sessions (seconds on a busy machine)
    # finishes little of their work before the kill
    {"when": {"last_user_contains": "think"}, "respond": {"text": "Thought about it.", "delay_s": 3.0}},
    {"when": {"last_user_contains": "report"}, "respond": {"text": "job result: all fine", "delay_s": 2.0}},
    {"when": {"last_user_contains": "Make flag.txt", "last_tool_result_contains": "0 open"}, "respond": {"text": "Plan done."}},
    {"when": {"last_user_contains": "Make flag.txt", "last_tool_result_contains": "wrote"},
     "respond": call("todo_write", items=[{"text": "make flag.txt", "status": "completed"}])},
    {"when": {"last_user_contains": "Make flag.txt"}, "respond": {**call("write_file", path="flag.txt", content="up"),
                                                                  "delay_s": 1.5}},
]


@pytest.fixture
def env(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    with stored_server_env(tmp_path, RULES, backend) as e:
        yield e


def transcript_kinds(snap: dict[str, Any]) -> list[str]:
    return [i["kind"] for i in snap["transcript"]["items"]]


def assert_delivered_once_and_done(server: Any, sid: str, out: Path) -> dict[str, Any]:
    snap = server.client().wait(sid, timeout=60)
    items = snap["transcript"]["items"]
    delivered = [i for i in items if i["kind"] == "subtask_result"]
    assert len(delivered) == 1 and "child says 42" in delivered[0]["content"]
    assert [i["content"] for i in items if i["kind"] == "assistant"] == ["Delegating.", "Parent got 42."]
    assert transcript_kinds(snap).count("user") == 1
    assert lines(out) == 1  # the child's write ran once
    return snap


def test_parent_receives_the_result_of_a_child_that_finished_while_the_server_was_down_once(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    parent = server.client().send(sid, "please delegate slowly", client_request_id="r1")["work_id"]
    wait_spawned(env["state"])  # the child's shell runs (sleep 2; append)
    server.kill()  # kill -9 of the server and its workers; the detached shell lives on and finishes
    wait_for(lambda: any((env["state"] / "effects").glob("*/exit")), timeout=10, what="the child's command to finish")
    [child] = db_rows(env["state"], "SELECT * FROM work_items WHERE parent_work_id = ?", (parent,))
    assert child["phase"] not in ("done", "cancelled")

    restarted = env["make"]().start()  # no client action after the restart
    assert_delivered_once_and_done(restarted, sid, env["out"])
    [wait] = db_rows(env["state"], "SELECT * FROM waits WHERE work_id = ?", (parent,))
    assert (wait["state"], wait["outcome"], wait["handle"]) == ("consumed", "completed", child["work_id"])
    child_snap = restarted.client().session(child["session_id"])
    assert child_snap["work"]["phase"] == "done" and "interruption" in transcript_kinds(child_snap)
    attempts = attempt_count(env["state"])
    full_passes(restarted)  # further passes change nothing
    assert attempt_count(env["state"]) == attempts
    assert [i["kind"] for i in restarted.client().session(sid)["transcript"]["items"]].count("subtask_result") == 1


@pytest.mark.parametrize("point", ["child.before_delivery", "child.after_delivery"])
def test_crash_around_delivery_delivers_the_child_result_once(env: dict[str, Any], point: str) -> None:
    # the whole server dies at the point (faults.py): a live server would recover the worker's work
    # at once and could deliver the result before a kill from here
    server = env["make"]().start(crash_at=point, env={"JUPYTER_GOALS_CRASH_SCOPE": "group"})
    sid = new_session(server, env["root"])
    parent = server.client().send(sid, "please delegate", client_request_id="r1")["work_id"]
    assert server.wait_exit(timeout=60) == -9
    assert fired(env["state"], point)
    delivered_before = db_rows(env["state"], "SELECT COUNT(*) AS n FROM transcript WHERE kind = 'subtask_result'")[0]["n"]
    assert delivered_before == (1 if point == "child.after_delivery" else 0)

    restarted = env["make"]().start()
    assert_delivered_once_and_done(restarted, sid, env["out"])
    assert db_rows(env["state"], "SELECT state FROM waits WHERE work_id = ?", (parent,)) == [{"state": "consumed"}]


def test_fifty_sessions_of_chats_goals_and_jobs_all_finish_after_a_kill_with_one_owner_per_item(
        env: dict[str, Any]) -> None:
    """15 chats, 5 chats that delegate a subtask, 15 Goals and 15 Jobs (50 sessions, plus 5 subtask
    sessions) running when the server is killed: after the restart everything finishes, with one owner
    per work item and never more than the quota running, sampled from control.db; a Pause sent during
    the recovery wins (nothing of that session is admitted until Resume)."""
    state, root = env["state"], env["root"]
    extra = [f"--GoalsApp.max_concurrent_turns={QUOTA}"]
    server = env["make"](extra).start()
    cl = server.client()
    chats = [new_session(server, root) for _ in range(20)]
    for i, sid in enumerate(chats):
        cl.send(sid, "please delegate" if i < 5 else "think hard", client_request_id=f"c{i}")
    goal_sessions = [new_session(server, root) for _ in range(15)]
    goals = [cl.create_goal(sid, "Make flag.txt", [{"text": "flag.txt exists", "kind": "file_exists", "path": "flag.txt"}])
             for sid in goal_sessions]
    # each Job is attributed to one Goal (another session's: provenance stays with the calling chat)
    jobs = [cl.create_job(chats[5 + i], "report status", goal_id=goals[i]["goal_id"], client_request_id=f"j{i}")
            for i in range(15)]
    sample_until(state, QUOTA, lambda: len(db_rows(state, "SELECT 1 FROM attempts WHERE state = 'running'")) >= QUOTA // 2,
                 30, "work running before the kill")
    server.kill()
    unfinished = db_rows(state, "SELECT COUNT(*) AS n FROM work_items WHERE phase NOT IN ('done', 'cancelled')")[0]["n"]
    assert unfinished >= 30  # most of the 55 items were still running or queued at the kill (precondition)

    started, restart = time.monotonic(), time.time()
    restarted = env["make"](extra).start()
    cl = restarted.client()
    paused, pause_at = chats[19], time.time()
    cl.action(paused, "pause")  # sent during recovery: it wins over the old continuation

    def all_done() -> bool:
        rows = db_rows(state, "SELECT session_id, phase FROM work_items")
        return len(rows) == 55 and all(r["phase"] == ("paused" if r["session_id"] == paused else "done") for r in rows)

    samples = sample_until(state, QUOTA, all_done, 90, "all 55 work items done (one paused)")
    assert samples > 10 and time.monotonic() - started < 60
    assert db_rows(state, "SELECT COUNT(*) AS n FROM attempts WHERE session_id = ? AND admitted_at > ?",
                   (paused, pause_at)) == [{"n": 0}]
    cl.action(paused, "resume")
    cl.wait(paused, timeout=30)
    check_ownership(state, QUOTA)
    assert all(cl.goal(g["goal_id"])["state"] == "achieved" for g in goals)
    for j, goal in zip(jobs, goals, strict=True):
        job = cl.job(j["job_id"])
        assert job["work"]["phase"] == "done" and job["result"]["text"] == "job result: all fine"
        # the Goal identity saved at admission was restored after the restart: every request carries it
        assert (job["goal_id"], job["goal_revision"]) == (goal["goal_id"], 1)
        attributed = db_rows(state, "SELECT DISTINCT goal_id, goal_revision FROM requests WHERE work_id = ?", (j["work_id"],))
        assert attributed == [{"goal_id": goal["goal_id"], "goal_revision": 1}]
    for sid in chats[:5]:
        assert transcript_kinds(cl.session(sid)).count("subtask_result") == 1
    assert lines(env["out"]) == 5  # each subtask's write ran once
    # never more than the quota running at once, from the attempts' own start / end records
    attempts = db_rows(state, "SELECT started_at, ended_at FROM attempts WHERE started_at IS NOT NULL AND admitted_at > ?",
                       (restart,))
    points = sorted([(a["started_at"], 1) for a in attempts] + [(a["ended_at"] or time.time(), -1) for a in attempts])
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak <= QUOTA
