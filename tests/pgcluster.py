"""A private, throwaway PostgreSQL cluster for the failover tests: ``initdb`` into a temporary directory,
``pg_ctl`` on a free port, trust authentication on 127.0.0.1 only. A test stops and starts it at will
(``stop("immediate")`` is a database crash: every connection cut, no checkpoint), which it must never do
to the shared PostgreSQL on 127.0.0.1:5432 that other tests and CI use.

PostgreSQL's server refuses to run as root: under root the binaries run as the ``postgres`` user through
``runuser`` (the data directory is handed to that user first). ``unavailable()`` says, in one sentence,
why a cluster cannot be made here (no binaries, root without a ``postgres`` user)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.servers import free_port

OWNER = "postgres"  # the user the server runs as when the tests run as root


def _bin_dir() -> Path | None:
    """The newest installed PostgreSQL's server binaries (Debian's layout first, then PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def unavailable() -> str | None:
    """Why a private cluster cannot be made on this machine; None when it can."""
    bins = _bin_dir()
    if bins is None or not (bins / "pg_ctl").exists():
        return ("PostgreSQL's server binaries (initdb, pg_ctl) are not installed: looked in "
                "/usr/lib/postgresql/*/bin and on PATH (Debian/Ubuntu: apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OWNER)
        except KeyError:
            return (f"the tests run as root, PostgreSQL's server refuses to run as root, and there is no "
                    f"'{OWNER}' user to run it as")
        if shutil.which("runuser") is None:
            return f"the tests run as root and runuser (to run PostgreSQL as '{OWNER}') is not installed"
    return None


class PrivateCluster:
    """One PostgreSQL cluster of its own: ``start()``, ``stop(mode)``, ``url(database)``, ``destroy()``."""

    def __init__(self) -> None:
        bins = _bin_dir()
        assert bins is not None, unavailable()
        self.bins = bins
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="jg-pg-"))
        self.data = self.base / "data"
        self.logfile = self.base / "postgres.log"
        self.as_root = os.geteuid() == 0
        if self.as_root:  # the server's user must own its data directory and be able to write its log
            owner = pwd.getpwnam(OWNER)
            os.chmod(self.base, 0o700)
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bins / tool), *args]
        if self.as_root:
            cmd = ["runuser", "-u", OWNER, "--", *cmd]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.base)
        if check and run.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}\n"
                               f"{self.log()[-3000:]}")
        return run

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server on its port (the same one every time) and wait until it accepts connections.
        fsync is off: the tests crash the server's processes, never the machine, so what a commit wrote
        is in the page cache and survives, and the shared CPUs are spared the flushes."""
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.base}"
                   " -c fsync=off -c full_page_writes=off -c max_connections=300")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``immediate``: the database crashes (connections cut, recovery from the WAL at the next start);
        ``fast``: open transactions are rolled back and the server shuts down cleanly."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.url(name)

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def destroy(self) -> None:
        if self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.base, ignore_errors=True)
