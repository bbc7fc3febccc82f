"""Real ``jupyter server`` processes with jupyter_goals: start, kill -9, restart, wait for them.

Written once and shared by the tests, the benchmarks (``bench/``), ``jupyter goals demo`` and any project
that tests against jupyter_goals (the pytest plugin ``jupyter_goals.testing.plugin``). Each server runs in
its own process group on its own state dir, so ``kill()`` takes the server and its workers (as a machine
crash would) but not detached tool processes, which live in their own sessions exactly as in production.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.clients.rest import GoalsClient

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
    """One ``jupyter server`` (or, with ``app="jupyterlab"``, ``jupyter lab``) with the extension on an
    isolated state dir (its Jupyter config and runtime dirs beside it unless ``env`` names others).
    ``model``: the default model (None: the server's own default, the offline demo); ``extra``: more
    command-line options (``--GoalsApp.workers=2``), which replace the fast test defaults of the same name
    (``fast=False``: none, the product's own); ``env``: more environment variables, read at each start;
    ``ready``: ``"goals"`` waits until the extension's health answers with a worker, ``"status"`` until the
    Jupyter server answers at all (for a server whose extension is disabled)."""

    def __init__(self, state_dir: Path, root_dir: Path, *, model: str | None, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, app: str = "jupyter_server", fast: bool = True,
                 ready: str = "goals", log_path: Path | None = None) -> None:
        self.state_dir = state_dir
        self.root_dir = root_dir
        self.model = model
        self.extra = extra or []
        self.env_extra = env if env is not None else {}
        self.app, self.fast, self.ready = app, fast, ready
        self.token = uuid.uuid4().hex
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_path or state_dir.parent / f"server-{uuid.uuid4().hex[:6]}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self, crash_at: str | None = None, wait: bool = True, env: dict[str, str] | None = None,
              same_port: bool = False, timeout: float = 60.0) -> ServerProcess:
        """``same_port``: restart where clients (kernels, pages) already point."""
        if not (same_port and self.port):
            self.port = free_port()
        environ = dict(os.environ)
        environ.pop("JUPYTER_GOALS_CRASH_AT", None)
        environ["JUPYTER_CONFIG_DIR"] = str(self.state_dir.parent / "jupyter_config")
        environ["JUPYTER_RUNTIME_DIR"] = str(self.state_dir.parent / "jupyter_runtime")
        environ.update(self.env_extra)
        environ.update(env or {})
        environ["JUPYTER_GOALS_STATE_DIR"] = str(self.state_dir)
        if crash_at:
            environ["JUPYTER_GOALS_CRASH_AT"] = crash_at
        cmd = [
            sys.executable, "-m", self.app, "--no-browser", "--allow-root",
            f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}",
            # enabled unless the caller says otherwise (a trait given twice on the command line is refused)
            *([] if any(a.startswith("--ServerApp.jpserver_extensions") for a in self.extra)
              else ["--ServerApp.jpserver_extensions={'jupyter_goals': True}"]),
            *self._goals_args(),
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()/stop()
        self.proc = subprocess.Popen(cmd, env=environ, cwd=self.root_dir, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if wait:
            self.wait_ready(timeout)
        return self

    def _goals_args(self) -> list[str]:
        """Fast test defaults, each overridden by ``extra`` (traitlets refuses a trait given twice on the
        command line: the extension then fails to link its config and silently runs on defaults)."""
        defaults = [f"--GoalsApp.default_model={self.model}"] if self.model else []
        if self.fast:
            defaults += ["--GoalsApp.heartbeat_s=0.5", "--GoalsApp.lease_ttl_s=3", "--GoalsApp.reconcile_interval_s=1",
                         "--GoalsApp.recovery_backoff_s=0.2", "--GoalsApp.provider_retry_base_s=0.2"]
        given = {arg.split("=", 1)[0] for arg in self.extra}
        return [arg for arg in defaults if arg.split("=", 1)[0] not in given] + self.extra

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        path = "api/goals/health" if self.ready == "goals" else "api/status"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-6000:]}")
            try:
                r = httpx.get(f"{self.url}{path}", headers={"Authorization": f"token {self.token}"}, timeout=2)
                if r.status_code == 200 and (self.ready != "goals" or r.json().get("workers")):
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


class ServerFactory:
    """Servers on one state dir and one root folder under ``base`` (``base/state``, ``base/root``), with a
    scripted model (``rules``, DESIGN §11) or ``model``; ``make`` builds one (not started), ``close``
    kills every server made. A second server made here is the same installation restarted."""

    def __init__(self, base: Path, rules: list[dict[str, Any]] | None = None, *, model: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.root = base / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        self.state = base / "state"
        self.script = base / "script.json"
        self.model = model or write_script(self.script, rules or [])
        self.env = env or {}
        self.servers: list[ServerProcess] = []

    def make(self, extra: list[str] | None = None, env: dict[str, str] | None = None,
             model_: str | None = None) -> ServerProcess:
        merged = {**self.env, **(env or {})}
        server = ServerProcess(self.state, self.root, model=model_ or self.model, extra=extra, env=merged or None)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for server in self.servers:
            server.kill()


@contextmanager
def server_env(
    tmp_path: Path, rules: list[dict[str, Any]], base_env: dict[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """A notebook root, a scripted model and a ``make`` that starts servers on one state dir; every
    server started is killed at the end (``ServerFactory`` as a dict, for the tests written with it)."""
    factory = ServerFactory(tmp_path, rules, env=base_env)
    try:
        yield {"root": factory.root, "state": factory.state, "make": factory.make, "script": factory.script,
               "out": factory.root / "out.txt"}
    finally:
        factory.close()


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
