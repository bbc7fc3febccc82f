"""Helpers of the process-level tests beyond what ``jupyter_goals.testing`` ships: evidence read from a
server's state dir (attempts, running shell commands, fired crash points, usage rows) and the scripted
chat of the crash tests."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jupyter_goals.host.effect_files import group_members
from jupyter_goals.testing.servers import (
    ServerFactory,
    ServerProcess,
    free_port,
    full_passes,
    server_env,
    wait_for,
    write_script,
)

ROOT = Path(__file__).resolve().parent.parent  # the checkout (a server given it on PYTHONPATH imports tests.*)

__all__ = ["ServerFactory", "ServerProcess", "free_port", "full_passes", "server_env", "wait_for",
           "write_script"]


def store_url(state: Path, which: str = "control") -> str:
    """The control store (or, ``which="usage"``, the ledger) a server of this state dir last started with,
    read where an operator finds it: the configuration it saved (``server_config.json``); the SQLite file
    in the state dir before any start."""
    try:
        url = str(json.loads((state / "server_config.json").read_text())[f"{which}_db_url"])
    except (OSError, ValueError, KeyError):
        url = ""
    return url if url.startswith("postgresql") else f"sqlite:///{state / f'{which}.db'}"


def store_args(backend: Any) -> list[str]:
    """A server's options that put its control store and ledger on ``backend`` (``tests/storekit.Backend``):
    none for SQLite (the files in its state dir), private PostgreSQL schemas otherwise."""
    if backend.kind == "sqlite":
        return []
    return [f"--GoalsApp.control_db_url={backend.url('control')}", f"--GoalsApp.usage_db_url={backend.url('usage')}"]


@contextmanager
def stored_server_env(tmp_path: Path, rules: list[dict[str, Any]], backend: Any,
                      base_env: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """``server_env`` on ``backend``'s store: every server its ``make`` builds keeps its control store and
    ledger there (SQLite files in the state dir, or the backend's private PostgreSQL schemas)."""
    with server_env(tmp_path / "servers", rules, base_env) as e:
        make, args = e["make"], store_args(backend)

        def make_on_store(extra: list[str] | None = None, env: dict[str, str] | None = None,
                          model_: str | None = None) -> ServerProcess:
            return make([*args, *(extra or [])], env, model_)  # type: ignore[no-any-return]

        e["make"] = make_on_store
        yield e


def _rows(url: str, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    if url.startswith("postgresql"):
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(url, row_factory=dict_row, connect_timeout=10) as pg:
            return [dict(r) for r in pg.execute(sql.replace("?", "%s"), params or None)]  # type: ignore[arg-type]
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def db_rows(state: Path, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of the control store of a server's state dir (``control.db``, or the PostgreSQL store it was
    started with), read the way an operator would."""
    return _rows(store_url(state), sql, params)


def attempt_count(state: Path) -> int:
    """Attempts ever admitted: a pass that admits work adds one, so an unchanged count after
    ``full_passes`` proves nothing was admitted."""
    return int(db_rows(state, "SELECT COUNT(*) AS n FROM attempts")[0]["n"])



def shell_running(state: Path, session_id: str | None = None) -> Path | None:
    """The effect dir of a dispatched shell call (of ``session_id``, if given) whose command is running:
    its process group alive. A call is committed ``dispatched`` before its command starts; a kill in
    between leaves an outcome that is unknown, not a command to reconnect to."""
    sql = "SELECT effect_id FROM effects WHERE tool = 'shell' AND state = 'dispatched'"
    rows = db_rows(state, sql + " AND session_id = ?", (session_id,)) if session_id else db_rows(state, sql)
    for row in rows:
        d = state / "effects" / row["effect_id"]
        if group_members(d):
            return d
    return None


def running_shell(state: Path, session_id: str | None = None) -> Path:
    """Wait for a running shell command (see ``shell_running``); its effect dir."""
    wait_for(lambda: shell_running(state, session_id) is not None, timeout=30, what="a running shell command")
    found = shell_running(state, session_id)
    assert found is not None
    return found


# --------------------------------------------------------------------------- process-level crash helpers

#: the scripted chat of the crash tests: run ``shell`` once to append one line to ``out.txt``, then answer
APPEND_RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "append", "tool_result_unknown": True},
     "respond": {"text": "The append has an unknown outcome; I will not repeat it.", "usage": {"input_tokens": 9, "output_tokens": 3}}},
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "Appended one line.", "usage": {"input_tokens": 10, "output_tokens": 4}}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo line >> out.txt"}}],
                 "usage": {"input_tokens": 8, "output_tokens": 2}}},
    {"when": {"last_user_contains": "slow", "last_tool_result_contains": "exit status"},
     "respond": {"text": "Slow command finished.", "usage": {"input_tokens": 5, "output_tokens": 1}}},
    {"when": {"last_user_contains": "slow"},
     "respond": {"text": "Running slowly.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 2; echo line >> out.txt"}}]}},
    {"when": {"last_user_contains": "think"},
     "respond": {"text": "Thought about it.", "delay_s": 0.4, "usage": {"input_tokens": 3, "output_tokens": 1}}},
]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def fired(state: Path, point: str) -> bool:
    return (state / "faults" / f"{point}.fired").exists()


def spawned(state: Path) -> int:
    """Shell processes started so far (their identity file is written right after the spawn)."""
    return len(list((state / "effects").glob("*/proc.json"))) if (state / "effects").exists() else 0


def wait_spawned(state: Path, n: int = 1) -> None:
    wait_for(lambda: spawned(state) >= n, what=f"{n} shell process(es) to start")


def new_session(server: ServerProcess, root: Path) -> str:
    snap = server.client().create_session(title="crash", cwd=str(root), permissions={"mode": "bypass"})
    return str(snap["session"]["session_id"])


def check_ownership(state: Path, quota: int) -> None:
    """One owner per work item and one running request per session at this instant, within the quota."""
    shared = db_rows(state, "SELECT work_id, COUNT(*) AS n FROM attempts WHERE state IN ('admitted', 'running')"
                            " GROUP BY work_id HAVING COUNT(*) > 1")
    assert shared == [], f"work items with more than one live attempt: {shared}"
    per_session = db_rows(state, "SELECT session_id, COUNT(*) AS n FROM attempts WHERE state IN ('admitted', 'running')"
                                 " GROUP BY session_id HAVING COUNT(*) > 1")
    assert per_session == [], f"sessions running more than one request: {per_session}"
    [live] = db_rows(state, "SELECT COUNT(*) AS n FROM attempts WHERE state IN ('admitted', 'running')")
    assert live["n"] <= quota, f"{live['n']} live attempts over the quota of {quota}"


def sample_until(state: Path, quota: int, done: Callable[[], bool], timeout: float, what: str) -> int:
    """Check ownership every ~50 ms until ``done``; returns the number of samples taken."""
    samples = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_ownership(state, quota)
        samples += 1
        if done():
            return samples
        time.sleep(0.05)
    raise TimeoutError(what)


def usage_rows(state: Path, sql: str) -> list[dict[str, Any]]:
    """Rows of the ledger of a server's state dir (``usage.db``, or its PostgreSQL ledger)."""
    return _rows(store_url(state, "usage"), sql, ())
