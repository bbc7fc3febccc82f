"""Which commits wait for the disk: every one, except a tool's result, which the next durable commit of
the turn carries (one fsync per tool call). Read from the statements a real worker runs on SQLite, and
from the settings a transaction sees on both stores.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from jupyter_goals.config import GoalsConfig
from jupyter_goals.host.wake import ATTEMPTS, Notifier
from jupyter_goals.identity import host_name
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.runtime.worker import Worker
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.store.schema import migrate
from tests.storekit import Backend


def sync_setting(tx: Tx) -> str:
    if tx.dialect == "sqlite":
        return {0: "off", 1: "normal", 2: "full", 3: "extra"}[int(tx.scalar("PRAGMA synchronous"))]
    return str(tx.scalar("SHOW synchronous_commit"))


def test_a_commit_not_waited_for_leaves_the_connection_durable_after_it(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    durable, deferred = ("full", "normal") if backend.kind == "sqlite" else ("on", "off")
    assert db.transact(sync_setting) == durable
    assert db.transact(sync_setting, durable=False) == deferred
    assert db.transact(sync_setting) == durable  # the next commit waits for the disk again

    def fails(tx: Tx) -> None:
        assert sync_setting(tx) == deferred
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        db.transact(fails, durable=False)
    assert db.transact(sync_setting) == durable  # a rollback too
    assert asyncio.run(db.run(sync_setting, durable=False)) == deferred
    assert asyncio.run(db.run(sync_setting)) == durable
    assert db.transact(sync_setting, write=False, durable=False) == durable  # a read commits nothing


def test_a_read_is_one_snapshot_on_sqlite_and_no_transaction_on_postgresql(backend: Backend) -> None:
    """PostgreSQL (READ COMMITTED) gives each statement its own snapshot inside a transaction or not: a read
    runs without BEGIN and COMMIT (two round trips less); a write is one transaction on both."""
    db = backend.open("control", migrated="control")

    def in_transaction(tx: Tx) -> bool:
        conn = tx._conn
        return bool(conn.in_transaction) if tx.dialect == "sqlite" else conn.info.transaction_status != 0

    assert db.transact(in_transaction) is True
    assert db.transact(in_transaction, write=False) is (backend.kind == "sqlite")
    assert asyncio.run(db.run_write_if_needed(in_transaction)) is (backend.kind == "sqlite")  # a probe: a read
    with pytest.raises(RuntimeError):  # a failed read leaves the connection usable
        db.transact(lambda tx: (_ for _ in ()).throw(RuntimeError("x")), write=False)
    assert db.transact(lambda tx: tx.scalar("SELECT 1 AS one"), write=False) == 1


async def test_a_turn_waits_for_the_disk_before_every_step_but_a_tool_result(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    db = Database(url)
    migrate(db, "control")
    (tmp_path / "notes.txt").write_text("some notes\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [
        {"when": {"last_tool_result_contains": "some notes"}, "respond": {"text": "Read them."}}],
        "default": {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}},
                                   {"name": "read_file", "arguments": {"path": "notes.txt"}}]}}))
    model = f"scripted:{script}"
    worker = Worker("w_dur", GoalsConfig(state_dir=tmp_path, control_db_url=url, default_model=model,
                                         max_concurrent_turns=1, heartbeat_s=3600, lease_ttl_s=7200,
                                         safety_tick_s=3600))
    statements: list[str] = []
    worker.db._ensure().set_trace_callback(statements.append)
    run = asyncio.create_task(worker.run())
    try:
        session = db.transact(lambda tx: c.create_session(tx, "t", str(tmp_path), model, {"mode": "bypass"}))
        msg, _ = db.transact(lambda tx: c.accept_message(tx, c.get_session(tx, session["session_id"]), "read", "r1",
                                                         "queue", auto_recover=True, host=host_name()))
        coordinator = Coordinator(db, GoalsConfig(state_dir=tmp_path, default_model=model), registry=ToolRegistry())
        assert (await coordinator.admit()).admitted == [msg["work_id"]]
        deadline = time.monotonic() + 20
        while db.transact(lambda tx: c.get_work(tx, msg["work_id"]), write=False)["phase"] != "done":
            assert time.monotonic() < deadline, "the turn did not end"
            Notifier(tmp_path).notify(ATTEMPTS)
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 20)
    results = db.transact(lambda tx: tx.all("SELECT state FROM effects"), write=False)
    assert [r["state"] for r in results] == ["committed", "committed"]
    db.close()

    # the worker's write transactions, each with the synchronous setting it committed under
    txs: list[tuple[str, list[str]]] = []
    mode, body = "full", None
    for s in statements:
        if s.startswith("PRAGMA synchronous="):
            mode = s.split("=")[1].lower()
        elif s == "BEGIN IMMEDIATE":
            body = []
        elif s == "COMMIT" and body is not None:
            txs.append((mode, body))
            body = None
        elif body is not None:
            body.append(s)
    assert mode == "full"  # the connection is left durable
    dispatched = [m for m, b in txs if any("state = 'dispatched'" in s for s in b)]
    results_tx = [m for m, b in txs if any("INSERT INTO transcript" in s and "'tool_result'" in s for s in b)]
    assert dispatched == ["full", "full"]  # before each side effect: on disk
    assert results_tx == ["normal", "normal"]  # each result: carried by the next durable commit
    assert all(m == "full" for m, b in txs if b not in [bb for mm, bb in txs if mm == "normal"])
    for i, (m, _) in enumerate(txs):
        if m == "normal":  # a durable commit of the turn follows each result before it ends
            assert any(mm == "full" for mm, _ in txs[i + 1:]), "a result left without a durable commit after it"
    assert txs[-1][0] == "full"
