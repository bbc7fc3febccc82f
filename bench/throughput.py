"""Throughput of a real server (issue 33 item 2), measured from outside.

* ``tool_loops(sessions=16, window_s=15)``: ``sessions`` bypass chats whose scripted model calls
  ``read_file`` in a loop, all at once (``max_concurrent_turns`` = sessions, two workers). Durable steps
  per second = tool calls committed per second (each: the ``dispatched`` commit, the result commit, and
  the model step before it) counted in control.db over the window. Baseline, in the same run, on the
  same disk: raw sqlite3's sequential commit rate (one ``BEGIN IMMEDIATE; INSERT; COMMIT`` after another,
  WAL, ``synchronous=FULL``) measured just before the server starts.
* ``approvals(sessions=1000)``: ``sessions`` chats in ``ask`` mode each get one message whose model asks
  for a shell command, so each turn stops at an approval. turns/s = sessions / (first POST → the last
  ``pending`` approval committed), with ``max_concurrent_turns`` 16 and two workers; where the time goes
  (medians per item from the durable rows: POST accepted → admitted → claimed → approval), the rate
  the server accepted the messages at (the baseline: what the HTTP front alone allows), and a kill -9
  plus restart with all of them waiting (health and the recovery pass, from durable rows).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import Bench, api, control_reader, wait_health, wait_until
from jupyter_goals.testing import write_script


def _commit_rate(conn: Any, begin: str, insert: str, seconds: float) -> float:
    """Transactions of one INSERT each, one after another for ``seconds``: committed per second."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        conn.execute(begin)
        conn.execute(insert)
        conn.execute("COMMIT")
        n += 1
    return n / (time.perf_counter() - t0)


def raw_commit_rate(directory: Path, seconds: float) -> float:
    """Sequential durable commits per second of raw sqlite3 (WAL, synchronous=FULL), one row each."""
    conn = sqlite3.connect(str(directory / "raw-commits.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    try:
        return _commit_rate(conn, "BEGIN IMMEDIATE", "INSERT INTO t (v) VALUES ('x')", seconds)
    finally:
        conn.close()


def raw_pg_commit_rate(url: str, seconds: float) -> float:
    """Sequential commits per second of raw psycopg on the same PostgreSQL server (one row each)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_commits (id BIGSERIAL PRIMARY KEY, v TEXT)")
        return _commit_rate(conn, "BEGIN", "INSERT INTO raw_commits (v) VALUES ('x')", seconds)


def tool_loops(sessions: int = 16, window_s: float = 15.0, *, control_url: str | None = None,
               usage_url: str | None = None, raw_url: str | None = None) -> dict[str, Any]:
    """``control_url`` / ``usage_url``: the server's stores on PostgreSQL; the baseline is then raw psycopg's
    sequential commit rate on ``raw_url`` (the same server)."""
    from bench.long_session import children, cpu_s

    with Bench("throughput") as b:
        seconds = min(3.0, window_s / 3)
        baseline = raw_pg_commit_rate(raw_url, seconds) if raw_url else raw_commit_rate(b.base, seconds)
        (b.root / "small.txt").write_text("a short file\n")
        model = write_script(b.base / "loop.json", [], {"tool_calls": [{"name": "read_file", "arguments": {"path": "small.txt"}}],
                                                        "usage": {"input_tokens": 10, "output_tokens": 5}})
        extra = ["--GoalsApp.workers=2", f"--GoalsApp.max_concurrent_turns={sessions}"]
        if control_url:
            extra += [f"--GoalsApp.control_db_url={control_url}", f"--GoalsApp.usage_db_url={usage_url}"]
        server = b.server(model, extra).start()
        q = control_reader(b.state, control_url)

        def count(sql: str) -> int:
            return int(q(sql)[0][0])

        with api(server) as http:
            for i in range(sessions):
                sid = http.post("sessions", json={"title": f"loop {i}", "permissions": {"mode": "bypass"}}).json()["session"]["session_id"]
                http.post(f"sessions/{sid}/messages", json={"text": "read small.txt forever", "client_request_id": "go"}).raise_for_status()
            committed = "SELECT COUNT(*) FROM effects WHERE state = 'committed'"
            running = "SELECT COUNT(DISTINCT session_id) FROM effects WHERE state = 'committed'"
            wait_until(lambda: count(running) >= sessions, 120, "every session making tool calls", every=0.1)
            assert server.proc is not None
            pids = [server.proc.pid, *children(server.proc.pid)]  # the server and its workers
            n0, t0, cpu0 = count(committed), time.monotonic(), sum(cpu_s(p) for p in pids)
            time.sleep(window_s)  # the measurement window itself (a rate over time), not a wait for an event
            n1, t1, cpu1 = count(committed), time.monotonic(), sum(cpu_s(p) for p in pids)
            per_session = [int(r[0]) for r in q("SELECT COUNT(*) FROM effects WHERE state = 'committed' GROUP BY session_id")]
            http.post("actions", json={"action": "stop_all"})
    rate = (n1 - n0) / (t1 - t0)
    return {"sessions": sessions, "store": "postgresql" if control_url else "sqlite", "window_s": round(t1 - t0, 1),
            "steps": n1 - n0, "steps_per_s": round(rate, 1), "raw_sqlite_commits_per_s": round(baseline, 1),
            "ratio": round(rate / baseline, 3), "fewest_most_calls_per_session": [min(per_session), max(per_session)],
            # CPU of the server and its workers per tool call (each: a model step, two commits, the events):
            # with 2 cores, 2000 / this is the most tool calls per second the machine can run
            "cpu_ms_per_tool_call": round(1000 * (cpu1 - cpu0) / max(1, n1 - n0), 2)}


def approvals(sessions: int = 1000, *, quota: int = 16, posters: int = 8, control_url: str | None = None,
              usage_url: str | None = None) -> dict[str, Any]:
    """``control_url`` / ``usage_url``: the server's stores on PostgreSQL."""

    with Bench("approvals") as b:
        model = write_script(b.base / "ask.json", [], {"text": "Running it.", "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo hello"}}], "usage": {"input_tokens": 10, "output_tokens": 5}})
        extra = ["--GoalsApp.workers=2", f"--GoalsApp.max_concurrent_turns={quota}"]
        if control_url:
            extra += [f"--GoalsApp.control_db_url={control_url}", f"--GoalsApp.usage_db_url={usage_url}"]
        server = b.server(model, extra).start()
        q = control_reader(b.state, control_url)

        def one(sql: str) -> Any:
            return q(sql)[0][0]

        local = threading.local()

        def client() -> Any:
            if not hasattr(local, "http"):
                local.http = api(server)
            return local.http

        t_s0 = time.time()
        with ThreadPoolExecutor(posters) as pool:
            sids = list(pool.map(lambda i: client().post("sessions", json={"title": f"s{i}", "cwd": str(b.root)})
                                 .json()["session"]["session_id"], range(sessions)))
            t_s1 = time.time()

            def send(sid: str) -> None:
                client().post(f"sessions/{sid}/messages", json={"text": "say hello", "client_request_id": "m"}).raise_for_status()

            t0 = time.time()
            list(pool.map(send, sids))
            t_posted = time.time()
        pending = "SELECT COUNT(*) FROM approvals WHERE state = 'pending'"
        wait_until(lambda: one(pending) >= sessions, 600, f"{sessions} pending approvals", every=0.1)
        last = float(one("SELECT MAX(created_at) FROM approvals"))
        rows = q("SELECT w.created_at, a.admitted_at, a.started_at, p.created_at FROM work_items w"
                 " JOIN attempts a ON a.work_id = w.work_id JOIN approvals p ON p.work_id = w.work_id")
        steps = {"waiting_for_admission_ms": [(r[1] - r[0]) * 1000 for r in rows],
                 "admitted_to_claimed_ms": [(r[2] - r[1]) * 1000 for r in rows],
                 "claimed_to_approval_ms": [(r[3] - r[2]) * 1000 for r in rows]}
        # the whole run from outside goes on: kill -9 with every turn waiting, restart, recovery from rows
        server.kill()
        t_k = time.time()
        restarted = b.server(model, extra).start(wait=False)
        healthy = wait_health(restarted)
        wait_until(lambda: one("SELECT COUNT(*) FROM server_state WHERE key = 'recovery.last_pass'"), 120,
                   "the recovery pass", every=0.05)
        header = json.loads(one("SELECT value FROM server_state WHERE key = 'recovery.last_pass'"))
        still = one(pending)
    elapsed = last - t0
    return {"sessions": sessions, "store": "postgresql" if control_url else "sqlite", "max_concurrent_turns": quota, "turns_per_s": round(sessions / elapsed, 1),
            "first_post_to_last_approval_s": round(elapsed, 2), "create_sessions_s": round(t_s1 - t_s0, 2),
            "post_messages_s": round(t_posted - t0, 2), "accepted_per_s": round(sessions / (t_posted - t0), 1),
            "steps_median_ms": {k: round(statistics.median(v), 1) for k, v in steps.items()},
            "steps_max_ms": {k: round(max(v), 1) for k, v in steps.items()},
            "restart_to_health_s": round(healthy - t_k, 2), "restart_to_recovery_pass_s": round(header["at"] - t_k, 2),
            "approvals_pending_after_restart": still}

