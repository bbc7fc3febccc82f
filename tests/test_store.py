"""Storage contract (DESIGN §2-§4): one suite, run against SQLite and PostgreSQL alike.

Every PostgreSQL test gets fresh schemas (``search_path`` in the URL) that are dropped afterwards.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.models import EffectState, ItemKind
from jupyter_goals.store import control as c
from jupyter_goals.store import schema
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import (
    Database,
    FencedError,
    MigrationFailed,
    StorageUnavailable,
    Tx,
    VersionConflict,
)
from jupyter_goals.store.schema import migrate
from jupyter_goals.usage.ledger import OutboxDispatcher
from tests.storekit import PERMS, Backend, new_chat


def versions(db: Database) -> list[int]:
    return [r["version"] for r in db.transact(lambda tx: tx.all("SELECT version FROM schema_migrations ORDER BY version"))]


def count(db: Database, sql: str, params: tuple[Any, ...] = ()) -> int:
    return int(db.transact(lambda tx: tx.scalar(sql, params), write=False))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def session_columns(db: Database) -> set[str]:
    row = db.transact(lambda tx: tx.one("SELECT * FROM sessions LIMIT 1"), write=False)
    assert row is not None
    return set(row)


CONTROL_NEWEST = schema.CONTROL_MIGRATIONS[-1][0]


def with_next(sql: str) -> list[schema.Migration]:
    """The shipped control migrations plus one more (version CONTROL_NEWEST + 1)."""
    return [*schema.CONTROL_MIGRATIONS, (CONTROL_NEWEST + 1, "test next", sql)]


# --------------------------------------------------------------------------- migrations


def test_migrate_is_idempotent_and_records_versions(backend: Backend) -> None:
    for which in ("control", "usage"):
        db = backend.open(which)
        newest = schema.MIGRATIONS[which][-1][0]
        assert migrate(db, which) == newest
        assert migrate(db, which) == newest
        rows = db.transact(lambda tx: tx.all("SELECT version, name, applied_at FROM schema_migrations ORDER BY version"))
        assert [(r["version"], r["name"]) for r in rows] == [(m[0], m[1]) for m in schema.MIGRATIONS[which]]
        assert all(r["applied_at"] > 0 for r in rows)
    control = backend.open("control", migrated="control")
    # the v1 seed rows were not inserted twice (SQLite's v2 drops the two log counters: seq is the rowid there)
    assert count(control, "SELECT COUNT(*) FROM counters") == (1 if backend.kind == "sqlite" else 3)


def test_schema_newer_than_code_raises_migration_failed_and_leaves_the_database_unchanged(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    db.transact(lambda tx: new_chat(tx))
    db.transact(lambda tx: tx.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'from the future', 0)"))
    before_rows = db.transact(lambda tx: tx.all("SELECT * FROM schema_migrations ORDER BY version"))
    backend.close_all()
    if backend.kind == "sqlite":
        path = backend.path("control")
        before = sha256(path)
        files_before = sorted(os.listdir(path.parent))

    again = backend.open("control")
    with pytest.raises(MigrationFailed, match="newer"):
        migrate(again, "control")
    backend.close_all()

    if backend.kind == "sqlite":
        assert sha256(path) == before
        assert sorted(os.listdir(path.parent)) == files_before  # no backup, no stray files
    reopened = backend.open("control")
    assert reopened.transact(lambda tx: tx.all("SELECT * FROM schema_migrations ORDER BY version")) == before_rows
    assert count(reopened, "SELECT COUNT(*) FROM work_items") == 1


def test_broken_migration_raises_migration_failed_and_keeps_the_data(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = backend.open("control", migrated="control")
    session, work = db.transact(lambda tx: new_chat(tx, "keep me"))
    backend.close_all()
    # the first statement works, the second fails: the whole migration must roll back
    monkeypatch.setitem(schema.MIGRATIONS, "control", with_next(
        "ALTER TABLE sessions ADD COLUMN half_applied TEXT;\nINSERT INTO no_such_table (x) VALUES (1)"))

    db = backend.open("control")
    with pytest.raises(MigrationFailed):
        migrate(db, "control")

    assert versions(db) == list(range(1, CONTROL_NEWEST + 1))
    assert "half_applied" not in session_columns(db)
    kept = db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)
    assert kept["input"] == c.dumps({"text": "keep me"})
    assert db.transact(lambda tx: c.get_session(tx, session["session_id"]), write=False)["title"] == "chat"


def test_sqlite_migration_writes_a_backup_beside_the_database_before_migrating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "control.db"
    db = Database(f"sqlite:///{path}")
    migrate(db, "control")
    session, _ = db.transact(lambda tx: new_chat(tx))
    db.close()
    monkeypatch.setitem(schema.MIGRATIONS, "control", with_next("ALTER TABLE sessions ADD COLUMN v2_column TEXT"))

    db = Database(f"sqlite:///{path}")
    try:
        assert migrate(db, "control") == CONTROL_NEWEST + 1
        assert "v2_column" in session_columns(db)
    finally:
        db.close()

    backups = glob.glob(f"{path}.v{CONTROL_NEWEST}.*.bak")
    assert len(backups) == 1, os.listdir(tmp_path)
    # the backup is the database as it was before the migration ran
    conn = sqlite3.connect(backups[0])
    try:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations")] == list(range(1, CONTROL_NEWEST + 1))
        cols = [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
        assert "v2_column" not in cols
        assert conn.execute("SELECT title FROM sessions WHERE session_id = ?", (session["session_id"],)).fetchone() == (
            "chat",
        )
    finally:
        conn.close()


def test_upgrade_from_v1_keeps_event_and_transcript_seqs_and_new_rows_follow_them(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(schema.MIGRATIONS, "control", schema.CONTROL_MIGRATIONS[:1])
    db = backend.open("control", migrated="control")

    def v1_rows(tx: Tx) -> None:  # as v1 code wrote them: seq from the counter rows
        for seq in (1, 2, 3):
            tx.execute("INSERT INTO events (seq, ts, kind, payload) VALUES (?, 0, 'old', '{}')", (seq,))
        tx.execute("UPDATE counters SET value = 3 WHERE name = 'event_seq'")
        tx.execute("INSERT INTO transcript (item_id, seq, session_id, kind, role, content, created_at)"
                   " VALUES ('itm_old', 7, 'ses_old', 'user', 'user', 'before the upgrade', 0)")
        tx.execute("UPDATE counters SET value = 7 WHERE name = 'transcript_seq'")

    db.transact(v1_rows)
    backend.close_all()
    monkeypatch.undo()

    db = backend.open("control", migrated="control")
    assert versions(db) == list(range(1, CONTROL_NEWEST + 1))
    assert [r["seq"] for r in db.transact(lambda tx: c.events_after(tx, 0, 10), write=False)] == [1, 2, 3]
    assert db.transact(c.last_event_seq, write=False) == 3
    seq = db.transact(lambda tx: c.append_item(tx, "ses_old", ItemKind.USER, "user", "after", item_id="itm_new"))
    assert seq is not None and seq > 7
    assert db.transact(lambda tx: c.append_item(tx, "ses_old", ItemKind.USER, "user", "again", item_id="itm_new")) is None
    items = db.transact(lambda tx: c.transcript(tx, "ses_old"), write=False)
    assert [(i.item_id, i.content) for i in items] == [("itm_old", "before the upgrade"), ("itm_new", "after")]
    events = db.transact(lambda tx: c.events_after(tx, 3, 10), write=False)
    assert [e["kind"] for e in events] == ["transcript.item"] and events[0]["seq"] == 4


def test_sqlite_fresh_database_needs_no_backup(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'control.db'}")
    try:
        migrate(db, "control")
    finally:
        db.close()
    assert not glob.glob(str(tmp_path / "*.bak"))


@pytest.mark.parametrize("inline", [False, True])
def test_sqlite_connections_use_wal_full_sync_and_a_busy_timeout(tmp_path: Path, inline: bool) -> None:
    db = Database(f"sqlite:///{tmp_path / 'control.db'}", inline=inline, busy_timeout_ms=4321)
    try:
        pragmas = db.transact(
            lambda tx: {
                name: tx.scalar(f"PRAGMA {name}") for name in ("journal_mode", "synchronous", "busy_timeout")
            },
            write=False,
        )
    finally:
        db.close()
    assert str(pragmas["journal_mode"]).lower() == "wal"
    assert int(pragmas["synchronous"]) == 2  # FULL
    assert int(pragmas["busy_timeout"]) == 4321


def test_a_writer_polls_for_the_write_lock_until_the_busy_timeout_and_gets_it_once_freed(tmp_path: Path) -> None:
    """Our own wait for the write lock (``Database._begin_immediate``, short polls instead of SQLite's
    backoff; the latency it buys is measured by bench/long_session.py, not here) keeps SQLite's
    contract: it fails with "database is locked" only after the busy timeout and commits once the lock is
    freed. The WAL write connection stays at ``busy_timeout=0`` (no PRAGMA per transaction): nothing
    inside a transaction that holds the write lock waits (a reader holding an old snapshot across more
    commits than the automatic checkpoint's threshold fails no write), and an inline read on that
    connection still waits as readers do. A rollback-journal connection keeps its busy timeout."""
    path = tmp_path / "control.db"
    db = Database(f"sqlite:///{path}", inline=True, busy_timeout_ms=300)
    db.transact(lambda tx: tx.execute("CREATE TABLE t (v INTEGER)"))
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            db.transact(lambda tx: tx.execute("INSERT INTO t VALUES (1)"))
        assert time.monotonic() - started >= 0.3
        db.busy_timeout_ms = 20000
        release = threading.Timer(0.2, lambda: holder.execute("COMMIT"))
        released_after = time.monotonic() + 0.2  # the timer cannot fire before this (taken before it starts)
        release.start()
        inside = db.transact(lambda tx: (tx.execute("INSERT INTO t VALUES (2)"), tx.scalar("PRAGMA busy_timeout"))[1])
        release.join()
        assert time.monotonic() >= released_after and int(inside) == 0
        assert db.transact(lambda tx: tx.scalar("PRAGMA busy_timeout"), write=False) == 20000
        assert db.transact(lambda tx: tx.scalar("PRAGMA busy_timeout")) == 0
        assert [r["v"] for r in db.transact(lambda tx: tx.all("SELECT v FROM t"), write=False)] == [2]
        holder.execute("BEGIN")
        assert holder.execute("SELECT count(*) FROM t").fetchone()[0] == 1  # an old snapshot, held open
        for n in range(1200):  # > wal_autocheckpoint's 1000 pages: checkpoints run past the reader
            db.transact(lambda tx, n=n: tx.execute("INSERT INTO t VALUES (?)", (n + 10,)))
        assert holder.execute("SELECT count(*) FROM t").fetchone()[0] == 1
        holder.execute("COMMIT")
        assert db.transact(lambda tx: tx.scalar("SELECT count(*) FROM t"), write=False) == 1201
    finally:
        holder.close()
        db.close()
    journal = sqlite3.connect(tmp_path / "rollback.db", isolation_level=None, timeout=5)
    try:
        journal.execute("PRAGMA journal_mode=DELETE")
        assert Database._polls_for_lock(journal) is False
        assert journal.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    finally:
        journal.close()


# --------------------------------------------------------------------------- events


def test_new_ids_are_time_ordered_and_unique() -> None:
    """Issue 14: ids made later sort later (rows append to their primary-key B-trees instead of dirtying
    a random page of a large table per insert), and a burst within one millisecond stays unique."""
    first = c.new_id("eff")
    time.sleep(0.002)  # the next millisecond: ordering is by time, then by random bits
    burst = [c.new_id("eff") for _ in range(20000)]
    assert all(first < later for later in burst)
    assert len(set(burst)) == len(burst)
    assert all(len(i) == len(first) and i.startswith("eff_") for i in burst)


def test_a_step_reads_only_the_open_calls_of_its_turn_through_a_partial_index(backend: Backend) -> None:
    """Issue 14: the next step of a turn with many settled calls reads its planned and dispatched calls
    only, in order, and (SQLite) through the partial index ``effects_open``, not the whole turn. Settling
    leaves a call listed (its commit moves no index entry); a step's tidy read unlists the settled calls
    once ``UNLIST_AFTER`` are listed, so a step reads at most that many settled calls."""
    from jupyter_goals.store.effects import UNLIST_AFTER

    db = backend.open("control", migrated="control")

    def plan(tx: Tx) -> None:
        _, work = new_chat(tx)
        for n in range(300):
            c.plan_call(tx, work, "turn-1", f"call-{n}", "read_file", {"path": f"{n}.txt"}, capability="read_only",
                        impl_identity="x", impl_digest="d", seq=n)
        for eff in tx.all("SELECT * FROM effects WHERE seq < 297"):
            c.set_effect_state(tx, eff, EffectState.COMMITTED, "ok")
        c.mark_dispatched(tx, tx.one("SELECT * FROM effects WHERE seq = 297") or {}, "att-1")
        c.plan_call(tx, work, "turn-2", "other", "read_file", {}, capability="read_only", impl_identity="x",
                    impl_digest="d", seq=400)

    db.transact(plan)
    got = db.transact(lambda tx: c.open_effects_of_turn(tx, "turn-1"), write=False)
    assert [(e["call_id"], e["state"]) for e in got] == [("call-297", "dispatched"), ("call-298", "planned"),
                                                        ("call-299", "planned")]
    assert got[1]["arguments"] == {"path": "298.txt"}

    def listed(tx: Tx) -> list[str]:
        return [r["call_id"] for r in tx.all(c.OPEN_EFFECTS_SQL, ("turn-1",))]

    assert len(db.transact(listed, write=False)) == 300  # settling moved no index entry
    tidied = db.transact(lambda tx: c.open_effects_of_turn(tx, "turn-1", tidy=True))
    assert tidied == got
    assert db.transact(listed, write=False) == ["call-297", "call-298", "call-299"]
    # below the batch size a tidy read leaves settled calls listed (no write per step)
    db.transact(lambda tx: c.set_effect_state(tx, tx.one("SELECT * FROM effects WHERE call_id = 'call-297'") or {},
                                              EffectState.COMMITTED, "ok"))
    assert [e["call_id"] for e in db.transact(lambda tx: c.open_effects_of_turn(tx, "turn-1", tidy=True))] == [
        "call-298", "call-299"]
    assert len(db.transact(listed, write=False)) == 3 and UNLIST_AFTER > 1
    if backend.kind == "sqlite":
        plan_rows = db.transact(lambda tx: tx.all("EXPLAIN QUERY PLAN " + c.OPEN_EFFECTS_SQL, ("turn-1",)), write=False)
        assert any("effects_open" in str(r.get("detail")) for r in plan_rows), plan_rows
        # the admission pass's unknown-outcome set reads the partial index of unknown outcomes, not every call
        plan_rows = db.transact(lambda tx: tx.all("EXPLAIN QUERY PLAN " + c.UNKNOWN_EFFECTS_SQL, ("w", "w", "w")),
                                write=False)
        details = [str(r.get("detail")) for r in plan_rows]
        assert any(d.endswith("effects USING INDEX effects_unknown") for d in details), details
        assert not any(d in ("SCAN effects", "SCAN jobs") for d in details), details
        # whether a turn's last answer asked for tools, and the stop sweep over running commands
        assert db.transact(lambda tx: (c.response_has_calls(tx, "r1"), c.tools_to_cancel(tx)), write=False) == (False, [])
        conn = sqlite3.connect(db.path or "")
        plans = {q: [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q, ("r1",) if "?" in q else ())]
                 for q in (c.RESPONSE_CALLS_SQL, c.TOOLS_TO_CANCEL_SQL)}
        assert any("transcript_response" in d for d in plans[c.RESPONSE_CALLS_SQL]), plans
        assert any("effects_open" in d for d in plans[c.TOOLS_TO_CANCEL_SQL]), plans
        conn.close()


def test_event_seq_is_strictly_increasing_and_committed_with_its_change(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    seqs = [db.transact(lambda tx, i=i: c.emit(tx, "test.ping", {"i": i})) for i in range(5)]
    assert all(b > a for a, b in zip(seqs, seqs[1:], strict=False))

    def change_then_fail(tx: Tx) -> None:
        c.create_session(tx, "lost", "/tmp", "scripted:none.json", PERMS)  # emits session.created
        c.emit(tx, "test.lost", {})
        raise RuntimeError("crash after emit")

    with pytest.raises(RuntimeError):
        db.transact(change_then_fail)

    events = db.transact(lambda tx: c.events_after(tx, 0, 100), write=False)
    assert [e["seq"] for e in events] == seqs
    assert not [e for e in events if e["kind"] in ("test.lost", "session.created")]
    assert count(db, "SELECT COUNT(*) FROM sessions") == 0
    assert db.transact(c.last_event_seq, write=False) == seqs[-1]
    # the rolled-back seq is not burnt: the next event follows the last committed one
    assert db.transact(lambda tx: c.emit(tx, "test.ping", {})) == seqs[-1] + 1


def test_concurrent_writers_get_unique_gapless_event_seqs(backend: Backend) -> None:
    backend.open("control", migrated="control")
    writers = [backend.open("control") for _ in range(4)]
    errors: list[BaseException] = []

    def write(db: Database) -> None:
        try:
            for _ in range(20):
                db.transact(lambda tx: c.emit(tx, "test.concurrent", {}))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(db,)) for db in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    seqs = [e["seq"] for e in writers[0].transact(lambda tx: c.events_after(tx, 0, 1000), write=False)]
    assert seqs == list(range(1, 81))


# --------------------------------------------------------------------------- fencing


def test_write_fenced_with_a_dead_generation_raises_and_changes_nothing(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def start_attempt(tx: Tx) -> tuple[dict[str, Any], int, dict[str, Any]]:
        session, work = new_chat(tx)
        generation = c.register_worker(tx, "wkr_one", "host-a", "boot-1", 4242, None, 10.0)
        c.admit(tx, work, mode="fresh", turn_id=None)
        attempt = c.claim_attempt(tx, "wkr_one", generation)
        assert attempt is not None
        return session, generation, attempt

    session, generation, attempt = db.transact(start_attempt)
    assert generation == 1

    def fenced_write(tx: Tx, text: str) -> None:
        c.fence(tx, attempt["attempt_id"], 1)
        c.append_item(tx, session["session_id"], c.ItemKind.ASSISTANT, "assistant", text,
                      work_id=attempt["work_id"], turn_id=attempt["turn_id"])

    db.transact(lambda tx: fenced_write(tx, "written while the owner lives"))
    dead = db.transact(lambda tx: c.mark_worker_dead(
        tx, tx.one("SELECT * FROM workers WHERE worker_id = 'wkr_one'"), "process gone"))
    assert [a["attempt_id"] for a in dead] == [attempt["attempt_id"]]
    # a newer worker registers; generation 1 stays fenced
    assert db.transact(lambda tx: c.register_worker(tx, "wkr_two", "host-a", "boot-1", 4343, None, 10.0)) == 2

    def state(tx: Tx) -> dict[str, Any]:
        return {
            "transcript": [i.model_dump() for i in c.transcript(tx, session["session_id"])],
            "attempt": tx.one("SELECT * FROM attempts WHERE attempt_id = ?", (attempt["attempt_id"],)),
            "work": c.get_work(tx, attempt["work_id"]),
            "event_seq": c.last_event_seq(tx),
        }

    before = db.transact(state, write=False)
    assert before["attempt"]["state"] == "dead"
    with pytest.raises(FencedError):
        db.transact(lambda tx: fenced_write(tx, "written by a zombie"))
    assert db.transact(state, write=False) == before
    assert "written by a zombie" not in [i["content"] for i in before["transcript"]]
    # the worker's per-call fence (with the work's run state, one statement) refuses it too
    with pytest.raises(FencedError):
        db.transact(lambda tx: c.fence_with_run_state(tx, attempt["attempt_id"], 1))


def test_the_per_call_fence_answers_the_work_run_state_of_a_live_attempt(backend: Backend) -> None:
    """What a worker reads before each tool call (``fence_with_run_state``): the fence, plus whether the
    work still wants to run at the control version it was admitted under and its permission scope."""
    db = backend.open("control", migrated="control")
    traced = Database(backend.url("control"))  # opened first the way tests that trace statements open it
    try:
        assert traced._ensure() is not None and traced.transact(lambda tx: tx.scalar("SELECT 1 AS one")) == 1
    finally:
        traced.close()

    def start_attempt(tx: Tx) -> dict[str, Any]:
        _, work = new_chat(tx)
        generation = c.register_worker(tx, "wkr_one", "host-a", "boot-1", 4242, None, 10.0)
        c.admit(tx, work, mode="fresh", turn_id=None)
        attempt = c.claim_attempt(tx, "wkr_one", generation)
        assert attempt is not None
        return attempt

    attempt = db.transact(start_attempt)
    run = db.transact(lambda tx: c.fence_with_run_state(tx, attempt["attempt_id"], 1))
    work = db.transact(lambda tx: c.get_work(tx, attempt["work_id"]), write=False)
    assert run == {k: work[k] for k in ("desired_state", "control_version", "permission_scope")}
    assert run["desired_state"] == "run" and int(run["control_version"]) == int(attempt["control_version"])
    with pytest.raises(FencedError):  # another generation of the same worker id
        db.transact(lambda tx: c.fence_with_run_state(tx, attempt["attempt_id"], 2))


# --------------------------------------------------------------------------- admission and input


def test_continuation_key_is_sha256_of_work_control_version_and_commit_point() -> None:
    assert c.continuation_key("wrk_1", 3, 7) == hashlib.sha256(b"wrk_1|3|7").hexdigest()
    assert c.continuation_key("wrk_1", 4, 7) != c.continuation_key("wrk_1", 3, 7)


def test_each_ended_attempt_moves_the_checkpoint_so_the_next_admission_gets_a_new_key(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    attempt = db.transact(lambda tx: c.admit(tx, new_chat(tx)[1], mode="fresh", turn_id=None))
    gen = db.transact(lambda tx: c.register_worker(tx, "wkr_1", "host-a", "boot", 1, None, 60.0))
    claimed = db.transact(lambda tx: c.claim_attempt(tx, "wkr_1", gen))
    assert claimed is not None
    db.transact(lambda tx: c.end_attempt(tx, claimed, "awaiting_approval"))
    db.transact(lambda tx: c.end_attempt(tx, claimed, "awaiting_approval"))  # a repeat moves nothing
    work = db.transact(lambda tx: c.get_work(tx, attempt["work_id"]), write=False)
    assert work["commit_point"] == 1
    again = db.transact(lambda tx: c.admit(tx, c.get_work(tx, attempt["work_id"]), mode="resume",
                                           turn_id=attempt["turn_id"]))
    assert again["continuation_key"] == c.continuation_key(work["work_id"], int(work["control_version"]), 1)
    assert again["continuation_key"] != attempt["continuation_key"]


def test_pausing_releases_an_admitted_attempt_no_worker_claimed_yet(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    attempt = db.transact(lambda tx: c.admit(tx, new_chat(tx)[1], mode="fresh", turn_id=None))
    assert db.transact(c.live_attempts, write=False) == 1
    db.transact(lambda tx: c.apply_control(tx, c.get_work(tx, attempt["work_id"]), "pause", None))
    assert db.transact(c.live_attempts, write=False) == 0  # the quota slot is free at once
    row = db.transact(lambda tx: tx.one("SELECT state, end_reason FROM attempts WHERE attempt_id = ?",
                                        (attempt["attempt_id"],)), write=False)
    assert row == {"state": "ended", "end_reason": "control"}
    gen = db.transact(lambda tx: c.register_worker(tx, "wkr_1", "host-a", "boot", 1, None, 60.0))
    assert db.transact(lambda tx: c.claim_attempt(tx, "wkr_1", gen)) is None


def test_the_same_continuation_cannot_be_admitted_twice(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def first(tx: Tx) -> dict[str, Any]:
        _, work = new_chat(tx)
        return c.admit(tx, work, mode="fresh", turn_id=None)

    attempt = db.transact(first)
    with pytest.raises(VersionConflict):
        db.transact(lambda tx: c.admit(tx, c.get_work(tx, attempt["work_id"]), mode="fresh",
                                       turn_id=attempt["turn_id"]))
    assert count(db, "SELECT COUNT(*) FROM attempts") == 1

    # the database itself refuses a duplicate key, whatever code path tries it
    def raw_duplicate(tx: Tx) -> None:
        tx.execute(
            "INSERT INTO attempts (attempt_id, turn_id, work_id, session_id, state, mode, control_version,"
            " continuation_key, admitted_at) VALUES ('att_dup', ?, ?, ?, 'admitted', 'fresh', 1, ?, 0)",
            (attempt["turn_id"], attempt["work_id"], attempt["session_id"], attempt["continuation_key"]),
        )

    with pytest.raises(Exception) as info:
        db.transact(raw_duplicate)
    assert db.is_integrity_error(info.value)
    assert count(db, "SELECT COUNT(*) FROM attempts") == 1


def test_repeated_client_request_id_returns_the_first_message_and_no_second_work_item(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def post_twice(tx: Tx) -> tuple[Any, ...]:
        session = c.create_session(tx, "chat", "/tmp", "scripted:none.json", PERMS)
        first, created1 = c.accept_message(tx, session, "hi", "req-7", "queue", auto_recover=True, host="h")
        return session, first, created1

    session, first, created1 = db.transact(post_twice)
    seq_after_first = db.transact(c.last_event_seq, write=False)
    second, created2 = db.transact(lambda tx: c.accept_message(
        tx, c.get_session(tx, session["session_id"]), "hi again", "req-7", "queue", auto_recover=True, host="h"))

    assert (created1, created2) == (True, False)
    assert (second["message_id"], second["work_id"]) == (first["message_id"], first["work_id"])
    assert second["text"] == "hi"
    assert count(db, "SELECT COUNT(*) FROM work_items") == 1
    assert count(db, "SELECT COUNT(*) FROM messages") == 1
    assert db.transact(c.last_event_seq, write=False) == seq_after_first  # the repeat wrote nothing


@pytest.mark.parametrize("control", ["pause", "stop"])
def test_attempt_admitted_before_a_pause_or_stop_never_shows_the_work_as_working(backend: Backend, control: str) -> None:
    db = backend.open("control", migrated="control")

    def admit_then_control(tx: Tx) -> dict[str, Any]:
        _, work = new_chat(tx)
        c.admit(tx, work, mode="fresh", turn_id=None)
        c.apply_control(tx, c.get_work(tx, work["work_id"]), control, None)
        if control == "stop":
            c.finish_cancelled(tx, c.get_work(tx, work["work_id"]))  # the Coordinator's decision
        return c.get_work(tx, work["work_id"])

    work = db.transact(admit_then_control)
    before = (work["phase"], work["reason_code"])
    assert before == (("paused", "user_paused") if control == "pause" else ("cancelled", "user_stopped"))

    def claim(tx: Tx) -> dict[str, Any] | None:
        generation = c.register_worker(tx, "wkr_late", "host-a", "boot-1", 4242, None, 10.0)
        return c.claim_attempt(tx, "wkr_late", generation)

    assert db.transact(claim) is None  # the control released the unclaimed attempt: nothing left to claim
    after = db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)
    assert (after["phase"], after["reason_code"]) == before


# --------------------------------------------------------------------------- outbox


async def test_receipt_whose_acknowledgement_was_lost_is_retried_and_counted_once(backend: Backend) -> None:
    control = backend.open("control", migrated="control")
    usage = backend.open("usage", migrated="usage")
    receipt = {"request_id": "req_1", "session_id": "ses_1", "work_id": "wrk_1",
               "usage": {"input_tokens": 10, "output_tokens": 5}}
    control.transact(lambda tx: c.enqueue_outbox(tx, "receipt:req_1", "usage.receipt", receipt))

    dispatcher = OutboxDispatcher(control, usage)
    acks: list[str] = []

    def lose_first_ack(key: str) -> None:
        acks.append(key)
        if len(acks) == 1:
            raise ConnectionError("acknowledgement lost after the usage commit")

    dispatcher.after_usage_commit = lose_first_ack
    t0 = time.time()
    assert await dispatcher.dispatch_due() == 0

    def outbox_row() -> dict[str, Any]:
        row = control.transact(lambda tx: tx.one("SELECT * FROM outbox WHERE op_key = 'receipt:req_1'"), write=False)
        assert row is not None
        return row

    row = outbox_row()
    assert (row["state"], row["attempts"]) == ("pending", 1)
    assert row["next_attempt_at"] > t0  # a durable backoff, not an immediate hot loop
    assert "acknowledgement lost" in row["last_error"]
    assert usage.transact(lambda tx: u.count_receipts(tx, "req_1"), write=False) == 1  # it was applied

    control.transact(lambda tx: tx.execute("UPDATE outbox SET next_attempt_at = 0 WHERE op_key = 'receipt:req_1'"))
    assert await dispatcher.dispatch_due() == 1
    assert await dispatcher.dispatch_due() == 0

    assert acks == ["receipt:req_1", "receipt:req_1"]
    assert usage.transact(lambda tx: u.count_receipts(tx, "req_1"), write=False) == 1
    totals = usage.transact(lambda tx: u.summary(tx, session_id="ses_1"), write=False)
    assert totals["known_tokens"] == {"input": 10, "output": 5, "cached": 0}
    assert outbox_row()["state"] == "done"
    assert control.transact(c.pending_outbox_count, write=False) == 0


def test_a_closed_database_refuses_work_instead_of_reopening(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'control.db'}")
    migrate(db, "control")
    db.close()
    with pytest.raises(StorageUnavailable, match="closed"):
        db.transact(c.last_event_seq, write=False)
    assert db._writer.conn is None and db._reader.conn is None  # nothing was reopened


def test_backups_of_the_same_second_get_distinct_names(tmp_path: Path) -> None:
    path = tmp_path / "control.db"
    db = Database(f"sqlite:///{path}")
    migrate(db, "control")
    db.close()
    names = {schema.backup_sqlite(str(path), CONTROL_NEWEST) for _ in range(3)}
    assert len(names) == 3 and all(n and os.path.exists(n) for n in names)


def test_input_sent_during_recovery_joins_the_recovered_work_ahead_of_its_continuation(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    session, work = db.transact(new_chat)
    db.transact(lambda tx: c.admit(tx, work, mode="fresh", turn_id=None))
    gen = db.transact(lambda tx: c.register_worker(tx, "wkr_1", "host-a", "boot", 1, None, 60.0))
    assert db.transact(lambda tx: c.claim_attempt(tx, "wkr_1", gen)) is not None
    # while the turn runs, a queued message waits for its own turn
    queued, _ = db.transact(lambda tx: c.accept_message(tx, session, "later", "req-2", "queue", auto_recover=True,
                                                        host="host-a"))
    assert queued["work_id"] != work["work_id"] and queued["delivery"] == "queue"
    # the worker dies: until an attempt takes over, new input is read first by the recovered turn
    db.transact(lambda tx: c.mark_worker_dead(tx, tx.one("SELECT * FROM workers WHERE worker_id = 'wkr_1'"), "killed"))
    joined, _ = db.transact(lambda tx: c.accept_message(tx, session, "stop, do X", "req-3", "queue", auto_recover=True,
                                                        host="host-a"))
    assert (joined["work_id"], joined["delivery"], joined["consumed"]) == (work["work_id"], "steer", 0)
    assert [m["text"] for m in db.transact(lambda tx: c.pending_steer(tx, work["work_id"]))] == ["stop, do X"]
