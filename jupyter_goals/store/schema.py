"""Versioned schema migrations for control.db and usage.db.

Each migration is portable SQL (SQLite and PostgreSQL): ``BIGINT``, ``DOUBLE PRECISION`` and
``TEXT`` only; JSON is stored as TEXT. Applied versions are recorded in ``schema_migrations``.
A schema newer than the code, or a migration that fails, raises ``MigrationFailed`` and leaves the
database as it was (the migration runs in one transaction; SQLite files are backed up first). One
that finds no space left (for its backup or its rewrite) says how much to free, and gives back the
space it took (its backup, the WAL's rolled-back frames): ``MigrationFailed.code`` ``storage_full``.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time

from jupyter_goals.store.db import Database, MigrationFailed, StorageUnavailable, Tx, storage_code

Migration = tuple[int, str, "str | dict[str, str]"]  # SQL, or SQL per dialect

CONTROL_MIGRATIONS: list[Migration] = [
    (
        1,
        "initial control schema",
        """
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO counters (name, value) VALUES ('event_seq', 0);
INSERT INTO counters (name, value) VALUES ('worker_generation', 0);
INSERT INTO counters (name, value) VALUES ('transcript_seq', 0);
CREATE TABLE events (
  seq BIGINT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, session_id TEXT, work_id TEXT,
  kind TEXT NOT NULL, payload TEXT NOT NULL);
CREATE TABLE sessions (
  session_id TEXT PRIMARY KEY, title TEXT NOT NULL, cwd TEXT NOT NULL, model TEXT NOT NULL,
  permissions TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
  last_admitted_at DOUBLE PRECISION NOT NULL DEFAULT 0);
CREATE TABLE work_items (
  work_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, kind TEXT NOT NULL, parent_work_id TEXT,
  input TEXT NOT NULL, input_consumed BIGINT NOT NULL DEFAULT 0,
  desired_state TEXT NOT NULL, control_version BIGINT NOT NULL, phase TEXT NOT NULL,
  reason_code TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '',
  permission_scope TEXT NOT NULL, objective_revision BIGINT NOT NULL DEFAULT 0,
  host_name TEXT NOT NULL, auto_recover BIGINT NOT NULL DEFAULT 1,
  commit_point BIGINT NOT NULL DEFAULT 0, recovery_attempts BIGINT NOT NULL DEFAULT 0,
  next_attempt_at DOUBLE PRECISION NOT NULL DEFAULT 0,
  created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION);
CREATE INDEX work_items_phase ON work_items (phase, session_id);
CREATE TABLE messages (
  message_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, client_request_id TEXT NOT NULL,
  work_id TEXT NOT NULL, text TEXT NOT NULL, delivery TEXT NOT NULL, consumed BIGINT NOT NULL DEFAULT 0,
  created_at DOUBLE PRECISION NOT NULL, UNIQUE (session_id, client_request_id));
CREATE TABLE transcript (
  item_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, session_id TEXT NOT NULL, work_id TEXT, turn_id TEXT,
  kind TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', call_id TEXT,
  provider_call_id TEXT, response_id TEXT, tool TEXT, arguments TEXT, state TEXT, meta TEXT NOT NULL DEFAULT '{}',
  created_at DOUBLE PRECISION NOT NULL);
CREATE INDEX transcript_session_seq ON transcript (session_id, seq);
CREATE TABLE turns (
  turn_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, session_id TEXT NOT NULL, state TEXT NOT NULL,
  restricted BIGINT NOT NULL DEFAULT 0, started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION,
  end_reason TEXT);
CREATE INDEX turns_work ON turns (work_id, state);
CREATE TABLE attempts (
  attempt_id TEXT PRIMARY KEY, turn_id TEXT NOT NULL, work_id TEXT NOT NULL, session_id TEXT NOT NULL,
  state TEXT NOT NULL, mode TEXT NOT NULL, control_version BIGINT NOT NULL,
  continuation_key TEXT NOT NULL UNIQUE, worker_id TEXT, generation BIGINT,
  heartbeat_at DOUBLE PRECISION, admitted_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION,
  ended_at DOUBLE PRECISION, end_reason TEXT);
CREATE INDEX attempts_state ON attempts (state);
CREATE INDEX attempts_work ON attempts (work_id);
CREATE TABLE workers (
  worker_id TEXT PRIMARY KEY, generation BIGINT NOT NULL UNIQUE, host_name TEXT NOT NULL,
  boot_id TEXT NOT NULL, pid BIGINT NOT NULL, start_time BIGINT, state TEXT NOT NULL,
  registered_at DOUBLE PRECISION NOT NULL, heartbeat_at DOUBLE PRECISION NOT NULL,
  lease_expires_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, end_reason TEXT);
CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY, call_id TEXT NOT NULL UNIQUE, work_id TEXT NOT NULL, turn_id TEXT NOT NULL,
  session_id TEXT NOT NULL, attempt_id TEXT, tool TEXT NOT NULL, arguments TEXT NOT NULL,
  capability TEXT NOT NULL, impl_identity TEXT NOT NULL, impl_digest TEXT NOT NULL, state TEXT NOT NULL,
  result TEXT, process TEXT, created_at DOUBLE PRECISION NOT NULL, dispatched_at DOUBLE PRECISION,
  ended_at DOUBLE PRECISION, seq BIGINT NOT NULL);
CREATE INDEX effects_turn ON effects (turn_id, state);
CREATE TABLE approvals (
  approval_id TEXT PRIMARY KEY, call_id TEXT NOT NULL, work_id TEXT NOT NULL, session_id TEXT NOT NULL,
  tool TEXT NOT NULL, arguments TEXT NOT NULL, arguments_digest TEXT NOT NULL, capability TEXT NOT NULL,
  control_version BIGINT NOT NULL, unknown_set_digest TEXT NOT NULL DEFAULT '', unknown_set TEXT NOT NULL DEFAULT '[]',
  state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', created_at DOUBLE PRECISION NOT NULL,
  decided_at DOUBLE PRECISION, consumed_by_attempt TEXT);
CREATE INDEX approvals_state ON approvals (state);
CREATE TABLE recovery_decisions (
  decision_key TEXT PRIMARY KEY, work_id TEXT NOT NULL, claimed_by TEXT NOT NULL, state TEXT NOT NULL,
  mode TEXT, phase TEXT, reason_code TEXT, detail TEXT NOT NULL DEFAULT '{}', control_version BIGINT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL);
CREATE TABLE outbox (
  op_key TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL,
  attempts BIGINT NOT NULL DEFAULT 0, next_attempt_at DOUBLE PRECISION NOT NULL, last_error TEXT,
  created_at DOUBLE PRECISION NOT NULL, done_at DOUBLE PRECISION);
CREATE INDEX outbox_due ON outbox (state, next_attempt_at);
CREATE TABLE requests (
  request_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, work_id TEXT NOT NULL, turn_id TEXT NOT NULL,
  attempt_id TEXT NOT NULL, purpose TEXT NOT NULL, model TEXT NOT NULL, goal_id TEXT, goal_revision BIGINT,
  state TEXT NOT NULL, error TEXT, created_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION);
CREATE TABLE server_state (key TEXT PRIMARY KEY, value TEXT NOT NULL)
""",
    ),
    (
        2,
        "append-only logs keyed by rowid on SQLite; effects indexed by turn only; requests by attempt",
        {
            # Each tool call commits twice; every B-tree page a commit touches is one more WAL frame
            # to write and fsync. On SQLite the event and transcript logs take their seq from the
            # rowid (writers are serialized, so it is commit order) instead of a counter row, and
            # the effects index no longer moves when an effect changes state (bench/README.md).
            "sqlite": """
CREATE TABLE events_v2 (
  seq INTEGER PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, session_id TEXT, work_id TEXT,
  kind TEXT NOT NULL, payload TEXT NOT NULL);
INSERT INTO events_v2 (seq, ts, session_id, work_id, kind, payload)
  SELECT seq, ts, session_id, work_id, kind, payload FROM events;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
CREATE TABLE transcript_v2 (
  seq INTEGER PRIMARY KEY, item_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL, work_id TEXT, turn_id TEXT,
  kind TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', call_id TEXT,
  provider_call_id TEXT, response_id TEXT, tool TEXT, arguments TEXT, state TEXT, meta TEXT NOT NULL DEFAULT '{}',
  created_at DOUBLE PRECISION NOT NULL);
INSERT INTO transcript_v2 (seq, item_id, session_id, work_id, turn_id, kind, role, content, call_id,
  provider_call_id, response_id, tool, arguments, state, meta, created_at)
  SELECT seq, item_id, session_id, work_id, turn_id, kind, role, content, call_id,
  provider_call_id, response_id, tool, arguments, state, meta, created_at FROM transcript;
DROP TABLE transcript;
ALTER TABLE transcript_v2 RENAME TO transcript;
CREATE INDEX transcript_session_seq ON transcript (session_id, seq);
DELETE FROM counters WHERE name IN ('event_seq', 'transcript_seq');
DROP INDEX effects_turn;
CREATE INDEX effects_turn ON effects (turn_id);
CREATE INDEX requests_attempt ON requests (attempt_id)
""",
            "postgresql": """
DROP INDEX effects_turn;
CREATE INDEX effects_turn ON effects (turn_id);
CREATE INDEX requests_attempt ON requests (attempt_id)
""",
        },
    ),
    (
        3,
        "goals: objective revisions, todos, acceptance results, terminal history",
        """
CREATE TABLE goals (
  goal_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, work_id TEXT NOT NULL, objective TEXT NOT NULL,
  original_objective TEXT NOT NULL, requirements TEXT NOT NULL, requirements_state TEXT NOT NULL,
  state TEXT NOT NULL, phase TEXT NOT NULL, reason_code TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '',
  revision BIGINT NOT NULL, budget TEXT NOT NULL DEFAULT '{}', result_version BIGINT NOT NULL DEFAULT 0,
  verified_result_version BIGINT NOT NULL DEFAULT 0, verified_todo_version BIGINT NOT NULL DEFAULT 0,
  blocker TEXT NOT NULL DEFAULT '', blocker_count BIGINT NOT NULL DEFAULT 0, turns BIGINT NOT NULL DEFAULT 0,
  created_by TEXT NOT NULL DEFAULT 'user', created_at DOUBLE PRECISION NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION);
CREATE INDEX goals_session ON goals (session_id, created_at);
CREATE INDEX goals_work ON goals (work_id);
CREATE TABLE goal_revisions (
  goal_id TEXT NOT NULL, revision BIGINT NOT NULL, objective TEXT NOT NULL, requirements TEXT NOT NULL,
  budget TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', actor TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (goal_id, revision));
CREATE TABLE todos (
  session_id TEXT PRIMARY KEY, goal_id TEXT, items TEXT NOT NULL, version BIGINT NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL);
CREATE TABLE acceptance_results (
  goal_id TEXT NOT NULL, result_version BIGINT NOT NULL, revision BIGINT NOT NULL, outcome TEXT NOT NULL,
  verdicts TEXT NOT NULL, request_ids TEXT NOT NULL DEFAULT '[]', created_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (goal_id, result_version));
CREATE TABLE goal_history (
  record_id TEXT PRIMARY KEY, goal_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL, state TEXT NOT NULL,
  snapshot TEXT NOT NULL, anchor_seq BIGINT NOT NULL, anchor_item_id TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL);
CREATE INDEX goal_history_session ON goal_history (session_id, anchor_seq)
""",
    ),
    (
        4,
        "hard budgets: per-request reservations and the settled usage each request is charged with",
        """
ALTER TABLE requests ADD COLUMN reserved_usd DOUBLE PRECISION;
ALTER TABLE requests ADD COLUMN reserved_tokens BIGINT;
ALTER TABLE requests ADD COLUMN reservation_expires_at DOUBLE PRECISION;
ALTER TABLE requests ADD COLUMN usage_known BIGINT;
ALTER TABLE requests ADD COLUMN partial BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN tokens BIGINT;
ALTER TABLE requests ADD COLUMN cost_usd DOUBLE PRECISION;
CREATE INDEX requests_goal ON requests (goal_id)
""",
    ),
    (
        5,
        "background Jobs, subtask results and durable waits",
        """
ALTER TABLE work_items ADD COLUMN goal_id TEXT;
ALTER TABLE work_items ADD COLUMN goal_revision BIGINT;
ALTER TABLE work_items ADD COLUMN job_id TEXT;
CREATE INDEX work_items_parent ON work_items (parent_work_id);
CREATE TABLE jobs (
  job_id TEXT PRIMARY KEY, work_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL,
  caller_session_id TEXT NOT NULL, caller_work_id TEXT, client_request_id TEXT, goal_id TEXT, goal_revision BIGINT,
  created_at DOUBLE PRECISION NOT NULL, UNIQUE (caller_session_id, client_request_id));
CREATE TABLE work_results (
  work_id TEXT PRIMARY KEY, outcome TEXT NOT NULL, result TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
CREATE TABLE waits (
  wait_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, kind TEXT NOT NULL, handle TEXT NOT NULL, call_id TEXT,
  goal_revision BIGINT NOT NULL, control_version BIGINT NOT NULL, consumption_key TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL, outcome TEXT, result TEXT, deadline_at DOUBLE PRECISION,
  next_check_at DOUBLE PRECISION NOT NULL DEFAULT 0, checks BIGINT NOT NULL DEFAULT 0, last_error TEXT,
  created_at DOUBLE PRECISION NOT NULL, notified_at DOUBLE PRECISION, consumed_at DOUBLE PRECISION);
CREATE INDEX waits_work ON waits (work_id, state);
CREATE INDEX waits_handle ON waits (handle, state)
""",
    ),
    (
        6,
        "notebook sessions: one durable session per notebook path, kept across renames",
        """
CREATE TABLE notebook_sessions (
  path TEXT PRIMARY KEY, session_id TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL);
CREATE INDEX notebook_sessions_session ON notebook_sessions (session_id)
""",
    ),
    (
        7,
        "front door: work and attempts by session (session lists, snapshots), recovery summaries by pass",
        """
CREATE INDEX work_items_session ON work_items (session_id, created_at);
CREATE INDEX attempts_session ON attempts (session_id);
CREATE INDEX recovery_decisions_claimed ON recovery_decisions (claimed_by)
""",
    ),
    (
        8,
        "Stop cancels running tools: a durable cancel request per effect (cancel_tool)",
        """
ALTER TABLE effects ADD COLUMN cancel_requested_at DOUBLE PRECISION
""",
    ),
    (
        9,
        "constant-cost steps and admission: a turn's open tool calls, and unknown outcomes, without reading settled calls",
        """
CREATE INDEX effects_open ON effects (turn_id, seq) WHERE state IN ('planned', 'dispatched');
CREATE INDEX effects_unknown ON effects (work_id) WHERE state = 'unknown';
CREATE INDEX jobs_caller ON jobs (caller_work_id);
CREATE INDEX transcript_response ON transcript (response_id) WHERE response_id IS NOT NULL
""",
    ),
    (
        10,
        "a call's dispatch and settling move no index entry: the open calls' index lists calls until a step tidies it",
        # v9's effects_open was partial on the state, so ``planned`` -> ``dispatched`` deleted and re-inserted
        # its entry and settling deleted it: one more WAL page on each of a tool call's two commits
        # (bench/README.md). ``listed`` is 1 from planning until a later step of the turn unlists
        # settled calls in batches (effects.open_effects_of_turn), so neither commit touches the index.
        """
ALTER TABLE effects ADD COLUMN listed INTEGER DEFAULT 1;
UPDATE effects SET listed = NULL WHERE state NOT IN ('planned', 'dispatched');
DROP INDEX effects_open;
CREATE INDEX effects_open ON effects (turn_id, seq) WHERE listed = 1
""",
    ),
]

USAGE_MIGRATIONS: list[Migration] = [
    (
        1,
        "initial usage schema",
        """
CREATE TABLE receipts (
  receipt_key TEXT PRIMARY KEY, request_id TEXT NOT NULL, session_id TEXT NOT NULL, work_id TEXT,
  turn_id TEXT, goal_id TEXT, goal_revision BIGINT, job_id TEXT, purpose TEXT, provider TEXT, model TEXT,
  usage_known BIGINT NOT NULL, input_tokens BIGINT NOT NULL DEFAULT 0, output_tokens BIGINT NOT NULL DEFAULT 0,
  cached_tokens BIGINT NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL, applied_at DOUBLE PRECISION NOT NULL);
CREATE INDEX receipts_session ON receipts (session_id);
CREATE INDEX receipts_goal ON receipts (goal_id);
CREATE TABLE activity (
  interval_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, work_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
  started_at DOUBLE PRECISION NOT NULL, stopped_at DOUBLE PRECISION, last_heartbeat_at DOUBLE PRECISION NOT NULL,
  stop_known BIGINT NOT NULL DEFAULT 1)
""",
    ),
    (
        2,
        "request ledger with attribution, receipt quotes and lower bounds, versioned prices",
        """
CREATE TABLE requests (
  request_id TEXT PRIMARY KEY, attempt_id TEXT, session_id TEXT NOT NULL, work_id TEXT, turn_id TEXT,
  goal_id TEXT, goal_revision BIGINT, job_id TEXT, reservation_id TEXT, parent_request_id TEXT,
  purpose TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, service_tier TEXT,
  state TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, settled_at DOUBLE PRECISION);
CREATE INDEX requests_session ON requests (session_id);
CREATE INDEX requests_goal ON requests (goal_id);
CREATE INDEX requests_work ON requests (work_id);
CREATE INDEX receipts_work ON receipts (work_id);
ALTER TABLE receipts ADD COLUMN attempt_id TEXT;
ALTER TABLE receipts ADD COLUMN partial BIGINT NOT NULL DEFAULT 0;
ALTER TABLE receipts ADD COLUMN price_version TEXT;
ALTER TABLE receipts ADD COLUMN cost_usd DOUBLE PRECISION;
CREATE TABLE prices (
  price_version TEXT NOT NULL, model TEXT NOT NULL, input_usd_per_mtok DOUBLE PRECISION NOT NULL,
  output_usd_per_mtok DOUBLE PRECISION NOT NULL, cached_input_usd_per_mtok DOUBLE PRECISION,
  loaded_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (price_version, model))
""",
    ),
]

MIGRATIONS = {"control": CONTROL_MIGRATIONS, "usage": USAGE_MIGRATIONS}


def quick_check(tx: Tx) -> list[str]:
    """SQLite's ``PRAGMA quick_check``: ``["ok"]``, or the problems it found (for ``jupyter goals doctor``)."""
    return [str(r["quick_check"]) for r in tx.all("PRAGMA quick_check")]


def created_at(tx: Tx) -> float | None:
    """When this database's first migration was applied; None while it holds no schema. A database
    dropped and created again (or emptied) answers differently from the one a server opened, where
    a connection string cannot tell them apart (the identity of a PostgreSQL ledger)."""
    if current_version(tx) == 0:
        return None
    value = tx.scalar("SELECT applied_at FROM schema_migrations WHERE version = 1")
    return None if value is None else float(value)


def current_version(tx: Tx) -> int:
    if tx.dialect == "sqlite":
        exists = tx.one("SELECT name FROM sqlite_master WHERE type='table' AND name='schema_migrations'")
    else:
        exists = tx.one("SELECT to_regclass('schema_migrations') AS name")
        exists = exists if exists and exists["name"] else None
    if not exists:
        return 0
    return int(tx.scalar("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations") or 0)


def backup_sqlite(path: str, version: int) -> str | None:
    """Copy the database beside itself before a migration (consistent copy via the backup API)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    now = time.time()
    stamp = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{int(now * 1e6) % 1_000_000:06d}Z"
    dest = f"{path}.v{version}.{stamp}.bak"
    n = 1
    while os.path.exists(dest):  # never overwrite an earlier backup
        dest = f"{path}.v{version}.{stamp}-{n}.bak"
        n += 1
    src = sqlite3.connect(path)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            dst.close()
    except BaseException:  # a partial copy (no space left for it) is no backup: it only holds the space
        _remove(dest)
        raise
    finally:
        src.close()
    return dest


def _remove(path: str | None) -> None:
    if path:
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(path + suffix)
            except OSError:
                pass


_RETRIED = "the migration is tried again by itself and nothing recorded is changed until it succeeds."


def file_system_trouble(path: str | None, exc: BaseException) -> str | None:
    """``storage_full`` / ``storage_readonly`` / ``storage_io_error`` when ``exc`` is the file system's
    fault (no space left, mounted read-only, an I/O error the disk reported), else None. Each heals
    without touching the database: free space, remount read-write, a disk that works again."""
    text = str(exc).lower()
    number = getattr(exc, "errno", None)
    if storage_code(text) == "storage_full" or number == errno.ENOSPC:
        return "storage_full"
    if number == errno.EROFS or "read-only file system" in text or (
            path is not None and ("readonly" in text or "unable to open" in text) and _read_only(path)):
        return "storage_readonly"
    if number == errno.EIO or "disk i/o error" in text:
        return "storage_io_error"
    return None


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _file_system_failed(db: Database, which: str, version: int | None, newest: int, step: str, code: str,
                        exc: BaseException) -> MigrationFailed:
    """A migration (or its backup) the file system failed: nothing was changed (SQLite rolled the
    transaction back whole; the file is still ``version``; None: it could not even be read), and it is
    tried again by itself."""
    assert db.path is not None
    if version is None:
        where = f"{which} database {db.path} could not be opened to migrate it to schema v{newest}"
        kept = "Nothing was changed."
    else:
        where = f"{which} database {db.path} could not be migrated from schema v{version} to v{newest}"
        kept = f"Nothing was changed: it is still schema v{version} with every record."
    if code == "storage_full":
        size = os.path.getsize(db.path) if os.path.exists(db.path) else 0
        need_mb = max(1, 2 * size // (1024 * 1024) + 1)
        return MigrationFailed(
            f"{where}: the file system that holds it has no space left {step} ({exc}). {kept} Free about {need_mb} MB "
            "there (a backup copy and the tables the migration rewrites); the migration is tried again by itself.",
            code, f"Free space on the file system that holds {db.path}; {_RETRIED}")
    if code == "storage_readonly":
        return MigrationFailed(
            f"{where}: the file system that holds it is read-only {step} ({exc}). {kept} Remount it read-write; the "
            "migration is tried again by itself.",
            code, f"Remount the file system that holds {db.path} read-write; {_RETRIED}")
    return MigrationFailed(
        f"{where}: the disk reported an I/O error {step} ({exc}). {kept} Check the disk (the kernel log says which "
        "blocks: dmesg); the migration is tried again by itself.",
        code, f"Check the disk that holds {db.path} (the kernel log, dmesg, says more); {_RETRIED}")


def _truncate_wal(path: str) -> None:
    """Give back the space the WAL frames of a rolled-back transaction hold (best effort)."""
    try:
        conn = sqlite3.connect(path, timeout=0.2)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    except sqlite3.Error:
        pass


def _storage_fault(exc: BaseException) -> bool:
    """Lock timeouts, I/O errors and lost connections say nothing about the migration itself."""
    if isinstance(exc, sqlite3.OperationalError):
        msg = str(exc).lower()
        return "locked" in msg or "disk i/o" in msg or "unable to open" in msg
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, psycopg.OperationalError)


def migrate(db: Database, which: str) -> int:
    """Bring ``db`` to the newest schema for ``which`` ('control' | 'usage'); returns the version.

    Runs synchronously (call it from a thread). Raises MigrationFailed, never half-applies.
    """
    migrations = MIGRATIONS[which]
    newest = migrations[-1][0]
    try:
        version = db.transact(current_version, write=False)
    except StorageUnavailable as exc:
        # a WAL database cannot even be read where its -shm file cannot be created (a read-only mount)
        if db.path and file_system_trouble(db.path, exc) == "storage_readonly":
            raise _file_system_failed(db, which, None, newest, "(its files cannot be opened)", "storage_readonly",
                                      exc) from exc
        raise
    if version > newest:
        raise MigrationFailed(f"{which} database schema v{version} is newer than this code (v{newest})")
    if version == newest:
        return version
    backup: str | None = None
    if db.dialect == "sqlite" and version > 0 and db.path:
        try:
            backup = backup_sqlite(db.path, version)
        except (sqlite3.Error, OSError) as exc:
            code = file_system_trouble(db.path, exc)
            if code is not None:
                raise _file_system_failed(db, which, version, newest, "for its backup", code, exc) from exc
            raise

    def apply(tx: Tx) -> int:
        if current_version(tx) == 0:
            tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at DOUBLE PRECISION NOT NULL)"
            )
        v = current_version(tx)
        for number, name, sql in migrations:
            if number <= v:
                continue
            try:
                tx.script(sql if isinstance(sql, str) else sql[tx.dialect])
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (number, name, time.time()),
                )
            except Exception as exc:
                code = file_system_trouble(db.path, exc) if db.path else None
                if code is not None:  # SQLITE_FULL / _READONLY / _IOERR: SQLite rolls the transaction back whole
                    raise _file_system_failed(db, which, version, newest, f"in migration v{number} ({name})", code,
                                              exc) from exc
                if _storage_fault(exc):
                    raise
                # a failing statement is a broken migration, not an unreadable database (db.transact
                # would otherwise report SQLite's OperationalError as storage_unavailable)
                raise MigrationFailed(f"{which} migration v{number} ({name}) failed: {exc}") from exc
        return newest

    try:
        return db.transact(apply)
    except MigrationFailed as exc:
        if exc.action is not None and db.path:
            # the database is as it was: its backup and the WAL's rolled-back frames only hold space
            # (each later try would leave one more backup behind)
            _remove(backup)
            _truncate_wal(db.path)
        raise
    except StorageUnavailable as exc:
        # the failing statement was the COMMIT (an fsync the disk refused): rolled back, as above
        code = file_system_trouble(db.path, exc) if db.path else None
        if code is None:
            raise
        _remove(backup)
        _truncate_wal(db.path or "")
        raise _file_system_failed(db, which, version, newest, "when it committed", code, exc) from exc
    except Exception as exc:
        raise MigrationFailed(f"{which} migration failed: {exc}") from exc
