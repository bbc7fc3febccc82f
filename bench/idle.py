"""An idle server: CPU, write transactions, and the time from a posted message to its turn's start.

Run:  python bench/idle.py [--sessions 100] [--idle-s 30] [--trace-s 10] [--json]

Starts a real ``jupyter server`` with two workers and the product's default timings (heartbeat 2 s,
full reconcile pass 5 s) on a fresh state dir, with a scripted model that answers at once. Then:

1. **POST → turn start.** One message per new session, ``--sessions`` of them one after another:
   the time from just before ``POST /api/goals/sessions/{id}/messages`` to the worker's claim of the
   attempt (``attempts.started_at``, written by ``claim_attempt`` as the turn starts; same host, same
   clock), each message waited for until its work is done. Median and p99.
2. **Idle CPU.** With every session finished and the outbox empty, user + system CPU time of the
   server and both workers (``/proc/<pid>/stat``) over ``--idle-s`` seconds, in % of one core.
3. **Durable commits while idle**, from outside: commit frames appended to ``control.db-wal`` and
   ``usage.db-wal`` in the same window (the WAL is truncated first, and each frame's salts and checksum
   are verified, so the count is exact), split into worker heartbeats (each ``workers.heartbeat_at``
   value seen, sampled every 100 ms) and everything else.
4. **Write transactions while idle**, from outside: ``strace`` (when present) on the three processes
   for ``--trace-s`` seconds, counting acquisitions of SQLite's WAL write lock (``F_WRLCK`` on byte
   120 of ``*.db-shm``: what ``BEGIN IMMEDIATE`` takes, even when the transaction then writes nothing),
   per file and per process. Run after the CPU window, because tracing slows the traced processes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.testing import ServerProcess, write_script

# the product's defaults (the fast test defaults of jupyter_goals.testing are overridden)
DEFAULTS = ["--GoalsApp.workers=2", "--GoalsApp.heartbeat_s=2.0", "--GoalsApp.lease_ttl_s=10",
            "--GoalsApp.reconcile_interval_s=5", "--GoalsApp.recovery_backoff_s=1",
            "--GoalsApp.provider_retry_base_s=1"]


# --------------------------------------------------------------------------- WAL commit frames


def _wal_checksum(data: bytes, s0: int, s1: int, big: bool) -> tuple[int, int]:
    words = struct.unpack((">" if big else "<") + f"{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_commits(path: Path) -> tuple[tuple[int, int] | None, int]:
    """(the WAL's generation (checkpoint seq, salt 1), commit frames of it): valid frames only."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, 0
    if len(data) < 32:
        return None, 0
    magic, _version, page_size, ckpt, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:32])
    big = magic & 1 == 1
    s0, s1 = _wal_checksum(data[:24], 0, 0, big)
    if (s0, s1) != (c0, c1):
        return None, 0
    commits, off = 0, 32
    while off + 24 + page_size <= len(data):
        pgno, size, fs1, fs2, f0, f1 = struct.unpack(">6I", data[off:off + 24])
        if (fs1, fs2) != (salt1, salt2):
            break
        s0, s1 = _wal_checksum(data[off:off + 8], s0, s1, big)
        s0, s1 = _wal_checksum(data[off + 24:off + 24 + page_size], s0, s1, big)
        if (s0, s1) != (f0, f1):
            break
        commits += 1 if size else 0
        off += 24 + page_size
    return (ckpt, salt1), commits


def truncate_wal(db: Path) -> None:
    """Checkpoint and truncate the WAL, so the window's frames start at zero (no restart inside it)."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        for _ in range(100):
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            time.sleep(0.05)
        raise SystemExit(f"could not truncate {db}-wal (busy)")
    finally:
        conn.close()


# --------------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


WRLOCK = re.compile(r"^(\d+)\s+fcntl\(\d+<([^>]*\.db-shm)>, F_SETLKW?, \{l_type=F_WRLCK, l_whence=SEEK_SET, l_start=120, l_len=1\}\) = 0")


def trace_write_locks(pids: dict[int, str], seconds: float, out: Path) -> dict[str, Any] | None:
    """WAL write-lock acquisitions per process and file while ``strace`` follows ``pids``."""
    if shutil.which("strace") is None:
        return None
    args = ["strace", "-f", "-y", "-qq", "-e", "trace=fcntl", "-o", str(out)]
    for pid in pids:
        args += ["-p", str(pid)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE)
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
    if not out.exists():
        return {"error": err.decode(errors="replace")[-300:]}
    tids: dict[int, str] = {}
    for pid, role in pids.items():
        for task in Path(f"/proc/{pid}/task").iterdir():
            tids[int(task.name)] = role
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        m = WRLOCK.match(line)
        if m:
            key = f"{tids.get(int(m.group(1)), '?')}:{Path(m.group(2)).name.removesuffix('-shm')}"
            counts[key] = counts.get(key, 0) + 1
    return {"seconds": seconds, "write_locks": counts,
            "per_second": round(sum(counts.values()) / seconds, 2)}


# --------------------------------------------------------------------------- the run


def run(sessions: int = 100, idle_s: float = 30.0, trace_s: float = 10.0, extra: list[str] | None = None) -> dict[str, Any]:
    """The measurements of the module docstring on a fresh server; the JSON object ``--json`` prints."""
    extra = list(extra or [])
    base = Path(tempfile.mkdtemp(prefix="jg-bench-idle-"))
    state, root = base / "state", base / "root"
    root.mkdir()
    model = write_script(base / "script.json", [], default={"text": "ok"})
    server = ServerProcess(state, root, model=model, extra=[*DEFAULTS, *extra])
    server.start()
    http = httpx.Client(base_url=f"{server.url}api/goals/", headers={"Authorization": f"token {server.token}"},
                        timeout=60)
    ro = sqlite3.connect(f"file:{state / 'control.db'}?mode=ro", uri=True, timeout=30)
    out: dict[str, Any] = {"sessions": sessions, "config": DEFAULTS + extra}
    try:
        # every worker registered and past its start (its first look for work), then one untimed message
        deadline = time.monotonic() + 60
        while ro.execute("SELECT COUNT(*) FROM workers WHERE state = 'live'").fetchone()[0] < 2:
            if time.monotonic() > deadline:
                raise SystemExit(f"workers did not register:\n{server.log()}")
            time.sleep(0.1)
        time.sleep(1)

        # 1. POST -> turn start
        latencies: list[float] = []
        parts: dict[str, list[float]] = {"accepted": [], "admitted": [], "claimed": []}
        for i in range(-1, sessions):
            r = http.post("sessions", json={"title": f"idle bench {i}", "cwd": str(root)})
            r.raise_for_status()
            sid = r.json()["session"]["session_id"]
            t0 = time.time()
            r = http.post(f"sessions/{sid}/messages", json={"text": f"hello {i}", "client_request_id": f"m{i}"})
            r.raise_for_status()
            work_id = r.json()["work_id"]
            deadline = time.monotonic() + 60
            while True:
                row = ro.execute("SELECT phase FROM work_items WHERE work_id = ?", (work_id,)).fetchone()
                if row and row[0] == "done":
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"message {i} did not finish:\n{server.log()}")
                time.sleep(0.01)
            created, admitted, started = ro.execute(
                "SELECT w.created_at, a.admitted_at, a.started_at FROM work_items w JOIN attempts a USING (work_id)"
                " WHERE work_id = ? ORDER BY a.admitted_at LIMIT 1", (work_id,)).fetchone()
            if i < 0:
                continue  # the warm-up message
            latencies.append((float(started) - t0) * 1000)
            parts["accepted"].append((float(created) - t0) * 1000)
            parts["admitted"].append((float(admitted) - float(created)) * 1000)
            parts["claimed"].append((float(started) - float(admitted)) * 1000)
        latencies.sort()
        out["post_to_turn_start_ms"] = {
            "n": len(latencies), "median": round(statistics.median(latencies), 1),
            "p99": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 1),
            "max": round(latencies[-1], 1),
            # medians of the steps: POST sent -> message committed -> attempt admitted -> worker's claim
            "steps_median": {k: round(statistics.median(v), 1) for k, v in parts.items()}}

        # settle: the outbox drained, then a little more for the passes that follow a turn's end
        deadline = time.monotonic() + 60
        while ro.execute("SELECT COUNT(*) FROM outbox WHERE state != 'done'").fetchone()[0]:
            if time.monotonic() > deadline:
                raise SystemExit("the outbox did not drain")
            time.sleep(0.1)
        time.sleep(3)
        pids = {server.proc.pid: "server"} if server.proc else {}
        for w in http.get("health").json()["workers"]:
            pids[int(w["pid"])] = "worker"
        for name in ("control.db", "usage.db"):
            truncate_wal(state / name)

        # 2 + 3. CPU and durable commits over the idle window
        wall0 = time.time()
        gen0 = {n: wal_commits(state / f"{n}-wal") for n in ("control.db", "usage.db")}
        cpu0 = {pid: cpu_seconds(pid) for pid in pids}
        t0 = time.monotonic()
        beats: set[tuple[str, float]] = set()

        def sample() -> None:
            for wid, at in ro.execute("SELECT worker_id, heartbeat_at FROM workers WHERE state = 'live'"):
                beats.add((wid, float(at)))

        while time.monotonic() - t0 < idle_s:
            sample()
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
        cpu1 = {pid: cpu_seconds(pid) for pid in pids}
        gen1 = {n: wal_commits(state / f"{n}-wal") for n in ("control.db", "usage.db")}
        wall1 = time.time()
        sample()  # a heartbeat committed just before the last commit count
        # the heartbeats committed between the two commit counts (each value stays 2 s: every one is sampled);
        # counting the values seen after each worker's first one was off by one with the heartbeats' phase
        heartbeats = sum(1 for _, at in beats if wall0 < at <= wall1)
        server_cpu = sum(cpu1[p] - cpu0[p] for p, role in pids.items() if role == "server")
        worker_cpu = sum(cpu1[p] - cpu0[p] for p, role in pids.items() if role == "worker")
        out["idle_cpu_pct_of_one_core"] = {
            "total": round(100 * (server_cpu + worker_cpu) / elapsed, 3),
            "server": round(100 * server_cpu / elapsed, 3), "workers": round(100 * worker_cpu / elapsed, 3),
            "seconds": round(elapsed, 1)}
        commits: dict[str, Any] = {}
        for n in ("control.db", "usage.db"):
            (g0, c0), (g1, c1) = gen0[n], gen1[n]
            commits[n] = (c1 - c0) if g0 == g1 or g0 is None else f"WAL restarted; {c1}+ commits"
        control_commits = commits["control.db"] if isinstance(commits["control.db"], int) else None
        out["idle_commits_per_s"] = {
            "control_db": round(control_commits / elapsed, 3) if control_commits is not None else commits["control.db"],
            "usage_db": round(commits["usage.db"] / elapsed, 3) if isinstance(commits["usage.db"], int) else commits["usage.db"],
            "heartbeats": round(heartbeats / elapsed, 3),
            "other": (round((control_commits - heartbeats) / elapsed, 3) if control_commits is not None else None)}

        # 4. write transactions (write-lock acquisitions), traced
        if trace_s > 0:
            out["idle_write_transactions"] = trace_write_locks(pids, trace_s, base / "strace.txt")
    finally:
        ro.close()
        http.close()
        server.kill()
    out["base"] = str(base)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=100, help="finished sessions, one timed message each")
    p.add_argument("--idle-s", type=float, default=30.0, help="the idle window for CPU and commits")
    p.add_argument("--trace-s", type=float, default=10.0, help="the strace window (0: skip)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--extra", action="append", default=[], help="another --GoalsApp.x=y for the server")
    args = p.parse_args()

    out = run(args.sessions, args.idle_s, args.trace_s, args.extra)
    base = out.pop("base")
    if args.json:
        print(json.dumps(out))
        return
    lat, cpu, com = out["post_to_turn_start_ms"], out["idle_cpu_pct_of_one_core"], out["idle_commits_per_s"]
    print(f"server + 2 workers, {args.sessions} finished sessions ({base})")
    print(f"  POST -> turn start      median {lat['median']} ms, p99 {lat['p99']} ms, max {lat['max']} ms (n={lat['n']})")
    steps = lat["steps_median"]
    print(f"    step medians          POST -> committed {steps['accepted']} ms, -> admitted {steps['admitted']} ms,"
          f" -> claimed {steps['claimed']} ms")
    print(f"  idle CPU (% of a core)  {cpu['total']} (server {cpu['server']}, workers {cpu['workers']}) over"
          f" {cpu['seconds']} s   target < 1: {'PASS' if cpu['total'] < 1 else 'MISS'}")
    print(f"  idle commits/s          control.db {com['control_db']} (heartbeats {com['heartbeats']},"
          f" other {com['other']}), usage.db {com['usage_db']}")
    tr = out.get("idle_write_transactions")
    if tr and "write_locks" in tr:
        print(f"  idle write tx/s         {tr['per_second']} (WAL write-lock acquisitions over {tr['seconds']} s:"
              f" {tr['write_locks']})")
    elif tr:
        print(f"  idle write tx/s         strace failed: {tr.get('error')}")


if __name__ == "__main__":
    main()
