"""DBOS baseline for recovery at scale: how long DBOS takes to bring ``n`` pending workflows back after kill -9.

Run:  python -m bench.dbos_recovery [--n 1000] [--json]     (from the checkout root, ``bench`` extra installed)

Two child processes run the same app code: a ``@DBOS.workflow()`` that runs one ``@DBOS.step()`` (it returns a
value) and then waits in ``DBOS.recv(topic, timeout_seconds=3600)``, DBOS's usual way for a workflow to wait
for something outside it. The system database is a SQLite file in a temp dir, with DBOS's own settings
(``step_overhead.py``'s config without its PRAGMAs: journal mode and synchronous are DBOS's business).

1. ``--phase start``: ``DBOS.launch()``, start ``n`` workflows, wait until every one has passed its step and
   reached ``recv`` (an in-process counter), then wait until DBOS's tables (read-only) show ``n`` workflows
   PENDING, ``n`` step outputs and ``n`` recorded ``recv`` timeouts (``pending_before_kill``).
   The parent then kills the child's process group with SIGKILL.
2. ``--phase recover``: a new process, the same code, ``DBOS.launch()``, which finds the local PENDING workflows
   and recovers them by itself (it re-enqueues each on DBOS's internal queue, whose worker thread then dequeues
   and re-runs them; the recorded step output is replayed, not re-executed). ``recovery_s`` runs from just before
   ``DBOS.launch()`` until every one of the ``n`` workflows has re-executed up to ``recv`` again (the counter
   reaches ``n``); ``process_start_to_all_s`` from just before the parent spawns the process (Python start and
   imports included). ``step_reexecutions`` counts step bodies that ran in phase 2 (expected 0).

This is DBOS's counterpart of ``bench/recovery.py``'s ``recovery_s`` ("from the start of recovery until each work
item is admitted or waiting with its reason").
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

TIMEOUT_S = 300.0
DB_FILE = "dbos_sys.sqlite"
TOPIC = "go"


# --------------------------------------------------------------------------- the child (both phases)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class _Counter:
    """A thread-safe count with a waiter for a target value and the time it was reached."""

    def __init__(self) -> None:
        self.value = 0
        self.cond = threading.Condition()
        self.first_at: float | None = None

    def incr(self) -> None:
        with self.cond:
            self.value += 1
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.cond.notify_all()

    def wait_for(self, target: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.value >= target, timeout)


def _child(phase: str, d: Path, n: int) -> None:
    t_proc = time.perf_counter()
    from importlib.metadata import version

    from dbos import DBOS, DBOSConfig, SetWorkflowID

    t_imported = time.perf_counter()
    steps = _Counter()
    waiting = _Counter()
    config: DBOSConfig = {
        "name": "jg-bench-recovery",
        "system_database_url": f"sqlite:///{d / DB_FILE}",
        "log_level": "WARNING",
    }
    if phase == "start":  # only the set-up before the kill, not measured: no fsyncs (a kill -9 keeps the page cache)
        import sqlalchemy as sa
        from sqlalchemy import event

        @event.listens_for(sa.engine.Engine, "connect")
        def _fast_setup(dbapi_conn: Any, _rec: Any) -> None:
            dbapi_conn.execute("PRAGMA synchronous=OFF")

    DBOS(config=config)

    @DBOS.step()
    def prepare(i: int) -> str:
        steps.incr()
        return f"prepared {i}"

    @DBOS.workflow()
    def item(i: int) -> str:
        prepared = prepare(i)
        waiting.incr()  # the waiting point: past the step, about to wait in recv
        msg = DBOS.recv(TOPIC, timeout_seconds=3600)
        return f"{prepared}: {msg}"

    t_launch = time.perf_counter()
    launch_wall = time.time()
    DBOS.launch()
    launched = time.perf_counter()
    if phase == "start":
        for i in range(n):
            with SetWorkflowID(f"wf-{i:05d}"):
                DBOS.start_workflow(item, i)
        started = time.perf_counter()
        if not waiting.wait_for(n, TIMEOUT_S):
            _emit({"event": "timeout", "waiting": waiting.value, "steps": steps.value})
            os._exit(1)
        _emit({"event": "waiting", "n": waiting.value, "steps": steps.value, "version": version("dbos"),
               "start_all_s": started - launched, "all_waiting_s": time.perf_counter() - launched,
               "threads": threading.active_count()})
        threading.Event().wait()  # until the parent's SIGKILL
    ok = waiting.wait_for(n, TIMEOUT_S)
    done = time.perf_counter()
    done_wall = time.time()
    _emit({"event": "recovered" if ok else "timeout", "waiting": waiting.value, "step_reexecutions": steps.value,
           "version": version("dbos"), "recovery_s": done - t_launch, "launch_return_s": launched - t_launch,
           "first_waiting_s": None if waiting.first_at is None else waiting.first_at - t_launch,
           "in_process_start_to_all_s": done - t_proc, "imports_s": t_imported - t_proc,
           "launch_wall": launch_wall, "done_wall": done_wall, "threads": threading.active_count()})
    os._exit(0 if ok else 1)  # DBOS.destroy() would wait on n threads blocked in recv


# --------------------------------------------------------------------------- the parent


class _Child:
    """One phase's process: its own process group, JSON lines read by a thread, stderr to a file."""

    def __init__(self, phase: str, d: Path, n: int) -> None:
        self.stderr: TextIO = open(d / f"{phase}.stderr", "w+")
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.spawned_wall = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.dbos_recovery", "--phase", phase, "--dir", str(d), "--n", str(n)],
            cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def event(self, want: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"DBOS recovery benchmark: no '{want}' within {TIMEOUT_S:g} s") from None
            if line is None:
                self.proc.wait()
                self.stderr.seek(0)
                err = " | ".join(self.stderr.read().strip().splitlines()[-5:])
                raise RuntimeError(f"DBOS recovery benchmark: the child exited ({self.proc.returncode}) "
                                   f"before '{want}': {err or 'no output'}")
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a stray print
            if obj.get("event") == want:
                return obj
            raise RuntimeError(f"DBOS recovery benchmark: expected '{want}', got {obj}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.stderr.close()


def _durable_counts(db: Path) -> dict[str, Any]:
    """Read DBOS's system tables read-only: PENDING workflows, recorded step outputs, recorded ``recv`` timeouts
    (``recv`` records its durable timeout as a ``DBOS.sleep`` row before it waits) and the journal mode."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        pending = conn.execute("SELECT COUNT(*) FROM workflow_status WHERE status = 'PENDING'").fetchone()[0]
        steps = conn.execute(
            "SELECT COUNT(*) FROM operation_outputs WHERE function_name LIKE '%prepare'").fetchone()[0]
        recvs = conn.execute("SELECT COUNT(*) FROM operation_outputs WHERE function_name = 'DBOS.sleep'").fetchone()[0]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    return {"pending": pending, "steps": steps, "recv_waits": recvs, "journal_mode": mode}


def run(n: int = 1000, *, parent: str | None = None) -> dict[str, Any]:
    """Start ``n`` DBOS workflows, SIGKILL their process once all wait, time a new process's recovery of them.

    Returns ``recovery_s`` (DBOS.launch() until all ``n`` wait again), ``process_start_to_all_s``, ``n``,
    ``version``, ``step_reexecutions``, ``pending_before_kill`` and detail (see the module docstring)."""
    if n < 1:
        raise ValueError("n must be at least 1")
    try:
        from importlib.metadata import version

        dbos_version = version("dbos")
        import dbos  # noqa: F401
    except Exception as exc:
        raise RuntimeError(f"dbos is not installed ({exc}); run: pip install -e '.[bench]'") from exc
    t0 = time.perf_counter()
    d = Path(tempfile.mkdtemp(prefix="jg-bench-dbos-recovery-", dir=parent))
    try:
        start = _Child("start", d, n)
        try:
            started = start.event("waiting")
            deadline = time.monotonic() + TIMEOUT_S
            while min((before := _durable_counts(d / DB_FILE))[k] for k in ("pending", "steps", "recv_waits")) < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"DBOS recovery benchmark: only {before} durable after {TIMEOUT_S:g} s")
                time.sleep(0.05)
        finally:
            start.kill()
        after_kill = _durable_counts(d / DB_FILE)
        rec = _Child("recover", d, n)
        try:
            r = rec.event("recovered")
        finally:
            rec.kill()
        after = _durable_counts(d / DB_FILE)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {
        "recovery_s": round(r["recovery_s"], 3),
        "process_start_to_all_s": round(r["done_wall"] - rec.spawned_wall, 3),
        "n": n,
        "version": r["version"] or dbos_version,
        "step_reexecutions": r["step_reexecutions"],
        "pending_before_kill": before["pending"],
        "detail": {
            "launch_return_s": round(r["launch_return_s"], 3),
            "first_waiting_s": None if r["first_waiting_s"] is None else round(r["first_waiting_s"], 3),
            "imports_s": round(r["imports_s"], 3),
            "spawn_to_launch_s": round(r["launch_wall"] - rec.spawned_wall, 3),
            "threads_after_recovery": r["threads"],
            "phase1_start_all_s": round(started["start_all_s"], 3),
            "phase1_all_waiting_s": round(started["all_waiting_s"], 3),
            "steps_recorded_before_kill": before["steps"],
            "recv_waits_recorded_before_kill": before["recv_waits"],
            "pending_after_kill": after_kill["pending"],
            "pending_after_recovery": after["pending"],
            "journal_mode": before["journal_mode"],
            "total_run_s": round(time.perf_counter() - t0, 3),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="pending workflows to recover (default 1000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--dir", help="parent folder for the temp dir; with --phase, the run's own dir")
    ap.add_argument("--phase", choices=("start", "recover"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.n < 1:
        ap.error("--n must be at least 1")
    if args.phase:
        _child(args.phase, Path(args.dir), args.n)
        return 0
    res = run(args.n, parent=args.dir)
    if args.json:
        print(json.dumps(res))
    else:
        det = res["detail"]
        print(f"DBOS {res['version']} (SQLite, journal_mode={det['journal_mode']}): {res['n']} pending workflows "
              f"after SIGKILL ({res['pending_before_kill']} PENDING before the kill)")
        print(f"  recovery_s             {res['recovery_s']:8.3f}  DBOS.launch() -> all {res['n']} waiting in recv again")
        print(f"  process_start_to_all_s {res['process_start_to_all_s']:8.3f}  spawn -> all waiting again")
        print(f"  launch_return_s        {det['launch_return_s']:8.3f}  first_waiting_s {det['first_waiting_s']}")
        print(f"  step_reexecutions      {res['step_reexecutions']:8d}  (0: the step output was replayed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
