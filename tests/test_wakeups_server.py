"""Event-driven wake-ups on real servers (issue 13 item 5): an idle server with two workers commits
nothing and needs no write lock while its passes go on; with safety ticks far longer than the test,
posted messages still start their turns (the POST wakes the admission loop, the admission wakes a
worker, an attempt's end wakes the admission loop for the message queued behind it) and a durable
provider retry time is kept (the loop sleeps until it)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.servers import db_rows, server_env, wait_for

pytestmark = pytest.mark.slow

LONG = ["--GoalsApp.safety_tick_s=600", "--GoalsApp.reconcile_interval_s=600"]


def done(env: dict[str, Any], work_id: str) -> bool:
    return bool(db_rows(env["state"], "SELECT 1 FROM work_items WHERE work_id = ? AND phase = 'done'", (work_id,)))


def test_an_idle_server_with_two_workers_commits_nothing_and_takes_no_write_lock(tmp_path: Path) -> None:
    with server_env(tmp_path, [{"when": {}, "respond": {"text": "ok"}}]) as env:
        # heartbeats (the one periodic write) out of the window; full passes every 0.3 s inside it
        server = env["make"](["--GoalsApp.workers=2", "--GoalsApp.heartbeat_s=600", "--GoalsApp.lease_ttl_s=1800",
                              "--GoalsApp.reconcile_interval_s=0.3", "--GoalsApp.safety_tick_s=0.05"]).start()
        cl = server.client()
        for i in range(3):
            sid = cl.create_session(title=f"s{i}", cwd=str(env["root"]))["session"]["session_id"]
            work_id = cl.send(sid, "hello", client_request_id=f"r{i}")["work_id"]
            wait_for(lambda work_id=work_id: done(env, work_id), what="the chat finished")
        wait_for(lambda: len(db_rows(env["state"], "SELECT 1 FROM workers WHERE state = 'live'")) == 2,
                 what="both workers registered")
        wait_for(lambda: not db_rows(env["state"], "SELECT 1 FROM outbox WHERE state != 'done'"), what="outbox drained")
        watcher = sqlite3.connect(env["state"] / "control.db")
        holder = sqlite3.connect(env["state"] / "control.db", isolation_level=None, timeout=30)
        version = watcher.execute("PRAGMA data_version").fetchone()[0]
        holder.execute("BEGIN IMMEDIATE")  # the write lock is ours while the server idles
        try:
            since = time.time()
            stamps: set[float] = set()

            def passes() -> bool:  # full passes (ownership, recovery, decide, admit) begun after `since`
                at = cl.health()["recovery"].get("at")
                if at is not None and at > since:
                    stamps.add(at)
                return len(stamps) >= 4

            # a pass that opened a write transaction would wait for our lock (busy timeout 10 s)
            wait_for(passes, timeout=8, what="full passes while another connection holds the write lock")
        finally:
            holder.execute("ROLLBACK")
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version  # nobody committed
        watcher.close()
        holder.close()


def test_posted_messages_start_their_turns_without_the_safety_tick(tmp_path: Path) -> None:
    rules = [{"when": {"last_user_contains": "slow"}, "respond": {"text": "slow answer", "delay_s": 0.5}},
             {"when": {}, "respond": {"text": "ok"}}]
    with server_env(tmp_path, rules) as env:
        server = env["make"](["--GoalsApp.workers=2", *LONG]).start()
        cl = server.client()
        sid = cl.create_session(title="s", cwd=str(env["root"]))["session"]["session_id"]
        first = cl.send(sid, "hello", client_request_id="r1")["work_id"]
        wait_for(lambda: done(env, first), timeout=30, what="the first turn (woken by the POST)")
        # the second waits behind the first of its session: only the end of the first admits it
        slow = cl.send(sid, "slow one", client_request_id="r2")["work_id"]
        queued = cl.send(sid, "after it", client_request_id="r3")["work_id"]
        wait_for(lambda: done(env, slow) and done(env, queued), timeout=30, what="both queued turns")
        started = {r["work_id"]: r["started_at"] for r in db_rows(env["state"], "SELECT work_id, started_at FROM attempts")}
        ended = db_rows(env["state"], "SELECT ended_at FROM attempts WHERE work_id = ?", (slow,))[0]["ended_at"]
        assert started[queued] >= ended  # admitted after the slow turn ended, not alongside it


def test_a_durable_provider_retry_time_is_kept_without_the_safety_tick(tmp_path: Path) -> None:
    from tests.openai_server import OpenAITestServer

    with OpenAITestServer() as api, server_env(tmp_path, []) as env:
        api.plan_error(503)
        api.plan_error(503)
        api.plan(text_chunks=["back"])
        server = env["make"](["--GoalsApp.provider_retry_base_s=0.3", *LONG],
                             env={"OPENAI_BASE_URL": api.base_url}).start()
        cl = server.client()
        sid = cl.create_session(title="oa", cwd=str(env["root"]), model="openai:test-model")["session"]["session_id"]
        work_id = cl.send(sid, "hi", client_request_id="r1")["work_id"]
        wait_for(lambda: done(env, work_id), timeout=40, what="the work after two durable retries")
        requests = api.completion_requests
        assert len(requests) == 3
        gaps = [b.received_at - a.received_at for a, b in zip(requests, requests[1:], strict=False)]
        assert gaps[0] >= 0.3 and gaps[1] >= 0.6  # not before the durable retry time
