"""Event-driven wake-ups (issue 13 item 5), in-process on real SQLite files and real sockets: a pass
that finds nothing to change reads only (no write lock, no commit); a notification reaches a listener
of another ``Notifier`` at once; an idle worker opens no write transaction over many safety ticks,
and a notification after an admission makes it claim with a safety tick far longer than the test.

On the real PostgreSQL server (the shared store of several hosts; each "host" here has a state dir of
its own, so no socket connects them): ``NOTIFY`` from another process wakes a ``LISTEN``ing listener,
a listener whose connection is killed listens again and wakes, and a worker woken by another host's
admission claims at once, its attempt's end waking that host's admission loop."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import sys
import time
import uuid
from pathlib import Path

import pytest

from jupyter_goals.config import GoalsConfig
from jupyter_goals.host.wake import ADMISSION, ATTEMPTS, Coalesced, Listener, Notifier
from jupyter_goals.identity import host_name
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.runtime.worker import Worker
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.store.schema import migrate
from tests.storekit import PG_ADMIN_URL, Backend


def control_db(tmp_path: Path) -> tuple[Database, str]:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    db = Database(url)
    migrate(db, "control")
    return db, url


def data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


async def test_a_pass_with_nothing_to_change_takes_no_write_lock_and_commits_nothing(tmp_path: Path) -> None:
    db, _ = control_db(tmp_path)
    session = db.transact(lambda tx: c.create_session(tx, "t", str(tmp_path), "scripted:x", {"mode": "ask"}))
    watcher = sqlite3.connect(tmp_path / "control.db")
    holder = sqlite3.connect(tmp_path / "control.db", isolation_level=None)
    before = data_version(watcher)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock for the whole pass
    try:
        # the Coordinator's admission pass over a database with nothing unfinished: reads only
        report = await asyncio.wait_for(
            Coordinator(db, GoalsConfig(state_dir=tmp_path, default_model="scripted:x"), registry=ToolRegistry()).admit(), 5)
        assert report.admitted == [] and report.decisions == {}
        assert db.transact_write_if_needed(lambda tx: c.get_session(tx, session["session_id"]))["title"] == "t"
    finally:
        holder.execute("ROLLBACK")
    assert data_version(watcher) == before

    # a function that writes runs again in a write transaction, and commits
    def rename(tx: Tx) -> int:
        assert c.get_session(tx, session["session_id"]) is not None
        return tx.execute("UPDATE sessions SET title = 'renamed' WHERE session_id = ?", (session["session_id"],))

    assert await db.run_write_if_needed(rename) == 1
    assert data_version(watcher) != before
    assert watcher.execute("SELECT title FROM sessions").fetchone()[0] == "renamed"
    watcher.close()
    holder.close()
    db.close()


async def test_a_notification_wakes_the_listeners_of_its_channel_only(tmp_path: Path) -> None:
    # a state dir longer than a UNIX socket path may be (108 bytes) is reached through /proc/self/fd
    state = tmp_path / ("d" * 60) / ("e" * 60)
    state.mkdir(parents=True)
    admission, worker = Listener(state, ADMISSION, "server-1"), Listener(state, ATTEMPTS, "w_1")
    admission.start()
    worker.start()
    assert sorted(p.name for p in (state / "wake").iterdir()) == ["admission.server-1", "attempts.w_1"]
    # a socket left behind by a killed process is removed by the next sender
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "dead"))
    (tmp_path / "dead").rename(state / "wake" / "attempts.w_dead")
    dead.close()
    notifier = Notifier(state)
    assert notifier.notify(ATTEMPTS) == 1
    assert not (state / "wake" / "attempts.w_dead").exists()
    assert await worker.wait(10) is True
    assert await admission.wait(0) is False  # the other channel was not woken
    assert await worker.wait(0) is False  # a wake-up is consumed once
    assert notifier.notify(ADMISSION, exclude="admission.server-1") == 0
    for _ in range(3):  # repeated wake-ups before the listener runs are one wake-up
        notifier.notify(ADMISSION)
    assert await admission.wait(10) is True
    assert await admission.wait(0) is False
    admission.close()
    worker.close()
    notifier.close()
    assert list((state / "wake").iterdir()) == []


async def test_an_idle_worker_writes_nothing_and_claims_at_once_when_woken(tmp_path: Path) -> None:
    db, url = control_db(tmp_path)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": {"text": "hello"}}))
    model = f"scripted:{script}"
    # a safety tick far longer than this test: only the wake-up can make it claim in time
    worker = Worker("w_test", GoalsConfig(state_dir=tmp_path, control_db_url=url, default_model=model,
                                          max_concurrent_turns=2, heartbeat_s=3600, lease_ttl_s=7200, safety_tick_s=3600))
    statements: list[str] = []
    worker.db._ensure().set_trace_callback(statements.append)
    run = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "wake" / "attempts.w_test").exists():  # registered and listening
            assert time.monotonic() < deadline and not run.done()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        # idle, woken three times with nothing admitted: each look is a read transaction
        notifier = Notifier(tmp_path)
        statements.clear()
        for _ in range(3):
            assert notifier.notify(ATTEMPTS) == 1
            await asyncio.sleep(0.05)
        assert statements.count("BEGIN") >= 1
        assert "BEGIN IMMEDIATE" not in statements

        # admitted work, then the admission's wake-up: the worker claims and runs the turn
        session = db.transact(lambda tx: c.create_session(tx, "t", str(tmp_path), model, {"mode": "ask"}))
        msg, _ = db.transact(lambda tx: c.accept_message(tx, c.get_session(tx, session["session_id"]), "hi", "r1",
                                                         "queue", auto_recover=True, host=host_name()))
        coordinator = Coordinator(db, GoalsConfig(state_dir=tmp_path, default_model=model), registry=ToolRegistry())
        assert (await coordinator.admit()).admitted == [msg["work_id"]]
        notifier.notify(ATTEMPTS)
        admission = Listener(tmp_path, ADMISSION, "test")
        admission.start()
        deadline = time.monotonic() + 20
        while db.transact(lambda tx: c.get_work(tx, msg["work_id"]), write=False)["phase"] != "done":
            assert time.monotonic() < deadline, "the turn did not run after the wake-up"
            await asyncio.sleep(0.02)
        attempt = db.transact(lambda tx: tx.one("SELECT worker_id, state FROM attempts"), write=False)
        assert attempt == {"worker_id": "w_test", "state": "ended"}
        assert await admission.wait(10) is True  # the attempt's end woke the admission loop
        admission.close()
        notifier.close()
    finally:
        worker.stop()
        await asyncio.wait_for(run, 20)
        db.close()


@pytest.mark.parametrize("channel", [ADMISSION, ATTEMPTS])
async def test_a_listener_without_its_socket_still_wakes_on_its_tick(tmp_path: Path, channel: str) -> None:
    (tmp_path / "wake").write_text("not a directory")  # the socket cannot be bound
    listener = Listener(tmp_path, channel, "x")
    listener.start()
    assert await listener.wait(0.01) is False
    listener.wake()
    assert await listener.wait(10) is True
    listener.close()


# the PostgreSQL tests: only the conftest ``backend``'s PostgreSQL kind (a private schema in the database
# `test`; in CI an unreachable server fails them, never skips)
POSTGRESQL_ONLY = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
NOTIFY_FROM_ANOTHER_PROCESS = """
import sys
from jupyter_goals.host.wake import Notifier
notifier = Notifier(sys.argv[1], url=sys.argv[2])
assert notifier.notify(sys.argv[3]) == 0  # no listener shares this state dir: only NOTIFY reaches one
notifier.close(flush_s=30)
"""


async def notify_from_another_host(state_dir: Path, url: str, channel: str) -> None:
    """``Notifier.notify`` in a process of its own with a state dir of its own (another host)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", NOTIFY_FROM_ANOTHER_PROCESS, str(state_dir),
                                                url, channel)
    assert await asyncio.wait_for(proc.wait(), 60) == 0


def admin_rows(sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


async def listening_backend(application_name: str, other_than: object = None) -> object:
    """The pid of the server process whose last statement was the listener's ``LISTEN``."""
    deadline = time.monotonic() + 30
    while True:
        rows = await asyncio.to_thread(
            admin_rows, "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN %%'",
            (application_name,))
        pids = [r[0] for r in rows if r[0] != other_than]
        if pids:
            assert len(pids) == 1
            return pids[0]
        assert time.monotonic() < deadline, f"no backend of {application_name} is listening"
        await asyncio.sleep(0.05)



@pytest.mark.postgres
@POSTGRESQL_ONLY
async def test_a_notify_from_another_host_wakes_a_postgresql_listener_at_once(backend: Backend, tmp_path: Path) -> None:
    url = backend.url("control")
    listener = Listener(tmp_path / "host-a", ADMISSION, f"server-{uuid.uuid4().hex[:8]}", url=url)
    listener.start()
    try:
        # a safety tick far longer than the test: only a wake-up returns in time
        assert await listener.wait(30) is True  # the wake after its LISTEN (anything missed before it is read)
        assert listener.pg_listens == 1
        await notify_from_another_host(tmp_path / "host-b", url, ADMISSION)
        sent = time.monotonic()  # the other process exits once its NOTIFY is committed
        assert await listener.wait(30) is True
        assert time.monotonic() - sent < 1.0  # well under the 1 s default safety tick
        assert listener.pg_listens == 1  # the same connection
    finally:
        listener.close()
    await asyncio.sleep(0)  # the listening task ends and closes its connection
    await listening_gone(f"jupyter_goals-listen-{listener.name}")


@pytest.mark.postgres
@POSTGRESQL_ONLY
async def test_a_postgresql_listener_whose_connection_is_killed_listens_again_and_wakes(
        backend: Backend, tmp_path: Path) -> None:
    url = backend.url("control")
    listener = Listener(tmp_path / "host-a", ATTEMPTS, f"w_{uuid.uuid4().hex[:8]}", url=url)
    name = f"jupyter_goals-listen-{listener.name}"
    notifier = Notifier(tmp_path / "host-b", url=url)  # another host's, in this process (its own connection)
    listener.start()
    try:
        assert await listener.wait(30) is True
        first = await listening_backend(name)
        rows = await asyncio.to_thread(admin_rows, "SELECT pg_terminate_backend(%s)", (first,))
        assert rows == [(True,)]
        # the listener notices, connects again, LISTENs and wakes (what was notified meanwhile is read)
        second = await listening_backend(name, other_than=first)
        assert second != first
        deadline = time.monotonic() + 30
        while listener.pg_listens < 2:
            assert time.monotonic() < deadline, "the listener did not listen again"
            await asyncio.sleep(0.02)
        assert await listener.wait(30) is True
        # and a NOTIFY from another host reaches it on the new connection
        assert notifier.notify(ATTEMPTS) == 0
        sent = time.monotonic()
        assert await listener.wait(30) is True
        assert time.monotonic() - sent < 1.0
        # the notifier's own connection killed too: its next send opens a new one
        rows = await asyncio.to_thread(
            admin_rows, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"jupyter_goals-notify-{os.getpid()}",))
        assert len(rows) == 1
        assert rows == [(True,)]
        notifier.notify(ATTEMPTS)
        assert await listener.wait(30) is True
        assert listener.pg_listens == 2
    finally:
        listener.close()
        notifier.close()
    await listening_gone(name)


async def listening_gone(application_name: str) -> None:
    """A closed listener's connection ends (its task closes it)."""
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(admin_rows, "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                  (application_name,)):
        assert time.monotonic() < deadline, f"{application_name} still connected after close()"
        await asyncio.sleep(0.05)


@pytest.mark.postgres
@POSTGRESQL_ONLY
async def test_a_worker_woken_by_another_hosts_admission_claims_at_once(backend: Backend, tmp_path: Path) -> None:
    db = backend.open("control", migrated="control")
    url = backend.url("control")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": {"text": "hello"}}))
    model = f"scripted:{script}"
    worker_id = f"w_{uuid.uuid4().hex[:8]}"
    # host A runs the worker, with a safety tick far longer than the test; host B the admission
    (tmp_path / "host-a").mkdir()
    worker = Worker(worker_id, GoalsConfig(state_dir=tmp_path / "host-a", control_db_url=url, default_model=model,
                                           max_concurrent_turns=2, heartbeat_s=3600, lease_ttl_s=7200, safety_tick_s=3600))
    admission = Listener(tmp_path / "host-b", ADMISSION, "server-b", url=url)
    admission.start()
    notifier = Notifier(tmp_path / "host-b", url=url)
    run = asyncio.create_task(worker.run())
    try:
        assert await admission.wait(30) is True  # listening
        deadline = time.monotonic() + 30
        while worker.wakeups.pg_listens < 1 or worker.wakeups._event.is_set():  # listening, its wake consumed
            assert time.monotonic() < deadline and not run.done()
            await asyncio.sleep(0.01)
        session = db.transact(lambda tx: c.create_session(tx, "t", str(tmp_path), model, {"mode": "ask"}))
        msg, _ = db.transact(lambda tx: c.accept_message(tx, c.get_session(tx, session["session_id"]), "hi", "r1",
                                                         "queue", auto_recover=True, host=host_name()))
        coordinator = Coordinator(db, GoalsConfig(state_dir=tmp_path / "host-b", default_model=model),
                                  registry=ToolRegistry())
        assert (await coordinator.admit()).admitted == [msg["work_id"]]
        assert notifier.notify(ATTEMPTS) == 0  # no socket of host A here: only NOTIFY reaches the worker
        deadline = time.monotonic() + 20
        while db.transact(lambda tx: c.get_work(tx, msg["work_id"]), write=False)["phase"] != "done":
            assert time.monotonic() < deadline, "the turn did not run after the wake-up"
            await asyncio.sleep(0.02)
        attempt = db.transact(lambda tx: tx.one("SELECT worker_id, state FROM attempts"), write=False)
        assert attempt == {"worker_id": worker_id, "state": "ended"}
        assert await admission.wait(30) is True  # the attempt's end on host A woke host B's admission loop
    finally:
        worker.stop()
        await asyncio.wait_for(run, 20)
        admission.close()
        notifier.close()


async def test_a_burst_of_commits_wakes_the_event_streams_once_at_its_end_a_lone_commit_at_once(tmp_path: Path) -> None:
    listener = Listener(tmp_path, "events", "server-1")
    listener.start()
    notifier = Notifier(tmp_path)
    sent: list[float] = []

    def notify() -> None:
        sent.append(time.monotonic())
        notifier.notify("events")

    wake = Coalesced(notify, gap_s=0.05)
    wake()  # a lone commit: at once
    assert len(sent) == 1 and await listener.wait(10) is True
    t0 = time.monotonic()
    for _ in range(100):  # a burst within the gap: one wake-up, at its end
        wake()
    assert len(sent) == 1
    assert await listener.wait(10) is True
    assert len(sent) == 2 and sent[1] - sent[0] >= 0.05 - 0.001 and sent[1] - t0 < 5
    assert await listener.wait(0) is False
    listener.close()
    notifier.close()
