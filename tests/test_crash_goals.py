"""Process-level Goal tests: real ``jupyter server`` processes, kill -9, restart (issue 4).

Only the model is scripted. Nothing on the client side acts after the restart: the Goal goes on by
itself. "Once" is proven from control store rows (acceptance results, history records) and files on
disk. Every test runs on both stores (``backend``: SQLite, and private PostgreSQL schemas).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import attempt_count, db_rows, full_passes, stored_server_env, wait_for
from tests.storekit import Backend

pytestmark = pytest.mark.slow

VERDICT_JSON = '{"verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": "trust me"}]}'


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


RULES: list[dict[str, Any]] = [
    # "Produce result.txt": the first reply is JSON shaped like a verdict (an ordinary reply), then work
    {"when": {"last_user_contains": "Continue working", "goal_objective_contains": "Produce",
              "last_tool_result_contains": "candidate submitted"}, "respond": {"text": "Done."}},
    {"when": {"last_user_contains": "Continue working", "goal_objective_contains": "Produce",
              "last_tool_result_contains": "exit status: 0"}, "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Continue working", "goal_objective_contains": "Produce"},
     "respond": call("shell", command="sleep 2; echo ok >> result.txt")},
    {"when": {"last_user_contains": "Produce result.txt"}, "respond": {"text": VERDICT_JSON}},
    # "Make flag.txt": a plan whose required items all finish → acceptance without a candidate call
    {"when": {"last_user_contains": "Make flag.txt", "last_tool_result_contains": "0 open"},
     "respond": {"text": "Plan done."}},
    {"when": {"last_user_contains": "Make flag.txt", "last_tool_result_contains": "wrote"},
     "respond": call("todo_write", items=[{"text": "make flag.txt", "status": "completed"}])},
    {"when": {"last_user_contains": "Make flag.txt"}, "respond": call("write_file", path="flag.txt", content="up")},
]


@pytest.fixture
def env(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    with stored_server_env(tmp_path, RULES, backend) as e:
        yield e


def test_goal_survives_kill_9_mid_work_and_is_achieved_after_restart_without_client_action(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    client = server.client()
    sid = client.create_session(title="goal", permissions={"mode": "bypass"})["session_id"]
    goal = client.create_goal(sid, "Produce result.txt", [{"text": "result.txt exists", "kind": "file_exists",
                                                           "path": "result.txt"}])
    effects = env["state"] / "effects"
    wait_for(lambda: effects.exists() and any(effects.glob("*/proc.json")), what="the shell to be spawned")
    server.kill()  # kill -9 of the server and its workers mid-work; the detached shell lives on

    restarted = env["make"]().start()
    done = restarted.client().wait_goal(goal["goal_id"], timeout=60)
    assert done["state"] == "achieved" and done["acceptance"]["outcome"] == "met"
    assert (env["root"] / "result.txt").read_text().splitlines() == ["ok"]  # the write ran once
    snap = restarted.client().session(sid)
    replies = [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"]
    assert VERDICT_JSON in replies  # the verdict-shaped reply stayed an ordinary reply and ended nothing
    results = db_rows(env["state"], "SELECT * FROM acceptance_results WHERE goal_id = ?", (goal["goal_id"],))
    assert len(results) == 1 and results[0]["outcome"] == "met"
    assert len(restarted.client().history(sid)) == 1


@pytest.mark.parametrize("point", ["goal.todo_complete_before_acceptance", "goal.after_completion_commit"])
def test_crash_around_acceptance_verifies_once_and_achieves_once(env: dict[str, Any], point: str) -> None:
    # the whole server dies at the point (faults.py): a live server would recover the worker's work
    # at once, and a kill from here would land at a later point than the one under test
    server = env["make"]().start(crash_at=point, env={"JUPYTER_GOALS_CRASH_SCOPE": "group"})
    client = server.client()
    sid = client.create_session(title="goal", permissions={"mode": "bypass"})["session_id"]
    goal = client.create_goal(sid, "Make flag.txt", [{"text": "flag.txt exists", "kind": "file_exists",
                                                      "path": "flag.txt"}])
    assert server.wait_exit(timeout=60) == -9
    assert (env["state"] / "faults" / f"{point}.fired").exists()
    restarted = env["make"]().start()
    done = restarted.client().wait_goal(goal["goal_id"], timeout=60)
    assert done["state"] == "achieved"
    wait_for(lambda: restarted.client().session(sid)["work"]["phase"] == "done", what="the Goal's work to finish")
    attempts = attempt_count(env["state"])
    full_passes(restarted)  # further passes change nothing
    assert attempt_count(env["state"]) == attempts
    results = db_rows(env["state"], "SELECT * FROM acceptance_results WHERE goal_id = ?", (goal["goal_id"],))
    assert len(results) == 1  # verified once
    achieved = db_rows(env["state"], "SELECT * FROM events WHERE kind = 'goal.updated' AND payload LIKE '%\"achieved\"%'")
    assert len(achieved) == 1  # achieved once
    records = restarted.client().history(sid)
    assert len(records) == 1 and records[0]["state"] == "achieved"
    events = restarted.client().events(limit=5000)["events"]
    assert sum(1 for e in events if e["kind"] == "goal.history") == 1  # the record's event was delivered
