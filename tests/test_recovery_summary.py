"""``GET /api/goals/recovery`` (issue 12, DESIGN §10): after a kill -9 and a restart, the summary of
the start-up recovery pass says what continued, what waits and why, what stayed paused or stopped by
the person, from the recorded decisions (``recovery_decisions``), with the actions allowed now."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.models import RecoveryOutcome, recovery_outcome
from tests.servers import ServerProcess, db_rows, server_env, shell_running, wait_for

RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "slow", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"last_user_contains": "slow-a"},
     "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 4; echo a >> a.txt"}}]}},
    {"when": {"last_user_contains": "slow-c"},
     # ignores SIGTERM: a Stop's kill waits out its grace period, and the server is killed meanwhile
     "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "trap '' TERM; sleep 20; echo c >> c.txt"}}]}},
    {"when": {"last_user_contains": "write", "last_tool_result_contains": ""}, "respond": {"text": "written"}},
    {"when": {"last_user_contains": "write"},
     "respond": {"tool_calls": [{"name": "write_file", "arguments": {"path": "w.txt", "content": "w\n"}}]}},
]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with server_env(tmp_path, RULES) as e:
        yield e


@pytest.mark.parametrize(("desired", "phase", "outcome"), [
    ("cancelled", "working", "stopped"), ("cancelled", "cancelled", "stopped"), ("paused", "paused", "paused"),
    ("paused", "working", "paused"), ("run", "failed", "failed"), ("run", "waiting", "waiting"),
    ("run", "queued", "continued"), ("run", "working", "continued"), ("done", "done", "continued"),
])
def test_recovery_outcome_puts_the_persons_stop_and_pause_first(desired: str, phase: str, outcome: str) -> None:
    assert recovery_outcome(desired, phase) == RecoveryOutcome(outcome)


def get(server: ServerProcess, path: str) -> Any:
    r = httpx.get(f"{server.url}api/goals/{path}", headers={"Authorization": f"token {server.token}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def dispatched(state: Path, sid: str) -> bool:
    return shell_running(state, sid) is not None


@pytest.mark.slow
def test_recovery_summary_after_kill_9_shows_continued_waiting_paused_and_stopped_work(env: dict[str, Any]) -> None:
    server: ServerProcess = env["make"]().start()
    client = server.client()
    assert get(server, "recovery")["recovered_at"] is None  # a fresh state dir: nothing was recovered

    def session(title: str, mode: str) -> str:
        return str(client.create_session(title=title, cwd=str(env["root"]), permissions={"mode": mode})["session_id"])

    def pending(sid: str) -> bool:
        return any(a["session_id"] == sid for a in client.approvals("pending"))

    finished = session("finished before", "bypass")
    client.send(finished, "write it", client_request_id="e1")
    client.wait(finished, timeout=30)
    mid = session("mid-command", "bypass")
    client.send(mid, "slow-a", client_request_id="a1")
    paused = session("paused by me", "ask")
    client.send(paused, "write it", client_request_id="b1")
    stopped = session("stopped by me", "bypass")
    client.send(stopped, "slow-c", client_request_id="c1")
    asking = session("asks approval", "ask")
    client.send(asking, "write it", client_request_id="d1")
    wait_for(lambda: dispatched(env["state"], mid) and dispatched(env["state"], stopped) and pending(paused)
             and pending(asking), timeout=30, what="two commands running and two approvals pending")
    client.action(paused, "pause")
    client.action(stopped, "stop")
    work = client.session(stopped)["work"]
    assert (work["desired_state"], work["reason_code"]) == ("cancelled", "user_stopped")
    # the stop is committed; its command (deaf to SIGTERM) still runs in a live attempt at the kill
    assert db_rows(env["state"], "SELECT state FROM attempts WHERE session_id = ?", (stopped,)) == [{"state": "running"}]

    server.kill()
    server = env["make"]().start()
    summary = get(server, "recovery")
    health = get(server, "health")
    assert summary["recovered_at"] is not None and summary["recovered_at"] >= summary["server_started_at"]
    assert (summary["host_name"], summary["boot_id"]) == (health["host_name"], health["boot_id"])
    by_session = {i["session_id"]: i for i in summary["items"]}
    assert set(by_session) == {mid, paused, stopped, asking}  # work that had finished is not in it
    got = {sid: (by_session[sid]["outcome"], by_session[sid]["reason_code"]) for sid in by_session}
    assert got == {mid: ("continued", "recovered"), paused: ("paused", "user_paused"),
                   stopped: ("stopped", "user_stopped"), asking: ("waiting", "awaiting_approval")}
    assert summary["counts"] == {"continued": 1, "waiting": 1, "paused": 1, "stopped": 1, "failed": 0}
    for item in summary["items"]:
        assert {"work_id", "session_id", "session_title", "kind", "outcome", "reason_code", "reason", "decided_at",
                "actions"} <= set(item)
        assert item["reason"] and item["kind"] == "chat"
    assert by_session[paused]["session_title"] == "paused by me"
    assert by_session[paused]["reason"] == "You paused this work."
    assert by_session[paused]["actions"]["can_resume"] is True
    assert by_session[asking]["reason"] == "A tool call is waiting for your approval."
    assert by_session[stopped]["actions"]["can_end"] is False
    rows = db_rows(env["state"], "SELECT work_id, state FROM recovery_decisions WHERE state = 'reported'")
    assert sorted(r["work_id"] for r in rows) == sorted(i["work_id"] for i in summary["items"])
    # each item carries the control version its actions were computed from: Resume taken on the summary
    # is accepted with it (the pause bumped it: what the person saw before the restart is refused)
    client = server.client()
    for sid, item in by_session.items():
        assert item["control_version"] == client.session(sid)["work"]["control_version"], sid
    with pytest.raises(GoalsError) as stale:
        client.action(paused, "resume", by_session[paused]["control_version"] - 1)
    assert stale.value.status == 409
    client.action(paused, "resume", by_session[paused]["control_version"])
    assert client.session(paused)["work"]["desired_state"] == "run"

    # the continued chat really finishes, its command run once; the summary stays as it was recorded
    assert client.wait(mid, timeout=60)["work"]["phase"] == "done"
    assert (env["root"] / "a.txt").read_text() == "a\n"
    later = get(server, "recovery")
    assert later["recovered_at"] == summary["recovered_at"]
    assert {i["session_id"]: i["outcome"] for i in later["items"]}[mid] == "continued"
    assert {i["session_id"]: i["current_phase"] for i in later["items"]}[mid] == "done"
