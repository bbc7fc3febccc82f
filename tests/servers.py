"""Real ``jupyter server`` processes for process-level tests: start, kill -9, restart.

Written once and shared. Each server runs in its own process group, so ``kill()`` takes the server
and its workers (as a machine crash would) but not detached tool processes, which live in their own
sessions exactly as in production.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.effect_files import group_members
from jupyter_goals.notebook.client import GoalsClient

ROOT = Path(__file__).resolve().parent.parent


# Ports for the servers tests start: below the kernel's ephemeral range (32768-60999 here), so no outgoing
# connection holds one, and a block of its own per pytest-xdist worker, so two workers never pick the same
# port between choosing it and the server binding it (which a bind to port 0 and close allows).
_PORT_BLOCK = 1000
_next_port = random.Random().randrange(_PORT_BLOCK)


def free_port() -> int:
    """A port nothing listens on, from this xdist worker's own block (``gw0`` 20000-20999, ``gw1`` 21000-...; 12 workers at most)."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = 20000 + _PORT_BLOCK * (int(worker) if worker.isdigit() else 0)
    for _ in range(_PORT_BLOCK):
        port = base + _next_port % _PORT_BLOCK
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or a killed server's connections still in TIME_WAIT)
            return port
    raise RuntimeError(f"no free port in {base}-{base + _PORT_BLOCK - 1}")


def write_script(path: Path, rules: list[dict[str, Any]], default: dict[str, Any] | None = None) -> str:
    path.write_text(json.dumps({"rules": rules, "default": default or {"text": "(no rule)"}}))
    return f"scripted:{path}"


class ServerProcess:
    """One ``jupyter server`` with the extension on an isolated state dir."""

    def __init__(self, state_dir: Path, root_dir: Path, *, model: str, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.root_dir = root_dir
        self.model = model
        self.extra = extra or []
        self.env_extra = env or {}
        self.token = uuid.uuid4().hex
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"server-{uuid.uuid4().hex[:6]}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self, crash_at: str | None = None, wait: bool = True, env: dict[str, str] | None = None,
              same_port: bool = False) -> ServerProcess:
        """``same_port``: restart where clients (kernels, pages) already point."""
        if not (same_port and self.port):
            self.port = free_port()
        environ = dict(os.environ)
        environ.pop("JUPYTER_GOALS_CRASH_AT", None)
        environ.update(self.env_extra)
        environ.update(env or {})
        environ["JUPYTER_GOALS_STATE_DIR"] = str(self.state_dir)
        environ["JUPYTER_CONFIG_DIR"] = str(self.state_dir.parent / "jupyter_config")
        environ["JUPYTER_RUNTIME_DIR"] = str(self.state_dir.parent / "jupyter_runtime")
        if crash_at:
            environ["JUPYTER_GOALS_CRASH_AT"] = crash_at
        cmd = [
            sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
            f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}", "--ServerApp.jpserver_extensions={'jupyter_goals': True}",
            *self._goals_args(),
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()/stop()
        self.proc = subprocess.Popen(cmd, env=environ, cwd=self.root_dir, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if wait:
            self.wait_ready()
        return self

    def _goals_args(self) -> list[str]:
        """Fast test defaults, each overridden by ``extra`` (traitlets refuses a trait given twice on the
        command line: the extension then fails to link its config and silently runs on defaults)."""
        defaults = [f"--GoalsApp.default_model={self.model}", "--GoalsApp.heartbeat_s=0.5", "--GoalsApp.lease_ttl_s=3",
                    "--GoalsApp.reconcile_interval_s=1", "--GoalsApp.recovery_backoff_s=0.2",
                    "--GoalsApp.provider_retry_base_s=0.2"]
        given = {arg.split("=", 1)[0] for arg in self.extra}
        return [arg for arg in defaults if arg.split("=", 1)[0] not in given] + self.extra

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-6000:]}")
            try:
                r = httpx.get(f"{self.url}api/goals/health", headers={"Authorization": f"token {self.token}"}, timeout=2)
                if r.status_code == 200 and r.json().get("workers"):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log()[-6000:]}")

    def client(self) -> GoalsClient:
        return GoalsClient(self.url, self.token)

    def log(self) -> str:
        """The server's whole log (with its workers'): evidence read from it must not depend on how much
        else was logged since; callers that show it cut it themselves."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        self.kill()
        return code

    def kill(self) -> None:
        """kill -9 of the server and every process in its group (its workers)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc = None
        self._log.close()
        time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> int:
        """A plain, graceful server exit (SIGTERM... jupyter asks for confirmation on SIGINT)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        self._log.close()
        return code

    def workers(self) -> list[dict[str, Any]]:
        return list(self.client().health()["workers"])


def db_rows(state: Path, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of ``control.db`` in a server's state dir, read the way an operator would."""
    conn = sqlite3.connect(state / "control.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


@contextmanager
def server_env(
    tmp_path: Path, rules: list[dict[str, Any]], base_env: dict[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """A notebook root, a scripted model and a ``make`` that starts servers on one state dir; every
    server started is killed at the end."""
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "script.json"
    model = write_script(script, rules)
    servers: list[ServerProcess] = []

    def make(extra: list[str] | None = None, env: dict[str, str] | None = None, model_: str | None = None) -> ServerProcess:
        merged = {**(base_env or {}), **(env or {})}
        s = ServerProcess(tmp_path / "state", root, model=model_ or model, extra=extra, env=merged or None)
        servers.append(s)
        return s

    try:
        yield {"root": root, "state": tmp_path / "state", "make": make, "script": script, "out": root / "out.txt"}
    finally:
        for s in servers:
            s.kill()


def wait_for(cond: Any, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``cond`` every 50 ms until it holds; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def full_passes(server: ServerProcess, n: int = 2, timeout: float = 30.0) -> None:
    """Wait until the server's Coordinator has run ``n`` full passes (ownership, recovery, decide,
    admit) that all began after this call: the evidence for "nothing happened" (never a fixed sleep).
    GET /health's ``recovery.at`` is stamped as each pass ends, and passes run one at a time, so of the
    distinct stamps seen after the call only the first may belong to a pass begun before it."""
    since = time.time()
    seen: set[float] = set()

    def stamped() -> bool:
        at = server.client().health().get("recovery", {}).get("at")
        if at is not None and at > since:
            seen.add(at)
        return len(seen) > n

    wait_for(stamped, timeout=timeout, what=f"{n} full Coordinator passes")


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
    conn = sqlite3.connect(state / "usage.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()
