"""What every benchmark of ``python -m bench`` shares: the figure row, the machine and versions, a real
server with an HTTP client, read-only evidence from its state dir, and a private PostgreSQL schema.

Nothing here shortcuts the product: servers are real ``jupyter server`` processes
(``jupyter_goals.testing.ServerProcess``), requests are real HTTP, evidence is read from durable rows.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.testing import ServerProcess

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"  # the local server of the tests: trust auth, db `test`


@dataclass
class Figure:
    """One row of the table: a figure, its baseline measured in the same run, their ratio and the target.

    ``passed`` is None when there is no target (shown for information) or the figure was not measured.
    ``limit`` says what limits a figure that falls short (or why it was not measured)."""

    name: str
    what: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_what: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    limit: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def verdict(self) -> str:
        if self.value is None:
            return "NOT MEASURED"
        return {True: "PASS", False: "FALLS SHORT", None: "-"}[self.passed]

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict()
        return out


def rnd(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --------------------------------------------------------------------------- machine and versions


def machine() -> dict[str, Any]:
    """Cores, CPU model, memory and the disk of the temp dir (from /proc and ``df``), and the load."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    disk = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["df", "-hT", tempfile_dir()], capture_output=True, text=True, timeout=10).stdout
        rows = out.strip().splitlines()
        if len(rows) > 1:
            f = rows[-1].split()
            disk = f"{f[0]} ({f[1]}), {f[2]} total, {f[4]} free, mounted on {f[-1]}"
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gb": mem_gb, "disk": disk,
            "kernel": platform.release(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


def pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """The versions of this package and of every baseline the figures compare with."""
    return {"python": platform.python_version(), "jupyter_goals": pkg("jupyter_goals"),
            "jupyter_server": pkg("jupyter_server"), "sqlite": sqlite3.sqlite_version,
            "postgresql": pg_version(), "psycopg": pkg("psycopg"), "dbos": pkg("dbos"), "langgraph": pkg("langgraph"),
            "langgraph-checkpoint-sqlite": pkg("langgraph-checkpoint-sqlite"),
            "langgraph-checkpoint-postgres": pkg("langgraph-checkpoint-postgres")}


def pg_version() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else None
    except Exception:  # no driver or no server: the PostgreSQL figures say so
        return None


# --------------------------------------------------------------------------- PostgreSQL


@contextlib.contextmanager
def pg_schemas(*names: str) -> Iterator[dict[str, str]]:
    """Private schemas on the local PostgreSQL (as ``tests/storekit.py`` makes them): a URL per name whose
    ``search_path`` is that schema; dropped at the end."""
    import psycopg

    token = uuid.uuid4().hex[:8]
    schemas = {n: f"bench_{token}_{n}" for n in names}
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for s in schemas.values():
            conn.execute(f'CREATE SCHEMA "{s}"')  # type: ignore[arg-type]
    try:
        yield {n: f"{PG_URL}?options=-csearch_path%3D{s}" for n, s in schemas.items()}
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for s in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')  # type: ignore[arg-type]


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A private database on the local PostgreSQL (for a system that makes its own schemas: DBOS); dropped."""
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield PG_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a real server


def control_reader(state: Path, url: str | None) -> Callable[[str], list[tuple[Any, ...]]]:
    """A function running one read-only query on a server's control store (the SQLite file in ``state``, or
    ``url``'s PostgreSQL), each on a connection of its own, as an operator reads it."""
    if url is None:
        def q(sql: str) -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(f"file:{state / 'control.db'}?mode=ro", uri=True, timeout=30)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        return q
    import psycopg

    def qpg(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(url) as conn:
            return list(conn.execute(sql).fetchall())  # type: ignore[arg-type]
    return qpg



class Bench:
    """A temp dir (``base/state``, ``base/root``) with the servers a benchmark starts: killed at the end."""

    def __init__(self, prefix: str) -> None:
        import tempfile

        self.base = Path(tempfile.mkdtemp(prefix=f"jg-bench-{prefix}-"))
        self.state, self.root = self.base / "state", self.base / "root"
        self.root.mkdir()
        self.servers: list[ServerProcess] = []

    def server(self, model: str | None, extra: list[str] | None = None, *, fast: bool = True,
               env: dict[str, str] | None = None) -> ServerProcess:
        s = ServerProcess(self.state, self.root, model=model, extra=extra, fast=fast, env=env)
        self.servers.append(s)
        return s

    def close(self) -> None:
        for s in self.servers:
            with contextlib.suppress(Exception):
                s.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def api(server: ServerProcess, timeout: float = 60) -> httpx.Client:
    return httpx.Client(base_url=f"{server.url}api/goals/", headers={"Authorization": f"token {server.token}"},
                        timeout=timeout)


def wait_health(server: ServerProcess, timeout: float = 120) -> float:
    """Wait until ``GET /health`` and ``GET /sessions`` answer 200 (started, recovery pass over; a server
    with ``workers=0`` has no worker to wait for); returns the ``time.time()`` they first did."""
    deadline = time.monotonic() + timeout
    with api(server, timeout=5) as http:
        while time.monotonic() < deadline:
            assert server.proc is not None
            if server.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{server.log()[-3000:]}")
            try:
                # health answers while the schema is checked; a route answering 200 means the start is over
                if http.get("health").status_code == 200 and http.get("sessions", params={"limit": 1}).status_code == 200:
                    return time.time()
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    raise TimeoutError(f"server not healthy:\n{server.log()[-3000:]}")


def ro(state: Path) -> sqlite3.Connection:
    """control.db read-only, the way an operator reads it."""
    return sqlite3.connect(f"file:{state / 'control.db'}?mode=ro", uri=True, timeout=30)


def scalar(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    return conn.execute(sql, params).fetchone()[0]


def wait_until(cond: Any, timeout: float, what: str, every: float = 0.02) -> float:
    """Poll ``cond`` until it holds; returns ``time.time()`` when it did (durable evidence, no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.time()
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def bench_python() -> str:
    return sys.executable
