"""PostgreSQL connections ended under a running server (a database restart, an operator's
``pg_terminate_backend``, a proxy cutting idle connections), on the real PostgreSQL server: each backend
is found by its ``application_name`` (the lane and the process id) and ended there.

A read cut while a shell command runs is not that command's outcome: recorded as its result, it stood for
a command that ran on (its process is detached) and the model started it again (CI, stop 36: two lines
of one step in ``out.txt``). A connection the database ended while it sat idle is replaced before the
next transaction instead of failing it: the next request is answered, no worker dies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from jupyter_goals.host.effect_files import RECOVERED_NOTE
from tests.hostkit import Hosts
from tests.servers import ServerProcess, wait_for

pytestmark = pytest.mark.postgres


def rules() -> list[dict[str, Any]]:
    """"run:" starts one command that waits for the file ``go`` and appends ``once`` to ``once.txt``, then
    answers "ok" once its result says it ran; any other result (an error) makes it start the command again,
    as a model would."""
    command = "while [ ! -e go ]; do sleep 0.1; done; echo once >> once.txt; echo did-once"
    return [
        {"when": {"last_user_contains": "run:", "tool_result_unknown": True}, "respond": {"text": "unknown; stop."}},
        {"when": {"last_user_contains": "run:", "last_tool_result_contains": "did-once"}, "respond": {"text": "ok"}},
        {"when": {"last_user_contains": "run:"}, "respond": {"text": "running", "tool_calls": [
            {"name": "shell", "arguments": {"command": command}}]}},
        {"when": {"last_user_contains": "hello"}, "respond": {"text": "hi"}},
    ]


def admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def backends(conn: psycopg.Connection[Any], names: list[str], *, waiting: bool = False) -> list[int]:
    sql = "SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%s)"
    return [int(r[0]) for r in conn.execute(sql + (" AND wait_event_type = 'Lock'" if waiting else ""), (names,))]


def lanes(pid: int) -> list[str]:
    """The ``application_name`` of a process's two lane connections (``store/pgconn.lane_name``)."""
    return [f"jupyter_goals-db-{pid}", f"jupyter_goals-db-read-{pid}"]


def done(hosts: Hosts, session_id: str) -> bool:
    return bool(hosts.rows("SELECT work_id FROM work_items WHERE session_id = ? AND phase = 'done'", (session_id,)))


def start_chat(server: ServerProcess, root: Path, text: str) -> str:
    cl = server.client()
    sid = str(cl.create_session(title="chat", cwd=str(root), permissions={"mode": "bypass"})["session"]["session_id"])
    cl.send(sid, text, client_request_id=f"c-{text[:8]}")
    return sid


def test_a_read_cut_while_a_command_runs_is_not_its_outcome_and_the_command_runs_once(
        tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    hosts = Hosts(tmp_path, hosts_store, rules())
    try:
        a = hosts.a.start()
        sid = start_chat(a, hosts.root, "run: the command")
        wait_for(lambda: hosts.rows("SELECT effect_id FROM effects WHERE state = 'dispatched'"), timeout=60,
                 what="the command running")
        worker = int(a.workers()[0]["pid"])
        reader = [lanes(worker)[1]]
        # the worker's watch over the running call reads its effect once a second: hold that read inside
        # the database (a lock on ``effects``), end its backend there, then let go of the lock
        with psycopg.connect(hosts.control_url) as lock, admin(hosts.control_url) as ops:
            schema = lock.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
            lock.execute(f'LOCK TABLE "{schema}".effects IN ACCESS EXCLUSIVE MODE')
            wait_for(lambda: backends(ops, reader, waiting=True), timeout=30, what="the watch's read held")
            assert all(ops.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]  # type: ignore[index]
                       for pid in backends(ops, reader, waiting=True))
            lock.rollback()
        (hosts.root / "go").touch()  # the command ends only now, after its watch's read was cut

        wait_for(lambda: done(hosts, sid), timeout=60, what="the chat done")
        assert (hosts.root / "once.txt").read_text().splitlines() == ["once"]
        (call,) = hosts.rows("SELECT state, result FROM effects WHERE session_id = ?", (sid,))
        assert call["state"] == "committed" and "did-once" in call["result"], call
        # the worker watched on through the cut read: no crash, no recovery (whose result carries the note)
        assert RECOVERED_NOTE not in call["result"]
        assert [int(w["pid"]) for w in a.workers()] == [worker]
    finally:
        hosts.close()


def test_connections_the_database_ended_while_idle_are_opened_again_before_the_next_transaction(
        tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    hosts = Hosts(tmp_path, hosts_store, rules())
    try:
        a = hosts.a.start()
        first = start_chat(a, hosts.root, "hello once")
        wait_for(lambda: done(hosts, first), timeout=60, what="the first chat done")
        a.client().sessions()  # the server's read lane is open too
        worker = int(a.workers()[0]["pid"])
        assert a.proc is not None
        names = [*lanes(a.proc.pid), *lanes(worker)]
        with admin(hosts.control_url) as ops:
            ended = backends(ops, names)
            assert len(ended) >= 3, ended  # the server's two lanes and at least the worker's write lane
            for pid in ended:
                ops.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_for(lambda: not set(ended) & set(backends(ops, names)), timeout=30, what="the backends gone")

        # the next read and the next write are answered (no 503 storage_unavailable on the dead connections)
        assert a.client().sessions()
        second = start_chat(a, hosts.root, "hello again")
        wait_for(lambda: done(hosts, second), timeout=60, what="the second chat done")
        assert a.client().health()["status"] == "ok"
        assert [int(w["pid"]) for w in a.workers()] == [worker]  # the worker lived on
    finally:
        hosts.close()
