"""One busy session measured from outside a real ``jupyter server`` (issue 14 targets).

Run:  python bench/long_session.py [--items 20000] [--json]

A scripted model calls ``read_file`` in a tight loop in a ``bypass`` session (every step: a model
request, a tool call, its result — four transcript items). While it runs, the bench reads the
session's newest page the way the UI does (``GET /sessions/{id}?before=latest&limit=50``) and samples
the item count (from control.db, read-only) and the server's and worker's RSS. It prints:

* items/s around 1,000 and around 10,000 items — target: the later at least 0.8x the earlier
  (a step must not cost O(items));
* snapshot p50 / p90 while the loop runs — target p90 under 100 ms (reads never wait behind writes);
* the newest-page snapshot of the ``--items``-item session once the loop is stopped — target under
  100 ms;
* server and worker RSS at 2,000 and at ``--items`` items — target: flat for the server;
* POST -> turn start of another session while the loop runs (a message every 2 s to a second session
  whose model answers at once): the busy worker must not starve the admission loop or other work
  (median and p99, from ``work_items.created_at`` and ``attempts.started_at``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.testing import ServerProcess, write_script


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (a rate that another busy process on the machine
    cannot skew the way it skews wall-clock items/s)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(items: int = 20000, *, early: int = 1000, late: int | None = None, extra: list[str] | None = None,
        env: dict[str, str] | None = None, model_name: str | None = None) -> dict[str, Any]:
    """The loop of the module docstring until ``items`` transcript items; rates around ``early`` and ``late``
    (default min(10,000, items)) items. ``model_name``: a named model (``GoalsApp.models`` in ``extra``)
    the busy session uses instead of the script itself (one with a context window is compacted)."""
    late = min(10000, items) if late is None else late
    marks = sorted({early, 2 * early, late, items})

    base = Path(tempfile.mkdtemp(prefix="jg-bench-long-"))
    state, root = base / "state", base / "root"
    root.mkdir()
    (root / "small.txt").write_text("a short file\n")
    model = write_script(base / "loop.json", [], {"tool_calls": [{"name": "read_file", "arguments": {"path": "small.txt"}}],
                                                  "usage": {"input_tokens": 10, "output_tokens": 5}})
    server = ServerProcess(state, root, model=model, extra=extra, env=env).start()
    http = httpx.Client(base_url=server.url + "api/goals", headers={"Authorization": f"token {server.token}"},
                        timeout=60)
    sid = http.post("/sessions", json={"title": "busy", "permissions": {"mode": "bypass"},
                                       **({"model": model_name} if model_name else {})}).json()["session"]["session_id"]
    http.post(f"/sessions/{sid}/messages", json={"text": "read small.txt forever", "client_request_id": "go"})
    quick = write_script(base / "quick.json", [], {"text": "ok", "usage": {"input_tokens": 1, "output_tokens": 1}})
    other = http.post("/sessions", json={"title": "other", "model": quick}).json()["session"]["session_id"]

    counter = sqlite3.connect(f"file:{state / 'control.db'}?mode=ro", uri=True)
    samples: list[tuple[float, int]] = []  # (time, items)
    cpu: list[tuple[float, int]] = []  # (workers' CPU seconds, items)
    snapshots: list[float] = []
    rss: dict[int, tuple[float, float]] = {}
    stop = threading.Event()

    def read_ui() -> None:  # the UI's newest page, back to back, while the loop runs
        while not stop.is_set():
            t0 = time.perf_counter()
            http.get(f"/sessions/{sid}", params={"before": "latest", "limit": 50}).raise_for_status()
            snapshots.append(time.perf_counter() - t0)
            time.sleep(0.1)

    posted: list[tuple[float, str]] = []  # (POST sent, work id) of the other session's messages

    def post_other() -> None:  # another session's messages, while the loop runs
        n = 0
        while not stop.wait(2.0):
            t0 = time.time()
            r = http.post(f"/sessions/{other}/messages", json={"text": f"hi {n}", "client_request_id": f"o{n}"})
            posted.append((t0, r.json()["work_id"]))
            n += 1

    reader = threading.Thread(target=read_ui, daemon=True)
    reader.start()
    poster = threading.Thread(target=post_other, daemon=True)
    poster.start()
    assert server.proc is not None
    next_mark = 0
    started = time.monotonic()
    while True:
        n = int(counter.execute("SELECT COUNT(*) FROM transcript WHERE session_id = ?", (sid,)).fetchone()[0])
        samples.append((time.monotonic(), n))
        cpu.append((sum(cpu_s(w) for w in children(server.proc.pid)), n))
        while next_mark < len(marks) and n >= marks[next_mark]:
            workers = children(server.proc.pid)
            rss[marks[next_mark]] = (rss_mb(server.proc.pid), sum(rss_mb(w) for w in workers))
            next_mark += 1
        if n >= items:
            break
        if time.monotonic() - started > 3600:
            raise SystemExit(f"only {n} items after an hour")
        time.sleep(0.25)
    stop.set()
    reader.join()
    poster.join()
    starts: list[float] = []
    parts: dict[str, list[float]] = {"accepted": [], "admitted": [], "claimed": []}
    for t0, work_id in posted:
        deadline = time.monotonic() + 60
        sql = ("SELECT w.created_at, a.admitted_at, a.started_at FROM work_items w JOIN attempts a USING (work_id)"
               " WHERE work_id = ? AND a.started_at IS NOT NULL ORDER BY a.admitted_at LIMIT 1")
        while (row := counter.execute(sql, (work_id,)).fetchone()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if row is not None:
            created, admitted, started = (float(v) for v in row)
            starts.append((started - t0) * 1000)
            parts["accepted"].append((created - t0) * 1000)
            parts["admitted"].append((admitted - created) * 1000)
            parts["claimed"].append((started - admitted) * 1000)
    http.post(f"/sessions/{sid}/actions", json={"action": "stop"})

    def rate_around(target: int, half: int) -> float:
        window = [(t, n) for t, n in samples if target - half <= n <= target + half]
        if len(window) < 2 or window[-1][0] == window[0][0]:
            return float("nan")
        return (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])

    def cpu_ms_per_item(target: int, half: int) -> float:
        window = [(t, n) for t, n in cpu if target - half <= n <= target + half]
        if len(window) < 2 or window[-1][1] == window[0][1]:
            return float("nan")
        return 1000 * (window[-1][0] - window[0][0]) / (window[-1][1] - window[0][1])

    early_rate = rate_around(early, early // 2)
    late_rate = rate_around(late, max(1, late // 5))
    cpu_early = cpu_ms_per_item(early, early // 2)
    cpu_late = cpu_ms_per_item(late, max(1, late // 5))
    newest = []
    for _ in range(6):
        t0 = time.perf_counter()
        http.get(f"/sessions/{sid}", params={"before": "latest", "limit": 50}).raise_for_status()
        newest.append(time.perf_counter() - t0)
    newest_ms = statistics.median(newest[1:]) * 1000
    result: dict[str, Any] = {
        "items": items,
        f"items_per_s_at_{early}": round(early_rate, 1), "rate_early": round(early_rate, 1),
        "rate_late": round(late_rate, 1),
        f"items_per_s_at_{late}": round(late_rate, 1),
        "rate_ratio": round(late_rate / early_rate, 2), "early": early, "late": late,
        f"worker_cpu_ms_per_item_at_{early}": round(cpu_early, 2),
        f"worker_cpu_ms_per_item_at_{late}": round(cpu_late, 2),
        "snapshot_p50_ms_while_busy": round(percentile(snapshots, 0.5) * 1000, 1),
        "snapshot_p90_ms_while_busy": round(percentile(snapshots, 0.9) * 1000, 1),
        "snapshots_sampled": len(snapshots),
        "newest_page_ms_at_end": round(newest_ms, 1),
        "other_session_post_to_turn_start_ms": {"n": len(starts),
                                                 "median": round(statistics.median(starts), 1) if starts else None,
                                                 "p99": round(percentile(starts, 0.99), 1) if starts else None,
                                                 # medians: POST -> message committed -> admitted -> claimed
                                                 "steps_median": {k: round(statistics.median(v), 1) if v else None
                                                                  for k, v in parts.items()}},
        "rss_mb": {str(k): {"server": round(v[0], 1), "workers": round(v[1], 1)} for k, v in rss.items()},
    }
    server.stop()
    shutil.rmtree(base, ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = run(args.items)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    early, late, n_late = result["rate_early"], result["rate_late"], result["late"]
    cpu_early, cpu_late = result["worker_cpu_ms_per_item_at_1000"], result[f"worker_cpu_ms_per_item_at_{n_late}"]
    print(f"items/s around 1,000: {early:.1f}; around {n_late:,}: {late:.1f} "
          f"(ratio {late / early:.2f}, target >= 0.8: {'PASS' if late / early >= 0.8 else 'FAIL'})")
    print(f"worker CPU per item around 1,000: {cpu_early:.2f} ms; around {n_late:,}: {cpu_late:.2f} ms "
          f"(ratio {cpu_early / cpu_late:.2f}: the same figure without other processes' load)")
    p90 = result["snapshot_p90_ms_while_busy"]
    print(f"snapshot while busy: p50 {result['snapshot_p50_ms_while_busy']} ms, p90 {p90} ms over {result['snapshots_sampled']} reads "
          f"(target p90 < 100 ms: {'PASS' if p90 < 100 else 'FAIL'})")
    newest_ms = result["newest_page_ms_at_end"]
    print(f"newest page of the {args.items:,}-item session: {newest_ms:.1f} ms "
          f"(target < 100 ms: {'PASS' if newest_ms < 100 else 'FAIL'})")
    other_lat = result["other_session_post_to_turn_start_ms"]
    print(f"another session's POST -> turn start while busy: median {other_lat['median']} ms, "
          f"p99 {other_lat['p99']} ms over {other_lat['n']} messages (medians of the steps: {other_lat['steps_median']})")
    for k, v in sorted(result["rss_mb"].items(), key=lambda kv: int(kv[0])):
        print(f"RSS at {int(k):,} items: server {v['server']:.0f} MB, workers {v['workers']:.0f} MB")


if __name__ == "__main__":
    main()
