"""Process-level crash tests: real ``jupyter server`` processes, kill -9, restart, count side effects.

The chat under test asks the model to run ``shell`` once to append one line to ``out.txt``, then
answer. "No duplicate" is proven by counting the lines in that file, never by log lines. The tests of
every interruption point (whole server), of a crash during recovery and of a worker killed alone run
on both stores (``stored``: SQLite, and PostgreSQL private schemas through the ``backend`` fixture).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, FencedError
from tests.servers import (
    APPEND_RULES,
    ServerProcess,
    attempt_count,
    db_rows,
    fired,
    full_passes,
    lines,
    new_session,
    server_env,
    store_url,
    stored_server_env,
    wait_for,
    wait_spawned,
)
from tests.storekit import Backend

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with server_env(tmp_path, APPEND_RULES) as e:
        yield e


@pytest.fixture
def stored(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    """``env`` on each store (``backend``: SQLite, and PostgreSQL private schemas)."""
    with stored_server_env(tmp_path, APPEND_RULES, backend) as e:
        yield e


def send_raw(server: ServerProcess, sid: str, text: str, crid: str) -> httpx.Response | None:
    try:
        return httpx.post(f"{server.url}api/goals/sessions/{sid}/messages", json={"text": text, "client_request_id": crid},
                          headers={"Authorization": f"token {server.token}"}, timeout=10)
    except httpx.HTTPError:
        return None  # the server died before answering: the request was never acknowledged


WORKER_POINTS = [
    "provider.before_request",
    "provider.after_response",
    "provider.after_commit",
    "tool.before_dispatch",
    "tool.after_dispatch",
    "tool.before_result_commit",
    "tool.after_result_commit",
]


#: the whole server dies at the point (faults.py): a worker dying alone leaves a live server that
#: recovers its work at once, and a kill from here once the point fired would land at a later,
#: random point (a re-dispatched command killed before it ran: dispatched, yet no line)
WHOLE_SERVER = {"JUPYTER_GOALS_CRASH_SCOPE": "group"}


STORE_POINTS = [pytest.param(store, p, id=f"{store}-{p}") for store in ("sqlite", "postgresql") for p in WORKER_POINTS]


@pytest.mark.parametrize(("backend", "point"), STORE_POINTS, indirect=["backend"])
def test_chat_survives_crash_at_point_and_appends_at_most_once(stored: dict[str, Any], point: str) -> None:
    env = stored
    server = env["make"]().start(crash_at=point, env=WHOLE_SERVER)
    sid = new_session(server, env["root"])
    server.client().send(sid, "please append a line", client_request_id="r1")
    assert server.wait_exit(timeout=60) == -9  # the server and its workers died at the point
    assert fired(env["state"], point)
    dispatched = db_rows(env["state"], "SELECT state FROM effects WHERE state != 'planned'")

    server = env["make"]().start()  # restarted without the variable; no further client request
    snap = server.client().wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done"
    assert lines(env["out"]) <= 1
    if dispatched or point.startswith("tool.after") or point == "tool.before_result_commit":
        assert lines(env["out"]) == 1
    kinds = [i["kind"] for i in snap["transcript"]["items"]]
    assert "interruption" in kinds, kinds
    results = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result"]
    assert results and all(r["state"] in ("committed", "unknown") for r in results)
    assert kinds.count("user") == 1  # the user input is never re-appended
    before = snap["transcript"]["items"]
    server.kill()
    attempts = attempt_count(env["state"])

    server = env["make"]().start()  # a second restart changes nothing
    full_passes(server)
    assert attempt_count(env["state"]) == attempts  # nothing admitted
    again = server.client().session(sid)
    assert again["transcript"]["items"] == before
    assert again["work"]["phase"] == "done"
    assert lines(env["out"]) <= 1


def test_unacknowledged_request_is_not_shown_as_submitted(env: dict[str, Any]) -> None:
    server = env["make"]().start(crash_at="input.before_accept")
    sid = new_session(server, env["root"])
    assert send_raw(server, sid, "please append a line", "r1") is None
    server.wait_exit(timeout=20)
    server = env["make"]().start()
    snap = server.client().session(sid)
    assert snap["work"] is None and snap["transcript"]["items"] == []
    # the client retries with the same client_request_id: accepted exactly once
    first = server.client().send(sid, "please append a line", client_request_id="r1")
    second = server.client().send(sid, "please append a line", client_request_id="r1")
    assert first["message_id"] == second["message_id"]
    server.client().wait(sid, timeout=30)
    assert lines(env["out"]) == 1


def test_request_accepted_before_crash_runs_once_and_retry_gets_same_answer(env: dict[str, Any]) -> None:
    server = env["make"]().start(crash_at="input.after_accept")
    sid = new_session(server, env["root"])
    assert send_raw(server, sid, "please append a line", "r1") is None  # committed, never acknowledged
    server.wait_exit(timeout=20)
    server = env["make"]().start()
    snap = server.client().wait(sid, timeout=30)  # continues with no further client request
    retry = server.client().send(sid, "please append a line", client_request_id="r1")
    assert retry["work_id"] == snap["work"]["work_id"]
    attempts = attempt_count(env["state"])
    full_passes(server)  # the retry admits nothing
    assert attempt_count(env["state"]) == attempts
    assert lines(env["out"]) == 1
    assert len(db_rows(env["state"], "SELECT work_id FROM work_items")) == 1


@pytest.mark.parametrize("point", ["recovery.after_claim", "recovery.after_decision"])
def test_crash_during_recovery_converges(stored: dict[str, Any], point: str) -> None:
    env = stored
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    server.client().send(sid, "slow: please run", client_request_id="r1")
    wait_spawned(env["state"])
    server.kill()
    server = env["make"]().start(crash_at=point, wait=False)
    assert server.wait_exit(timeout=30) == 86  # another crash, during recovery
    assert fired(env["state"], point)
    server = env["make"]().start()
    snap = server.client().wait(sid, timeout=60)
    assert lines(env["out"]) == 1
    decisions = db_rows(env["state"], "SELECT decision_key, state FROM recovery_decisions")
    assert len({d["decision_key"] for d in decisions}) == len(decisions) >= 1
    assert [i["kind"] for i in snap["transcript"]["items"]].count("interruption") >= 1


def test_worker_kill_is_recovered_by_supervisor_and_old_generation_is_fenced(stored: dict[str, Any]) -> None:
    env = stored
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    server.client().send(sid, "slow: please run", client_request_id="r1")
    wait_spawned(env["state"])
    old = db_rows(env["state"], "SELECT attempt_id, generation FROM attempts WHERE state = 'running'")[0]
    [worker] = server.workers()
    os.kill(worker["pid"], signal.SIGKILL)  # the worker alone; the server lives
    snap = server.client().wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done"
    assert lines(env["out"]) == 1
    assert server.workers() and server.workers()[0]["pid"] != worker["pid"]
    db = Database(store_url(env["state"]))
    try:
        with pytest.raises(FencedError):
            db.transact(lambda tx: c.fence(tx, old["attempt_id"], old["generation"]))
    finally:
        db.close()


def test_paused_and_stopped_chats_stay_so_across_restart(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    cl = server.client()
    paused, stopped = new_session(server, env["root"]), new_session(server, env["root"])
    cl.send(paused, "slow: please run", client_request_id="p")
    cl.send(stopped, "slow: please run", client_request_id="s")
    wait_spawned(env["state"], 2)
    cl.action(paused, "pause")
    cl.action(stopped, "stop")
    server.kill()
    attempts = attempt_count(env["state"])
    server = env["make"]().start()
    full_passes(server)
    assert attempt_count(env["state"]) == attempts  # neither admitted
    cl = server.client()
    assert cl.session(paused)["work"]["phase"] == "paused"
    assert cl.session(paused)["work"]["reason_code"] == "user_paused"
    assert cl.session(paused)["actions"]["can_resume"] is True
    assert cl.session(stopped)["work"]["phase"] == "cancelled"
    n_requests = len(db_rows(env["state"], "SELECT 1 FROM requests"))
    assert n_requests == 2  # no model call while paused or stopped
    cl.action(paused, "resume")
    snap = cl.wait(paused, timeout=30)
    assert snap["work"]["phase"] == "done"


def test_twenty_chats_continue_after_restart_within_quota(env: dict[str, Any]) -> None:
    quota = ["--GoalsApp.max_concurrent_turns=4"]
    server = env["make"](quota).start()
    cl = server.client()
    sids = [new_session(server, env["root"]) for _ in range(20)]
    for i, sid in enumerate(sids):
        cl.send(sid, "think hard", client_request_id=f"r{i}")
    in_flight = "SELECT 1 FROM requests WHERE state = 'sent'"
    wait_for(lambda: db_rows(env["state"], in_flight), what="a model request in flight")
    server.kill()
    # precondition, read after the kill: requests were cut off in flight, most chats unfinished
    assert db_rows(env["state"], in_flight)
    assert len(db_rows(env["state"], "SELECT 1 FROM work_items WHERE phase != 'done'")) >= 10
    server = env["make"](quota).start()
    cl = server.client()
    for sid in sids:
        assert cl.wait(sid, timeout=90)["work"]["phase"] == "done"
    attempts = db_rows(env["state"], "SELECT session_id, started_at, ended_at, admitted_at FROM attempts WHERE started_at IS NOT NULL")
    points = sorted([(a["started_at"], 1) for a in attempts] + [(a["ended_at"] or 1e18, -1) for a in attempts],
                    key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak <= 4
    assert {a["session_id"] for a in attempts} == set(sids)


def test_stop_all_then_kill_leaves_everything_stopped(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    cl = server.client()
    sids = [new_session(server, env["root"]) for _ in range(3)]
    for i, sid in enumerate(sids):
        cl.send(sid, "slow: please run", client_request_id=f"r{i}")
    wait_spawned(env["state"])
    stopped = cl.stop_all()["stopped"]
    assert len(stopped) == 3
    server.kill()
    attempts = attempt_count(env["state"])
    server = env["make"]().start()
    full_passes(server)
    assert attempt_count(env["state"]) == attempts  # nothing admitted
    for sid in sids:
        assert server.client().session(sid)["work"]["phase"] == "cancelled"


def test_machine_restart_marks_old_workers_dead_and_work_continues_after_long_downtime(env: dict[str, Any]) -> None:
    server = env["make"](env={"JUPYTER_GOALS_BOOT_ID": "boot-1"}).start()
    sid = new_session(server, env["root"])
    server.client().send(sid, "think hard", client_request_id="r1")
    wait_for(lambda: db_rows(env["state"], "SELECT 1 FROM attempts WHERE state = 'running'"), what="running")
    server.kill()
    # three hours of downtime: shift every timestamp back
    conn = sqlite3.connect(env["state"] / "control.db")
    for table, cols in {"work_items": ("created_at", "updated_at"), "workers": ("registered_at", "heartbeat_at", "lease_expires_at"),
                        "attempts": ("admitted_at", "started_at", "heartbeat_at")}.items():
        conn.execute(f"UPDATE {table} SET " + ", ".join(f"{col} = {col} - 10800" for col in cols))
    conn.commit()
    conn.close()
    server = env["make"](env={"JUPYTER_GOALS_BOOT_ID": "boot-2"}).start()
    snap = server.client().wait(sid, timeout=30)
    assert snap["work"]["phase"] == "done"
    dead = db_rows(env["state"], "SELECT end_reason FROM workers WHERE boot_id = 'boot-1'")
    assert dead and all(d["end_reason"] == "new boot" for d in dead)


def test_graceful_server_exit_is_not_a_pause_and_work_continues(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    server.client().send(sid, "slow: please run", client_request_id="r1")
    wait_spawned(env["state"])
    assert server.stop() == 0  # a plain exit: stop admission, hand attempts back, stop workers
    [work] = db_rows(env["state"], "SELECT desired_state FROM work_items")
    assert work["desired_state"] == "run"
    assert db_rows(env["state"], "SELECT 1 FROM attempts WHERE state = 'running'") == []
    server = env["make"]().start()
    assert server.client().wait(sid, timeout=30)["work"]["phase"] == "done"
    assert lines(env["out"]) == 1


def test_messages_sent_during_a_turn_are_queued_or_steered(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    cl = server.client()
    sid = new_session(server, env["root"])
    first = cl.send(sid, "slow: please run", client_request_id="r1")
    wait_spawned(env["state"])
    steered = cl.send(sid, "think about this too", client_request_id="r2", delivery="steer")
    queued = cl.send(sid, "think again", client_request_id="r3", delivery="queue")
    assert steered["work_id"] == first["work_id"]  # joins the running request
    assert queued["work_id"] != first["work_id"]  # a new request, after the running one
    server.kill()  # both are durable: a crash loses neither
    server = env["make"]().start()
    cl = server.client()
    wait_for(lambda: all(w["phase"] == "done" for w in db_rows(env["state"], "SELECT phase FROM work_items")),
             timeout=60, what="both requests done")
    items = cl.session(sid)["transcript"]["items"]
    users = [i["content"] for i in items if i["kind"] == "user"]
    assert users == ["slow: please run", "think about this too", "think again"]
    assert lines(env["out"]) == 1


def test_ask_mode_approval_runs_the_tool_once_and_second_decision_conflicts(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    cl = server.client()
    sid = str(cl.create_session(title="ask", cwd=str(env["root"]))["session"]["session_id"])
    cl.send(sid, "please append a line", client_request_id="r1")
    snap = cl.wait(sid, phases=("waiting",), timeout=30)
    assert snap["work"]["reason_code"] == "awaiting_approval"
    [approval] = cl.approvals()
    assert approval["tool"] == "shell" and approval["state"] == "pending"
    server.kill()  # a pending approval survives a crash and is never approved automatically
    attempts = attempt_count(env["state"])
    server = env["make"]().start()
    cl = server.client()
    full_passes(server)
    assert attempt_count(env["state"]) == attempts  # nothing admitted while the approval is pending
    assert lines(env["out"]) == 0
    assert cl.session(sid)["work"]["reason_code"] == "awaiting_approval"
    cl.decide(approval["approval_id"], "approve")
    with pytest.raises(Exception) as conflict:
        cl.decide(approval["approval_id"], "approve")
    assert getattr(conflict.value, "status", None) == 409
    assert cl.wait(sid, timeout=30)["work"]["phase"] == "done"
    assert lines(env["out"]) == 1


def test_openai_compatible_provider_retries_503_with_durable_backoff(env: dict[str, Any]) -> None:
    """503 three times, then 200: the work continues after a durable, growing backoff. Each wait is
    visible (``waiting`` / ``provider_retrying`` with the retry time and Retry / Pause / End) and no
    model request is made before its retry time."""
    from tests.openai_server import OpenAITestServer, openai_usage

    with OpenAITestServer() as api:
        for _ in range(3):
            api.plan_error(503)
        api.plan(text_chunks=["Hello ", "from the ", "local model."], usage_chunks=[openai_usage(7, 3)])
        server = env["make"](["--GoalsApp.provider_retry_base_s=0.5"], env={"OPENAI_BASE_URL": api.base_url}).start()
        cl = server.client()
        sid = str(cl.create_session(title="oa", cwd=str(env["root"]), model="openai:test-model")["session"]["session_id"])
        cl.send(sid, "hi", client_request_id="r1")
        waits: dict[float, tuple[int, dict[str, Any], dict[str, Any]]] = {}  # retry_at -> (requests made, work, actions)
        deadline = time.monotonic() + 60
        while (snap := cl.session(sid))["work"]["phase"] != "done":
            assert time.monotonic() < deadline, snap["work"]
            work = snap["work"]
            if work["phase"] == "waiting" and work["reason_code"] == "provider_retrying":
                waits.setdefault(work["retry_at"], (len(api.completion_requests), work, snap["actions"]))
            time.sleep(0.05)
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"] == ["Hello from the local model."]
        requests = api.completion_requests
        assert len(requests) == 4
        assert len(waits) == 3
        for n, (retry_at, (made, work, actions)) in enumerate(sorted(waits.items()), 1):
            assert made == n  # seen while waiting after the n-th fault
            assert requests[n].received_at >= retry_at  # no model call before the durable retry time
            assert "503" in work["reason"] and f"retry {n} in" in work["reason"]
            assert (actions["can_retry"], actions["can_pause"], actions["can_end"]) == (True, True, True)
        gaps = [b.received_at - a.received_at for a, b in zip(requests, requests[1:], strict=False)]
        assert gaps[0] >= 0.5 and gaps[1] >= 1.0 and gaps[2] >= 2.0  # growing backoff
        failed = db_rows(env["state"], "SELECT state, error FROM requests WHERE state = 'failed'")
        assert len(failed) == 3 and all("503" in f["error"] for f in failed)
        events = cl.events(0, 5000)["events"]
        assert sum(e["payload"].get("reason_code") == "provider_retrying" for e in events) >= 3


def test_persistent_provider_fault_keeps_the_request_and_offers_retry_pause_end(env: dict[str, Any]) -> None:
    """401 (bad key), then 404 (unknown model): not retried by itself, no idle model calls; the request
    stays with its error and Retry / Pause / End, and continues once the user acts."""
    from tests.openai_server import OpenAITestServer

    with OpenAITestServer() as api:
        api.plan_error(401, "invalid api key")
        server = env["make"](env={"OPENAI_BASE_URL": api.base_url}).start()
        cl = server.client()
        sid = str(cl.create_session(title="oa", cwd=str(env["root"]), model="openai:test-model")["session"]["session_id"])
        cl.send(sid, "hi", client_request_id="r1")
        snap = cl.wait(sid, phases=("failed",), timeout=30)
        assert snap["work"]["reason_code"] == "provider_failed"
        assert "401" in snap["work"]["reason"] and "invalid api key" in snap["work"]["reason"]
        actions = snap["actions"]
        assert (actions["can_retry"], actions["can_pause"], actions["can_end"], actions["can_resume"]) == (True, True, True, False)
        attempts = attempt_count(env["state"])
        full_passes(server)  # a persistent fault is not retried by itself
        assert attempt_count(env["state"]) == attempts
        assert len(api.completion_requests) == 1
        snap = cl.session(sid)
        assert snap["work"]["phase"] == "failed" and snap["work"]["desired_state"] == "run"
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "user"] == ["hi"]

        api.plan_error(404, "model not found")
        cl.action(sid, "retry")
        snap = cl.wait(sid, phases=("failed",), timeout=30)
        assert "404" in snap["work"]["reason"] and len(api.completion_requests) == 2

        cl.action(sid, "pause")
        snap = cl.session(sid)
        assert (snap["work"]["phase"], snap["actions"]["can_resume"]) == ("paused", True)
        api.plan_text("Working again.")
        cl.action(sid, "resume")
        snap = cl.wait(sid, timeout=30)
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"] == ["Working again."]
        assert [i["kind"] for i in snap["transcript"]["items"]].count("user") == 1
        assert len(api.completion_requests) == 3


def test_requests_while_the_schema_is_being_migrated_get_503_starting(env: dict[str, Any]) -> None:
    """A start that has to migrate the schema (here a v1 control.db, with its write lock held by another
    process as a long migration would hold it) answers 503 ``starting`` with a sentence, never a
    missing-table error and never a half-accepted request, then serves normally."""
    from jupyter_goals.store import schema

    env["state"].mkdir(parents=True)
    v1 = Database(f"sqlite:///{env['state'] / 'control.db'}")
    saved = schema.MIGRATIONS["control"]
    schema.MIGRATIONS["control"] = saved[:1]
    try:
        assert schema.migrate(v1, "control") == 1
    finally:
        schema.MIGRATIONS["control"] = saved
        v1.close()
    blocker = sqlite3.connect(env["state"] / "control.db", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    server = env["make"]().start(wait=False)
    headers = {"Authorization": f"token {server.token}"}
    try:
        def answered() -> bool:
            try:
                return httpx.get(f"{server.url}api/goals/health", headers=headers, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answered, what="the HTTP server to answer while the store is locked")
        health = httpx.get(f"{server.url}api/goals/health", headers=headers, timeout=5).json()
        assert health["status"] == "starting" and health["reason_code"] == "starting"
        r = httpx.get(f"{server.url}api/goals/sessions", headers=headers, timeout=5)
        assert r.status_code == 503
        assert r.json()["error"] == "starting" and "starting" in r.json()["message"]
        r = httpx.post(f"{server.url}api/goals/sessions", headers=headers, timeout=5, json={"title": "early"})
        assert r.status_code == 503 and r.json()["error"] == "starting"
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    server.wait_ready()
    assert server.client().sessions() == []
    assert [r["version"] for r in db_rows(env["state"], "SELECT version FROM schema_migrations ORDER BY version")] == [
        m[0] for m in schema.CONTROL_MIGRATIONS]
