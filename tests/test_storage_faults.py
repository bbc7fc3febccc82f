"""Storage faults while work runs (issue 16): a disk that fills up mid-command, and a database whose
write lock another process holds. Real servers and workers; the state dir on a real, small file system
(a tmpfs mounted for the test) so that SQLite's commits really fail with "database or disk is full"."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import db_rows, running_shell, server_env, wait_for

pytestmark = pytest.mark.slow

RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"purpose": "work", "last_tool_result_contains": "outcome unknown"},
     "respond": {"text": "finished; its outcome is unknown, so I will not run it again"}},
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


def fill(directory: Path) -> Path:
    """Fill the file system that holds ``directory`` to the last block."""
    filler = directory / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
    subprocess.run(["dd", "if=/dev/zero", f"of={directory / 'filler-tail'}", "bs=4k"], capture_output=True)
    st = os.statvfs(directory)
    assert st.f_bavail * st.f_frsize < 64 * 1024, "the test file system is not full"
    return filler


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
        wait_for(lambda: "the worker exits so that the attempt is recovered" in server.log(), timeout=60,
                 what="the worker giving the attempt up")

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
