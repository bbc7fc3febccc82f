"""Real ``jupyter server`` processes for process-level tests: start, kill -9, restart.

Written once and shared. Each server runs in its own process group, so ``kill()`` takes the server
and its workers (as a machine crash would) but not detached tool processes, which live in their own
sessions exactly as in production.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.notebook.client import GoalsClient

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    def start(self, crash_at: str | None = None, wait: bool = True, env: dict[str, str] | None = None) -> ServerProcess:
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
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(f"{self.url}api/goals/health", headers={"Authorization": f"token {self.token}"}, timeout=2)
                if r.status_code == 200 and r.json().get("workers"):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log()}")

    def client(self) -> GoalsClient:
        return GoalsClient(self.url, self.token)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
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

