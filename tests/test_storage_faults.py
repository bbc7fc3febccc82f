"""Storage faults while work runs (issue 16): a disk that fills up mid-command, a database whose
write lock another process holds, usage.db deleted and a page of control.db overwritten with garbage
behind a running server's back. Real servers and workers; for the full disk the state dir is on a real,
small file system (a tmpfs mounted for the test) so that SQLite's commits really fail with "database or
disk is full"."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.identity import process_start_time
from tests.servers import db_rows, full_passes, running_shell, server_env, wait_for
from tests.storekit import postgres_unreachable

pytestmark = pytest.mark.slow

RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"purpose": "work", "last_tool_result_contains": "outcome unknown"},
     "respond": {"text": "finished; its outcome is unknown, so I will not run it again"}},
    {"when": {"purpose": "work", "last_user_contains": "long"},
     "respond": {"tool_calls": [{"name": "shell", "arguments": {
         "command": "while [ ! -e go ]; do sleep 0.05; done; echo ran >> out.txt"}}]}},  # ends when the test says
    {"when": {"purpose": "work", "last_user_contains": "slow"},
     "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 2; echo ran >> out.txt"}}]}},
    {"when": {"purpose": "work"}, "respond": {"text": "hello"}},
]


@pytest.fixture
def small_state_fs(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path / "state"`` on a 64 MB tmpfs of its own (mounting needs root, as CI and these machines
    run; in CI a refused mount fails the test, elsewhere it is skipped with the reason)."""
    state = tmp_path / "state"
    state.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(state)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        reason = f"cannot mount a small tmpfs for the disk-full test: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI"):
            raise RuntimeError(reason)
        pytest.skip(reason)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)


def _run(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        reason = f"{' '.join(args)} failed: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI"):
            raise RuntimeError(reason)
        pytest.skip(reason)
    return done.stdout.strip()


@pytest.fixture
def failing_disk_fs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``tmp_path / "state"`` on a real ext4 file system whose disk fails writes with I/O errors once
    its backing store is full: a loop device over a sparse 256 MB file on a 64 MB tmpfs. Filling the
    tmpfs makes the kernel's writeback to the loop device fail (EIO), which SQLite sees as "disk I/O
    error" when it syncs; emptying it makes the disk work again. All metadata is written when the file
    system is made (no journal, no lazy init), errors do not remount it read-only, and deleted files
    give their blocks back to the tmpfs (``discard``), so only data writes fail, and only while it is full. Yields (state dir, the tmpfs to fill). Needs root and loop devices, as CI and these
    machines have (in CI a refusal fails the test, elsewhere it is skipped with the reason)."""
    backing, state = tmp_path / "backing", tmp_path / "state"
    backing.mkdir()
    state.mkdir()
    _run("mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(backing))
    loop = ""
    try:
        _run("truncate", "-s", "256M", str(backing / "disk.img"))
        loop = _run("losetup", "-f", "--show", str(backing / "disk.img"))
        _run("mkfs.ext4", "-q", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=0", loop)
        _run("mount", "-o", "errors=continue,discard", loop, str(state))
        state.chmod(0o700)
        yield state, backing
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        subprocess.run(["umount", "-l", str(backing)], capture_output=True)


def fill(directory: Path) -> Path:
    """Fill the file system that holds ``directory`` to the last block."""
    filler = directory / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
    subprocess.run(["dd", "if=/dev/zero", f"of={directory / 'filler-tail'}", "bs=4k"], capture_output=True)
    st = os.statvfs(directory)
    assert st.f_bavail * st.f_frsize < 64 * 1024, "the test file system is not full"
    return filler


def goals(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``jupyter goals <args>`` on ``state`` as a user runs it (as in test_cli.py)."""
    jupyter = str(Path(sys.executable).parent / "jupyter")
    return subprocess.run([jupyter, "goals", "--state-dir", str(state), *args], capture_output=True, text=True,
                          timeout=120)


def get(server: Any, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}api/goals/{path}", headers={"Authorization": f"token {server.token}"}, timeout=30)


def post(server: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}api/goals/{path}", headers={"Authorization": f"token {server.token}"},
                      json=body, timeout=30)


def test_a_disk_that_fills_up_mid_command_shows_storage_full_and_the_work_finishes_once_space_is_freed(
    tmp_path: Path, small_state_fs: Path
) -> None:
    """The disk holding control.db fills while a chat's command runs. The worker cannot commit the
    command's end: it exits (crash-only) instead of holding an attempt nobody runs. Meanwhile requests
    that must write get 503 ``storage_full`` with the reason, health says ``storage_full`` with what to
    do, and reads still answer with the whole history. Once space is freed the chat finishes by itself:
    the command ran once (never re-run), nothing recorded before was lost, health is ok again."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="full disk", cwd=str(env["root"]), permissions={"mode": "bypass"})
                  ["session"]["session_id"])
        cl.send(sid, "hi", client_request_id="h")
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        cl.send(sid, "run something slow", client_request_id="s")
        running_shell(env["state"])
        before = [i["item_id"] for i in cl.session(sid)["transcript"]["items"]]
        [running] = db_rows(env["state"], "SELECT worker_id FROM attempts WHERE state = 'running'")
        [worker_pid] = [w["pid"] for w in server.workers() if w["worker_id"] == running["worker_id"]]
        filler = fill(small_state_fs)

        r = post(server, "sessions", {"title": "while full"})
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "storage_full" and "full" in r.json()["message"]
        health = get(server, "health").json()
        assert (health["status"], health["reason_code"]) == ("degraded", "storage_full"), health
        assert health["databases"]["control"]["ok"] is False
        assert "Free space" in health["databases"]["control"]["error"]["action"]
        snap = get(server, f"sessions/{sid}")  # reads go on: the whole history, its state and reason
        assert snap.status_code == 200 and [i["item_id"] for i in snap.json()["transcript"]["items"]][:len(before)] == before
        # the worker could not commit the command's end: it exits rather than hold the attempt forever
        wait_for(lambda: process_start_time(worker_pid) is None, timeout=60, what="the worker giving the attempt up")
        # it said why, in the whole log (the outbox's retries of its own writes scroll the tail)
        assert "the worker exits so that the attempt is recovered" in server.log_path.read_text(errors="replace")

        filler.unlink()
        (small_state_fs / "filler-tail").unlink()
        snap = cl.wait(sid, timeout=120)
        assert snap["work"]["phase"] == "done", snap["work"]
        assert (env["root"] / "out.txt").read_text() == "ran\n"  # once: an unknown outcome is never re-run
        assert [i["item_id"] for i in snap["transcript"]["items"]][:len(before)] == before
        wait_for(lambda: get(server, "health").json()["status"] == "ok", timeout=30, what="health ok again")
        assert post(server, "sessions", {"title": "after"}).status_code == 201


def test_a_write_lock_held_by_another_process_gives_503_storage_locked_and_work_goes_on_after(tmp_path: Path) -> None:
    """Another process holds control.db's write lock longer than the busy timeout (10 s): a request
    that must write answers 503 ``storage_locked`` (it was a 500 before), health names it, reads still
    answer; once the lock is released the same request succeeds and the chat finishes."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="locked", cwd=str(env["root"]))["session"]["session_id"])
        holder = sqlite3.connect(env["state"] / "control.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            r = post(server, f"sessions/{sid}/messages", {"text": "hi", "client_request_id": "m1"})
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "storage_locked" and "locked" in r.json()["message"]
            health = get(server, "health").json()
            assert health["reason_code"] == "storage_locked" and "write lock" in health["databases"]["control"]["error"]["action"]
            assert get(server, f"sessions/{sid}").status_code == 200
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert not db_rows(env["state"], "SELECT 1 FROM messages WHERE session_id = ?", (sid,))  # nothing half-written
        r = post(server, f"sessions/{sid}/messages", {"text": "hi", "client_request_id": "m1"})
        assert r.status_code == 202, r.text
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        assert get(server, "health").json()["status"] == "ok"


USAGE_RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work"}, "respond": {"text": "hi", "usage": {"input_tokens": 7, "output_tokens": 3}}},
]


def ledger_on_disk(state: Path) -> list[tuple[str, str, int, int]]:
    """(receipt_key, session_id, input, output) of every receipt in the usage.db now at its path."""
    path = state / "usage.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [(str(k), str(s), int(i), int(o)) for k, s, i, o in conn.execute(
            "SELECT receipt_key, session_id, input_tokens, output_tokens FROM receipts ORDER BY receipt_key")]
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def test_usage_db_deleted_while_the_server_runs_is_reopened_and_rebuilt_each_receipt_once(tmp_path: Path) -> None:
    """usage.db (with its -wal and -shm) is deleted while the server runs. Its open connections would
    keep writing receipts to the unlinked file, which nobody sees again. The server notices the file
    at the path is gone, says so in health (``usage_db_missing``), opens the ledger again at its path
    and rebuilds it from control.db's outbox: every receipt, the ones before the deletion and the
    chat's after it, is counted exactly once, on disk and in GET /usage; health is ok with the repair
    noted. A restart changes nothing."""
    with server_env(tmp_path, USAGE_RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sids = []
        for n in range(2):
            sid = str(cl.create_session(title=f"before {n}", cwd=str(env["root"]))["session"]["session_id"])
            cl.send(sid, "hello", client_request_id=f"m{n}")
            assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
            sids.append(sid)
        wait_for(lambda: len(ledger_on_disk(env["state"])) == 2, timeout=30, what="two receipts in the ledger")
        assert get(server, "health").json()["databases"]["usage"]["ok"] is True
        for suffix in ("", "-wal", "-shm"):
            (env["state"] / f"usage.db{suffix}").unlink(missing_ok=True)
        health = get(server, "health").json()  # said at once (unless the rebuild was even quicker)
        if "repaired" not in health["databases"]["usage"]:
            assert (health["status"], health["reason_code"]) == ("degraded", "usage_db_missing"), health
            assert "rebuilt from control.db" in health["databases"]["usage"]["error"]["action"], health

        # a chat that makes a model request after the deletion
        sid = str(cl.create_session(title="after", cwd=str(env["root"]))["session"]["session_id"])
        cl.send(sid, "hello", client_request_id="after")
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        sids.append(sid)

        def repaired() -> bool:
            usage = get(server, "health").json()["databases"]["usage"]
            return usage["ok"] is True and "repaired" in usage

        wait_for(repaired, timeout=30, what="health to report the ledger rebuilt")
        health = get(server, "health").json()
        assert health["status"] == "ok", health
        note = health["databases"]["usage"]["repaired"]
        assert note["code"] == "usage_db_missing" and "deleted" in note["message"] and note["operations"] >= 2, note
        assert "was deleted while the server ran" in server.log()

        # every receipt control.db recorded is in the usage.db at the path, exactly once
        receipts = db_rows(env["state"], "SELECT op_key FROM outbox WHERE kind = 'usage.receipt'")
        requests = db_rows(env["state"], "SELECT request_id FROM requests")
        wait_for(lambda: len(ledger_on_disk(env["state"])) >= len(receipts), timeout=30, what="the chat's receipt")
        on_disk = ledger_on_disk(env["state"])
        assert len(receipts) == len(requests) == 3
        assert sorted(k for k, *_ in on_disk) == sorted(r["op_key"] for r in receipts)
        assert sorted(s for _, s, *_ in on_disk) == sorted(sids)
        for sid in sids:
            usage = get(server, f"usage?session_id={sid}").json()
            assert (usage["receipts"], usage["known_tokens"]["input"], usage["known_tokens"]["output"]) == (1, 7, 3), usage
        assert not db_rows(env["state"], "SELECT op_key FROM outbox WHERE state != 'done'")

        server.stop()
        server.start()  # the next start finds the ledger whole: nothing applied again
        assert len(ledger_on_disk(env["state"])) == 3
        assert get(server, "health").json()["status"] == "ok"


PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/test", autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@contextmanager
def pg_database(prefix: str) -> Iterator[tuple[str, str]]:
    """A new database on the real PostgreSQL server (CI fails without one, elsewhere the test is skipped):
    its name and URL; dropped at the end."""
    import uuid

    if reason := postgres_unreachable():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}")
        pytest.skip(reason)
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        yield name, f"{PG_SERVER}/{name}"
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def ledger_in(url: str) -> list[tuple[str, str, int, int]]:
    """(receipt_key, session_id, input, output) of every receipt in a PostgreSQL ledger ([] while it has none)."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            rows = conn.execute("SELECT receipt_key, session_id, input_tokens, output_tokens FROM receipts"
                                " ORDER BY receipt_key").fetchall()
    except psycopg.Error:
        return []
    return [(str(k), str(s), int(i), int(o)) for k, s, i, o in rows]


@pytest.mark.postgres
def test_a_postgresql_ledger_dropped_while_the_server_runs_is_migrated_again_and_rebuilt_each_receipt_once(
    tmp_path: Path,
) -> None:
    """The usage ledger is a PostgreSQL database. While the server runs it is dropped (its connections
    forced closed): chat goes on, health says the ledger cannot be reached and receipts wait in
    control.db's outbox. An operator then creates an empty database of the same name. A connection
    string cannot tell it from the one the server opened; when its schema was created can: the server
    says ``usage_db_missing``, migrates it and rebuilds the ledger from control.db's outbox, so every
    receipt (the two before the drop, the one while it was gone, one after) is counted exactly once.
    A restart adds nothing. (Before: the server kept writing to a database without tables and the
    receipts of the dropped one were gone for good.)"""
    with pg_database("goals_usage") as (name, url):
        with server_env(tmp_path, USAGE_RULES) as env:
            server = env["make"](extra=[f"--GoalsApp.usage_db_url={url}"]).start()
            cl = server.client()
            sids = []

            def chat(title: str) -> None:
                sid = str(cl.create_session(title=title, cwd=str(env["root"]))["session"]["session_id"])
                cl.send(sid, "hello", client_request_id=title)
                assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
                sids.append(sid)

            chat("before 0")
            chat("before 1")
            wait_for(lambda: len(ledger_in(url)) == 2, timeout=30, what="two receipts in the ledger")
            pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)')
            chat("while dropped")  # chat is not blocked by the ledger
            wait_for(lambda: get(server, "health").json()["databases"]["usage"]["ok"] is False, timeout=30,
                     what="health to say the ledger cannot be reached")
            assert get(server, "health").json()["databases"]["usage"]["error"]["code"] == "storage_unavailable"

            pg_admin(f'CREATE DATABASE "{name}"')  # an empty one: the same URL, not the same ledger

            def repaired() -> bool:
                usage = get(server, "health").json()["databases"]["usage"]
                return usage["ok"] is True and "repaired" in usage

            wait_for(repaired, timeout=60, what="health to report the ledger rebuilt")
            note = get(server, "health").json()["databases"]["usage"]["repaired"]
            assert note["code"] == "usage_db_missing" and "created again" in note["message"], note
            assert note["operations"] >= 2, note
            chat("after")

            receipts = db_rows(env["state"], "SELECT op_key FROM outbox WHERE kind = 'usage.receipt'")
            wait_for(lambda: len(ledger_in(url)) >= len(receipts) == 4, timeout=30, what="every receipt")
            ledger = ledger_in(url)
            assert sorted(k for k, *_ in ledger) == sorted(r["op_key"] for r in receipts)
            assert sorted(s for _, s, *_ in ledger) == sorted(sids)
            for sid in sids:
                usage = get(server, f"usage?session_id={sid}").json()
                assert (usage["receipts"], usage["known_tokens"]["input"], usage["known_tokens"]["output"]) == (
                    1, 7, 3), usage
            server.stop()
            server.start()  # the next start finds the ledger whole: nothing applied again
            assert len(ledger_in(url)) == 4 and get(server, "health").json()["status"] == "ok"


def checkpoint(db: Path) -> None:
    """Copy every page in control.db's WAL into the file itself and empty the WAL (retried while a reader
    of the running server holds an older snapshot), so that the file's pages are the ones read."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=0.2)

    def done() -> bool:
        try:
            return bool(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0)
        except sqlite3.OperationalError:  # a writer of the server holds the lock this moment
            return False

    try:
        wait_for(done, timeout=30, what="a full checkpoint of control.db")
    finally:
        conn.close()


def table_pages(db: Path, table: str) -> list[int]:
    """The pages of ``table`` and of its indexes (SQLite's dbstat)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [int(p) for (p,) in conn.execute(
            "SELECT DISTINCT pageno FROM dbstat WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?)",
            (table,))]
    finally:
        conn.close()


def write_pages(db: Path, pages: dict[int, bytes], page_size: int = 4096) -> None:
    """Overwrite whole pages of the file behind the server's back, then commit a change of page 1 only
    (``user_version``, unused): the WAL moves, so every open connection drops its page cache and
    reads the pages from the file again."""
    with db.open("r+b") as f:
        for number, data in pages.items():
            f.seek((number - 1) * page_size)
            f.write(data)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute(f"PRAGMA user_version = {version + 1}")
    finally:
        conn.close()


def garble_table(db: Path, table: str) -> dict[int, bytes]:
    """Overwrite the pages of ``table`` (and its indexes) with garbage behind the server's back; returns
    the original pages, for ``write_pages`` to make them whole again."""
    checkpoint(db)
    pages = table_pages(db, table)
    assert pages and 1 not in pages
    data = db.read_bytes()
    original = {p: data[(p - 1) * 4096:p * 4096] for p in pages}
    write_pages(db, {p: b"\xff" * 4096 for p in pages})
    return original


def test_a_control_db_page_corrupted_while_the_server_runs_gives_503_storage_corrupt_and_doctor_explains(
    tmp_path: Path,
) -> None:
    """The pages of the sessions table are overwritten with garbage while the server runs. Listing the
    sessions and posting a message answer 503 ``storage_corrupt`` with a JSON message naming the file
    and `jupyter goals doctor` (not a 500); no message is half-written; health says ``degraded`` /
    ``storage_corrupt`` with what to do (an empty transaction, which reads no page, does not make it
    forget); ``doctor`` reports the integrity failure. Once the pages are whole again health checks
    the file, is ok again and the same message is accepted."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="corrupt", cwd=str(env["root"]))["session"]["session_id"])
        cl.send(sid, "hi", client_request_id="h")
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        db = env["state"] / "control.db"
        original = garble_table(db, "sessions")

        r = get(server, "sessions")
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["error"] == "storage_corrupt" and "control.db is damaged" in body["message"], body
        assert "malformed" in body["message"] and "jupyter goals doctor" in body["message"]
        r = post(server, f"sessions/{sid}/messages", {"text": "again", "client_request_id": "m2"})
        assert r.status_code == 503 and r.json()["error"] == "storage_corrupt", r.text
        assert not db_rows(env["state"], "SELECT 1 FROM messages WHERE client_request_id = 'm2'")  # nothing written

        for _ in range(2):  # and again: the empty recheck of a read does not clear it
            health = get(server, "health").json()
            assert (health["status"], health["reason_code"]) == ("degraded", "storage_corrupt"), health
            assert health["databases"]["control"]["ok"] is False
            assert "jupyter goals doctor" in health["databases"]["control"]["error"]["action"]

        told = goals(env["state"], "doctor")
        assert told.returncode == 1 and "Traceback" not in told.stderr, told.stderr
        assert "control: integrity FAILED" in told.stdout, told.stdout

        write_pages(db, original)
        wait_for(lambda: get(server, "health").json()["status"] == "ok", timeout=30, what="health ok again")
        assert get(server, "sessions").status_code == 200
        r = post(server, f"sessions/{sid}/messages", {"text": "again", "client_request_id": "m2"})
        assert r.status_code == 202, r.text
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"


@pytest.mark.parametrize("table", ["transcript", "attempts", "effects"])
def test_pages_workers_write_corrupted_while_a_command_runs_hold_its_result_until_they_are_whole_and_it_never_reruns(
    tmp_path: Path, table: str
) -> None:
    """The pages of a table the workers write (the transcript they append to, the attempts they are
    fenced by, the effects they dispatch and settle; with the table's indexes) are overwritten with
    garbage while a chat's command runs. When the command ends its worker cannot commit the result
    (SQLite: "database disk image is malformed"): it exits instead of holding the attempt; reading the
    session answers 503 ``storage_corrupt`` naming the file and `jupyter goals doctor` (the view reads
    each of those tables: the effects give each tool call its current state);
    health says ``storage_corrupt`` and why recovery passes fail; the command is not run again while the
    pages stay damaged. Once they are whole again the chat finishes by itself with the command's real
    result, the command ran once, and nothing recorded before is lost."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title=f"corrupt {table}", cwd=str(env["root"]),
                                    permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "hi", client_request_id="h")
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        cl.send(sid, "run something long", client_request_id="l")
        effect_dir = running_shell(env["state"])
        before = [i["item_id"] for i in cl.session(sid)["transcript"]["items"]]
        [running] = db_rows(env["state"], "SELECT worker_id FROM attempts WHERE state = 'running'")
        [worker_pid] = [w["pid"] for w in server.workers() if w["worker_id"] == running["worker_id"]]
        db = env["state"] / "control.db"
        original = garble_table(db, table)
        (env["root"] / "go").touch()

        # the command ends; its worker cannot append the result and gives the attempt up
        wait_for(lambda: process_start_time(worker_pid) is None, timeout=60, what="the worker giving the attempt up")
        assert (env["root"] / "out.txt").read_text() == "ran\n"
        r = get(server, f"sessions/{sid}")
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["error"] == "storage_corrupt" and "control.db is damaged" in body["message"], body
        assert "jupyter goals doctor" in body["message"]
        wait_for(lambda: get(server, "health").json()["reason_code"] == "storage_corrupt", timeout=30,
                 what="health to say storage_corrupt")
        # recovery keeps trying and failing on the damaged pages: two full passes, and nothing ran again
        full_passes(server, 2)
        assert (env["root"] / "out.txt").read_text() == "ran\n"
        assert (effect_dir / "exit").exists()  # the real result waits on disk
        recovery = get(server, "health").json()["recovery"]  # health says why the passes fail
        assert recovery["error"]["code"] == "storage_corrupt" and "malformed" in recovery["error"]["message"], recovery

        write_pages(db, original)
        snap = cl.wait(sid, timeout=120)
        assert snap["work"]["phase"] == "done", snap["work"]
        assert (env["root"] / "out.txt").read_text() == "ran\n"  # once
        items = snap["transcript"]["items"]
        assert [i["item_id"] for i in items][:len(before)] == before
        results = [i for i in items if i["kind"] == "tool_result"]
        assert results and "exit status: 0" in results[-1]["content"], results  # the real result, not unknown
        wait_for(lambda: get(server, "health").json()["status"] == "ok", timeout=30, what="health ok again")


def old_control_db(path: Path, version: int, rows: int) -> None:
    """control.db at schema ``version`` (the shipped migrations up to it, as an older release left it),
    holding a session with ``rows`` events and transcript items: the tables the next migration rewrites."""
    from jupyter_goals.store import schema
    from jupyter_goals.store.db import Database

    db = Database(f"sqlite:///{path}")
    saved = schema.MIGRATIONS["control"]
    schema.MIGRATIONS["control"] = [m for m in saved if m[0] <= version]
    try:
        assert schema.migrate(db, "control") == version
    finally:
        schema.MIGRATIONS["control"] = saved
        db.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO sessions (session_id, title, cwd, model, permissions, created_at, updated_at)"
                     " VALUES ('s-old', 'from an older release', '/', 'scripted', '{\"mode\": \"ask\"}', 1, 1)")
        pad = "x" * 400
        for i in range(1, rows + 1):
            conn.execute("INSERT INTO events (seq, ts, session_id, work_id, kind, payload) VALUES (?, ?, 's-old', NULL,"
                         " 'session.updated', ?)", (i, float(i), f'{{"n": {i}, "pad": "{pad}"}}'))
            conn.execute("INSERT INTO transcript (item_id, seq, session_id, kind, role, content, created_at)"
                         " VALUES (?, ?, 's-old', 'user', 'user', ?, ?)", (f"item-{i:06d}", i, f"message {i} {pad}", float(i)))
        conn.execute("UPDATE counters SET value = ? WHERE name IN ('event_seq', 'transcript_seq')", (rows,))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def table_columns_of(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        tables = [str(t) for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [str(r[1]) for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        conn.close()


def table_digests(path: Path) -> dict[str, tuple[int, str]]:
    """(row count, sha256 of every row in order) of each table and of the schema itself (sqlite_master),
    read with sqlite3 as an operator would."""
    import hashlib

    conn = sqlite3.connect(path)
    try:
        digests = {}
        for table, cols in {**table_columns_of(path), "sqlite_master": ["type", "name", "tbl_name", "sql"]}.items():
            rows = conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {', '.join(cols)}").fetchall()
            digests[table] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
        return digests
    finally:
        conn.close()


def table_rows(path: Path, columns: dict[str, list[str]] | None = None) -> dict[str, set[tuple[Any, ...]]]:
    """Every row of each table (of ``columns`` only, when given: what an older schema held)."""
    conn = sqlite3.connect(path)
    try:
        if columns is None:
            tables = [str(t) for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            columns = {t: [str(r[1]) for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
        return {t: set(conn.execute(f"SELECT {', '.join(cols)} FROM {t}")) for t, cols in columns.items()}
    finally:
        conn.close()


def _settled_health(server: Any) -> dict[str, Any] | None:
    """Health once the first migration try has ended (None while starting or not yet answering)."""
    try:
        r = get(server, "health")
    except httpx.HTTPError:
        return None
    body = r.json() if r.status_code == 200 else {}
    return body if body.get("status") not in (None, "starting") else None


def _migrated_fully_and_works(server: Any, env: dict[str, Any], old_rows: dict[str, set[tuple[Any, ...]]],
                              v1_columns: dict[str, list[str]]) -> None:
    """After the file system works again: newest schema, every old row there, one backup, a chat works."""
    from jupyter_goals.store import schema

    state = env["state"]
    server.wait_ready(timeout=120)
    # usage.db, on the same file system, is retried on its own (every 5 s)
    wait_for(lambda: get(server, "health").json()["status"] == "ok", timeout=60, what="health ok")
    health = get(server, "health").json()
    assert (health["status"], health["reason_code"]) == ("ok", ""), health
    newest = schema.CONTROL_MIGRATIONS[-1][0]
    assert [r["version"] for r in db_rows(state, "SELECT version FROM schema_migrations ORDER BY version")] == list(
        range(1, newest + 1))
    now = table_rows(state / "control.db", v1_columns)
    # v2 drops the two log counters (the logs take their seq from the rowid; the others move on, as the
    # workers' generation does); every other row is there
    assert {n for n, _ in old_rows["counters"]} - {n for n, _ in now["counters"]} == {"event_seq", "transcript_seq"}
    for table, rows in old_rows.items():
        if table != "counters":
            assert rows <= now[table], (table, len(rows - now[table]))
    assert sum(len(rows) for rows in old_rows.values()) > 20_000
    assert len(list(state.glob("control.db.v1.*.bak"))) == 1  # the completed migration's backup only
    cl = server.client()
    sid = str(cl.create_session(title="after", cwd=str(env["root"]))["session"]["session_id"])
    cl.send(sid, "hi", client_request_id="h")
    snap = cl.wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done", snap["work"]
    assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"] == ["hello"]
    assert int(db_rows(state, "SELECT COUNT(*) AS n FROM transcript WHERE session_id = 's-old'")[0]["n"]) == 10_000


def test_a_migration_that_runs_out_of_space_half_way_changes_nothing_says_why_and_completes_once_space_is_freed(
    tmp_path: Path, small_state_fs: Path
) -> None:
    """A control.db left at schema v1 by an older release holds a long history; the next migration
    (v2) copies its events and transcript into new tables. The file system is filled so that the
    migration's backup fits but the rewrite does not: SQLite fails half way with "database or disk is
    full". The server stays up: health says ``degraded`` / ``migration_failed`` with a message naming
    the full file system and how much to free, and what to do; requests answer 503 with a JSON reason;
    the file is still v1 with every row (no half-written table); the failed try gave its backup back.
    It tries again by itself: once the filler is deleted the migration completes, every old row is
    there, exactly one backup is kept, and a chat works end to end."""
    with server_env(tmp_path, RULES) as env:
        state = env["state"]
        assert state == small_state_fs
        db = state / "control.db"
        old_control_db(db, 1, rows=10_000)
        before = table_digests(db)
        old_rows = table_rows(db)
        v1_columns = {t: [str(c) for c in cols] for t, cols in table_columns_of(db).items()}
        size = db.stat().st_size
        assert size > 6 * 1024 * 1024, size
        filler = fill(small_state_fs)
        os.truncate(filler, filler.stat().st_size - (size + size // 2))  # room for the backup, not the rewrite

        server = env["make"]().start(wait=False)
        wait_for(lambda: _settled_health(server) is not None, timeout=60, what="the first migration try to end")
        health = get(server, "health").json()
        assert (health["status"], health["reason_code"]) == ("degraded", "migration_failed"), health
        error = health["databases"]["control"]["error"]
        assert error["code"] == "migration_failed" and health["databases"]["control"]["ok"] is False
        assert "no space left in migration v2" in error["message"], error  # half way: its backup was written
        assert "database or disk is full" in error["message"], error
        assert "still schema v1" in error["message"] and "Free about" in error["message"], error
        assert "Free space on the file system" in error["action"] and "tried again by itself" in error["action"]
        for r in (get(server, "sessions"), post(server, "sessions", {"title": "while full"})):
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "migration_failed" and "no space left" in r.json()["message"], r.text

        # nothing half-written: v1, every row of every table as it was, no table of the rewrite left
        assert db_rows(state, "SELECT MAX(version) AS v FROM schema_migrations") == [{"v": 1}]
        assert table_digests(db) == before
        assert db_rows(state, "PRAGMA integrity_check") == [{"integrity_check": "ok"}]
        # it tries again by itself (durable evidence: the log), and a failed try keeps no backup
        wait_for(lambda: "control migration tried again, still failing" in server.log()
                 and "no space left" in server.log().split("control migration tried again, still failing")[-1],
                 timeout=30, what="a second migration try while the disk is full")
        assert db_rows(state, "SELECT MAX(version) AS v FROM schema_migrations") == [{"v": 1}]
        assert table_digests(db) == before

        filler.unlink()
        (small_state_fs / "filler-tail").unlink()
        _migrated_fully_and_works(server, env, old_rows, v1_columns)


def test_a_migration_that_meets_a_disk_io_error_half_way_changes_nothing_says_why_and_completes_once_the_disk_works(
    tmp_path: Path, failing_disk_fs: tuple[Path, Path]
) -> None:
    """The v1 → v2 migration of a long history runs on a disk that starts failing writes after its backup
    (a real ext4 file system whose loop device's backing store fills up: the kernel reports EIO and
    SQLite "disk I/O error" when the migration syncs). The server stays up: health ``degraded`` /
    ``migration_failed`` with a message naming the I/O error, that nothing changed, and what to do;
    requests answer 503 with a JSON reason; the file is still v1, row for row, ``integrity_check`` ok;
    a failed try keeps no backup. It tries again by itself, and once the disk works again the migration
    completes: newest schema, every old row, one backup, a chat end to end. (Before: SQLite's words
    only, no action, each failed try left a backup behind, and a failed backup escaped as a raw
    ``sqlite3.OperationalError``.)"""
    state, backing = failing_disk_fs
    with server_env(tmp_path, RULES) as env:
        assert env["state"] == state
        db = state / "control.db"
        old_control_db(db, 1, rows=10_000)
        os.sync()
        before = table_digests(db)
        old_rows = table_rows(db)
        v1_columns = {t: [str(c) for c in cols] for t, cols in table_columns_of(db).items()}
        size = db.stat().st_size
        filler = fill(backing)
        os.truncate(filler, filler.stat().st_size - (size + size // 2))  # the backup fits, the rewrite fails

        server = env["make"]().start(wait=False)
        wait_for(lambda: _settled_health(server) is not None, timeout=60, what="the first migration try to end")
        health = get(server, "health").json()
        assert (health["status"], health["reason_code"]) == ("degraded", "migration_failed"), health
        error = health["databases"]["control"]["error"]
        assert error["code"] == "migration_failed" and health["databases"]["control"]["ok"] is False
        assert "the disk reported an I/O error" in error["message"] and "disk I/O error" in error["message"], error
        assert "still schema v1" in error["message"], error
        assert "Check the disk" in error["action"] and "tried again by itself" in error["action"], error
        for r in (get(server, "sessions"), post(server, "sessions", {"title": "while failing"})):
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "migration_failed" and "I/O error" in r.json()["message"], r.text

        assert db_rows(state, "SELECT MAX(version) AS v FROM schema_migrations") == [{"v": 1}]
        assert table_digests(db) == before
        assert db_rows(state, "PRAGMA integrity_check") == [{"integrity_check": "ok"}]
        wait_for(lambda: "control migration tried again, still failing" in server.log(), timeout=30,
                 what="a second migration try while the disk fails")
        assert not list(state.glob("control.db.v1.*.bak"))  # failed tries give their backups back
        assert table_digests(db) == before

        filler.unlink()
        (backing / "filler-tail").unlink()
        _migrated_fully_and_works(server, env, old_rows, v1_columns)


def test_a_migration_on_a_read_only_file_system_changes_nothing_says_why_and_completes_once_it_is_writable(
    tmp_path: Path, small_state_fs: Path
) -> None:
    """The file system that holds a v1 control.db is remounted read-only before the server starts (as a
    kernel does after errors, or an operator by mistake). The server stays up: health ``degraded`` /
    ``migration_failed`` saying the file system is read-only, that nothing changed, and to remount it
    read-write; requests answer 503 with a JSON reason; the file is untouched. Once it is remounted
    read-write, the migration completes by itself and a chat works end to end."""
    with server_env(tmp_path, RULES) as env:
        state = env["state"]
        db = state / "control.db"
        old_control_db(db, 1, rows=10_000)
        before = (db.read_bytes(), sorted(p.name for p in state.iterdir()))
        old_rows = table_rows(db)
        v1_columns = {t: [str(c) for c in cols] for t, cols in table_columns_of(db).items()}
        _run("mount", "-o", "remount,ro", str(state))
        try:
            server = env["make"]().start(wait=False)
            wait_for(lambda: _settled_health(server) is not None, timeout=60, what="the first migration try to end")
            health = get(server, "health").json()
            assert (health["status"], health["reason_code"]) == ("degraded", "migration_failed"), health
            error = health["databases"]["control"]["error"]
            assert error["code"] == "migration_failed" and "read-only" in error["message"], error
            assert "Nothing was changed" in error["message"], error
            assert "Remount the file system" in error["action"] and "tried again by itself" in error["action"], error
            r = post(server, "sessions", {"title": "while read-only"})
            assert r.status_code == 503 and r.json()["error"] == "migration_failed", r.text
            assert "read-only" in r.json()["message"], r.text
            wait_for(lambda: "control migration tried again, still failing" in server.log(), timeout=30,
                     what="a second migration try while the file system is read-only")
            assert (db.read_bytes(), sorted(p.name for p in state.iterdir())) == before  # byte for byte
        finally:
            _run("mount", "-o", "remount,rw", str(state))
        _migrated_fully_and_works(server, env, old_rows, v1_columns)


# --------------------------------------------------------------------------- a control store gone or replaced


def _control_waits(server: Any, *, says: str) -> dict[str, Any]:
    """The server's start found the control store lost: health ``degraded`` / ``control_db_missing``,
    its message containing ``says``; the error shown."""
    def lost() -> bool:
        health = _settled_health(server)
        return health is not None and says in health["databases"]["control"].get("error", {}).get("message", "")

    wait_for(lost, timeout=60, what=f"health to say the control store {says!r}")
    health = get(server, "health").json()
    assert (health["status"], health["reason_code"]) == ("degraded", "control_db_missing"), health
    assert health["databases"]["control"]["ok"] is False
    error: dict[str, Any] = health["databases"]["control"]["error"]
    assert error["code"] == "control_db_missing" and "--start-over" in error["action"], error
    for r in (get(server, "sessions"), post(server, "sessions", {"title": "while it is lost"})):
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "control_db_missing" and says in r.json()["message"], r.text
    return error


def _looked_again(server: Any, error: dict[str, Any]) -> None:
    """Durable evidence that the waiting server looked at the control store again after ``error`` was shown."""
    def later() -> bool:
        shown = get(server, "health").json()["databases"]["control"].get("error", {})
        return float(shown.get("checked_at") or 0) > float(error["checked_at"])

    wait_for(later, timeout=30, what="the waiting server to look at the control store again")


def test_a_control_db_missing_at_start_is_never_replaced_by_an_empty_one_and_work_goes_on_once_it_is_back(
    tmp_path: Path,
) -> None:
    """control.db (with its -wal / -shm) is moved away while the server is down, as a restore to the wrong
    place or a cleanup script would. Before, the next start created an empty control.db: every session,
    Goal, approval and intent gone without a word. Now the state dir remembers its control store: the start
    waits, degraded ``control_db_missing`` saying what happened and what to do, requests answer 503 with
    that reason, and nothing is created at the path, not by the tries every 2 s nor by `jupyter goals
    doctor`, which explains. Another control store put there (someone else's, with its own schema) is
    named as such and not written to. Once the right file is back the server goes on by itself, no restart:
    the whole history is there and a chat goes on."""
    from jupyter_goals.store import schema
    from jupyter_goals.store.db import Database

    with server_env(tmp_path, RULES) as env:
        state = env["state"]
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="kept", cwd=str(env["root"]))["session"]["session_id"])
        cl.send(sid, "hi", client_request_id="h")
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        before = [(i["kind"], i["content"]) for i in cl.session(sid)["transcript"]["items"]]
        server.stop()
        aside = tmp_path / "moved"
        aside.mkdir()
        for name in ("control.db", "control.db-wal", "control.db-shm"):
            if (state / name).exists():
                (state / name).rename(aside / name)

        server.start(wait=False)
        error = _control_waits(server, says="is gone")
        assert str(state / "control.db") in error["message"], error
        _looked_again(server, error)
        doctor = goals(state, "doctor")
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        assert "control: MISSING" in doctor.stdout and "--start-over" in doctor.stdout, doctor.stdout
        status = goals(state, "status")  # the other commands refuse it too
        assert status.returncode == 2 and "is gone" in status.stderr, status.stdout + status.stderr
        assert not (state / "control.db").exists()  # neither the server's tries nor the commands made an empty one

        other = Database(f"sqlite:///{state / 'control.db'}")  # another store (its own schema) at the path
        schema.migrate(other, "control")
        other.close()
        other_digests = table_digests(state / "control.db")
        error = _control_waits(server, says="is another control store")
        _looked_again(server, error)
        assert table_digests(state / "control.db") == other_digests  # nothing written to it

        for name in ("control.db-wal", "control.db-shm"):
            (state / name).unlink(missing_ok=True)
        for f in aside.iterdir():
            f.rename(state / f.name)
        server.wait_ready(timeout=60)  # it goes on by itself: workers run
        wait_for(lambda: get(server, "health").json()["status"] == "ok", timeout=30, what="health ok")
        cl = server.client()
        assert [(i["kind"], i["content"]) for i in cl.session(sid)["transcript"]["items"]][:len(before)] == before
        cl.send(sid, "hi again", client_request_id="h2")
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"


@pytest.mark.postgres
def test_a_postgresql_control_store_emptied_while_the_server_is_down_waits_until_the_person_starts_over(
    tmp_path: Path,
) -> None:
    """The control store is a PostgreSQL database; while the server is down it is dropped and created
    again empty (a botched restore). The start does not migrate the empty database as if it were a first
    start: degraded ``control_db_missing``, nothing created there (no table, after the server looked
    again), `jupyter goals doctor` explains. `doctor --start-over` is refused (exit 2, "nothing to do")
    while the store is the one the state dir knows, and once it is lost it is the person's choice to
    begin again: the waiting server goes on by itself with an empty history, and a chat works."""
    import psycopg

    with pg_database("goals_control") as (name, url):

        def tables() -> list[str]:
            with psycopg.connect(url) as conn:
                return [str(r[0]) for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]

        with server_env(tmp_path, RULES) as env:
            state = env["state"]
            server = env["make"](extra=[f"--GoalsApp.control_db_url={url}"]).start()
            cl = server.client()
            sid = str(cl.create_session(title="gone", cwd=str(env["root"]))["session"]["session_id"])
            cl.send(sid, "hi", client_request_id="h")
            assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
            refused = goals(state, "--control-db-url", url, "doctor", "--start-over")
            assert refused.returncode == 2 and "nothing to do" in refused.stderr, refused.stdout + refused.stderr
            server.stop()
            pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)')
            pg_admin(f'CREATE DATABASE "{name}"')

            server.start(wait=False)
            error = _control_waits(server, says="holds no records")
            _looked_again(server, error)
            assert tables() == []
            doctor = goals(state, "--control-db-url", url, "doctor")
            assert doctor.returncode == 1 and "control: MISSING" in doctor.stdout, doctor.stdout + doctor.stderr
            stop_all = goals(state, "--control-db-url", url, "stop-all")  # never written as if it were ours
            assert stop_all.returncode == 2 and "holds no records" in stop_all.stderr, stop_all.stdout + stop_all.stderr
            assert tables() == []

            chosen = goals(state, "--control-db-url", url, "doctor", "--start-over")
            assert chosen.returncode == 0 and "Starting over" in chosen.stdout, chosen.stdout + chosen.stderr
            server.wait_ready(timeout=60)
            wait_for(lambda: get(server, "health").json()["status"] == "ok", timeout=30, what="health ok")
            cl = server.client()
            assert cl.sessions() == []  # the person chose an empty history
            sid = str(cl.create_session(title="anew", cwd=str(env["root"]))["session"]["session_id"])
            cl.send(sid, "hi", client_request_id="h")
            assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
            server.stop()
            server.start()  # the new store is the one remembered now
            assert get(server, "health").json()["status"] == "ok"
