"""``jupyter goals status | recover --explain | stop-all | doctor`` as a user runs them: the real
command in a subprocess, on the state dir of a real server (running, or killed -9)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.servers import db_rows, running_shell, server_env, wait_for

pytestmark = pytest.mark.slow
JUPYTER = str(Path(sys.executable).parent / "jupyter")


def goals(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([JUPYTER, "goals", "--state-dir", str(state), *args], capture_output=True, text=True,
                          timeout=120)


RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"purpose": "work", "last_user_contains": "slow"},
     "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300; echo ran >> out.txt"}}]}},
]


def test_commands_on_a_missing_state_dir_fail_with_a_message(tmp_path: Path) -> None:
    result = goals(tmp_path / "nothing", "status")
    assert result.returncode == 2 and "no control database" in result.stderr
    assert "Traceback" not in result.stderr
    bad = subprocess.run([JUPYTER, "goals", "frobnicate"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_status_explain_and_stop_all_work_while_the_server_is_down(tmp_path: Path) -> None:
    """A chat is killed -9 mid-command; with the server down, ``status`` lists it, ``recover --explain``
    says what the next start would decide and why, ``stop-all`` persists the stop; the next start keeps
    it stopped, kills the still-running command (issue 15), and nothing runs again."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="cli chat", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        # the command itself running, not only its call committed ``dispatched``: a kill between the two
        # leaves an unknown outcome, which a restart must not call cancelled
        running_shell(env["state"])
        server.kill()

        status = goals(env["state"], "status")
        assert status.returncode == 0, status.stderr
        assert "cli chat" in status.stdout and "working" in status.stdout

        explain = goals(env["state"], "recover", "--explain")
        assert explain.returncode == 0, explain.stderr
        mine = [d for d in json.loads(explain.stdout) if d["session_id"] == sid]
        # the worker died with the server: the next start would recover the chat, not wait for its owner
        assert [(d["decision"], d["reason_code"], d["facts"]["interrupted"]) for d in mine] == [("admit", "recovered", True)]

        stop = goals(env["state"], "stop-all")
        assert stop.returncode == 0 and "Stopped 1 work item(s)." in stop.stdout
        again = goals(env["state"], "stop-all")
        assert again.returncode == 0 and "Nothing was running." in again.stdout

        server.start()
        cl = server.client()
        snap = cl.wait(sid, phases=("cancelled",), timeout=30)
        assert snap["work"]["reason_code"] == "user_stopped"
        wait_for(lambda: db_rows(env["state"], "SELECT 1 FROM effects WHERE state = 'cancelled'"), timeout=30,
                 what="the still-running command killed and recorded cancelled")
        assert not (env["root"] / "out.txt").exists()
        assert "cancelled" in goals(env["state"], "status").stdout


def test_doctor_reports_a_healthy_store_and_a_schema_newer_than_the_code_without_touching_it(tmp_path: Path) -> None:
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        server.stop()
        healthy = goals(env["state"], "doctor")
        assert healthy.returncode == 0 and healthy.stdout.strip().endswith("ok"), healthy.stdout
        conn = sqlite3.connect(env["state"] / "control.db")
        conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 0)")
        conn.commit()
        conn.close()
        before = (env["state"] / "control.db").read_bytes()
        broken = goals(env["state"], "doctor")
        assert broken.returncode == 1 and "newer than this code" in broken.stdout and "problems found" in broken.stdout
        assert (env["state"] / "control.db").read_bytes() == before


def usage_tokens(state: Path) -> tuple[int, int, int]:
    conn = sqlite3.connect(f"file:{state / 'usage.db'}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0)"
                           " FROM receipts").fetchone()
        return int(row[0]), int(row[1]), int(row[2])
    except sqlite3.Error:
        return (0, 0, 0)
    finally:
        conn.close()


def test_a_deleted_usage_ledger_is_explained_by_doctor_and_rebuilt_once_from_control_db(tmp_path: Path) -> None:
    """usage.db deleted while the server is down: ``doctor`` says so, with how many operations control.db
    recorded and what the next start does; the next start rebuilds the ledger from them, each receipt
    once (the same count and token sums as before, not double)."""
    rules = [{"when": {"purpose": "work"}, "respond": {"text": "hi", "usage": {"input_tokens": 7, "output_tokens": 3}}}]
    with server_env(tmp_path, rules) as env:
        server = env["make"]().start()
        cl = server.client()
        for n in range(3):
            sid = str(cl.create_session(title=f"c{n}", cwd=str(env["root"]))["session"]["session_id"])
            cl.send(sid, "hello", client_request_id=f"m{n}")
            cl.wait(sid, timeout=60)
        wait_for(lambda: usage_tokens(env["state"]) == (3, 21, 9), timeout=30, what="three receipts in the ledger")
        server.stop()
        for suffix in ("", "-wal", "-shm"):
            (env["state"] / f"usage.db{suffix}").unlink(missing_ok=True)

        told = goals(env["state"], "doctor")
        assert told.returncode == 1 and "is missing" in told.stdout and "rebuilds the ledger" in told.stdout, told.stdout
        assert not (env["state"] / "usage.db").exists()  # doctor without --repair changes nothing

        server.start()
        wait_for(lambda: usage_tokens(env["state"]) == (3, 21, 9), timeout=30, what="the ledger rebuilt")
        assert "rebuilding the ledger" in server.log()
        server.stop()
        server.start()  # a later start does not apply them again
        assert usage_tokens(env["state"]) == (3, 21, 9)


def test_doctor_finds_a_corrupted_database_and_repairs_the_state_dir_permissions(tmp_path: Path) -> None:
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        server.stop()
        env["state"].chmod(0o755)
        told = goals(env["state"], "doctor")
        assert told.returncode == 1 and "others can read" in told.stdout, told.stdout
        fixed = goals(env["state"], "doctor", "--repair")
        assert "now 0o700 (repaired)" in fixed.stdout and fixed.returncode == 0, fixed.stdout
        assert env["state"].stat().st_mode & 0o777 == 0o700

        db = env["state"] / "control.db"
        data = bytearray(db.read_bytes())
        page = 4096
        assert len(data) > 4 * page
        data[2 * page + 100:3 * page] = b"\xff" * (page - 100)  # garbage inside a b-tree page
        db.write_bytes(bytes(data))
        broken = goals(env["state"], "doctor")
        assert broken.returncode == 1 and "Traceback" not in broken.stderr, broken.stderr
        assert "integrity FAILED" in broken.stdout or "UNAVAILABLE" in broken.stdout, broken.stdout
