"""The session list and a long transcript, measured from outside a real ``jupyter server``.

Run:  python bench/sessions_list.py [--sessions 1000] [--items 20000] [--repeat 5] [--json]

Seeds a fresh state dir through the real store functions (``jupyter_goals/testing/seed.py``): ``--sessions`` sessions
with one finished chat each, and one session with an ``--items``-item transcript; then starts a real
server on it and times HTTP requests with httpx, the way a browser or a script calls the API:

* ``GET /api/goals/sessions`` (first page, default limit 100): time and bytes;
* a full walk of every session with ``next_cursor`` (limit 100 and limit 500): time, bytes, requests;
* ``GET /api/goals/sessions?q=…`` and ``?state=…`` (filtered first page);
* ``GET /api/goals/sessions/{id}?before=latest&limit=200`` on the long transcript, and the same
  page from the start (``?after=0&limit=200``).

Each figure is the median of ``--repeat`` runs (first run discarded as warm-up). For reference, the
issue measured the unpaged list of 1,000 sessions at 638 KB in 0.2-1 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.testing import ServerProcess, write_script
from jupyter_goals.testing.seed import seed_long_session, seed_sessions


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def run(sessions: int = 1000, items: int = 20000, repeat: int = 5) -> dict[str, Any]:
    """The measurements of the module docstring; the JSON object ``--json`` prints (plus the server's RSS
    once they are done, ``server_rss_mb``)."""
    base = Path(tempfile.mkdtemp(prefix="jg-bench-sessions-"))
    state, root = base / "state", base / "root"
    root.mkdir()
    seed_sessions(state, sessions)
    long_sid = seed_long_session(state, items)
    server = ServerProcess(state, root, model=write_script(base / "script.json", []), extra=["--GoalsApp.workers=0"])
    # workers=0: nothing runs, so wait_ready's worker check does not apply; wait for health instead
    server.start(wait=False)
    http = httpx.Client(base_url=f"{server.url}api/goals/", headers={"Authorization": f"token {server.token}"}, timeout=60)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                # health answers while the start runs; the list answering 200 means it is over
                if http.get("health").status_code == 200 and http.get("sessions").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"server did not start:\n{server.log()}")
            time.sleep(0.1)

        def get(path: str, **params: Any) -> httpx.Response:
            r = http.get(path, params=params)
            r.raise_for_status()
            return r

        def walk(limit: int) -> tuple[int, int, int]:
            n = size = requests = 0
            cursor = None
            while True:
                r = get("sessions", limit=limit, **({"cursor": cursor} if cursor else {}))
                body = r.json()
                n, size, requests = n + len(body["sessions"]), size + len(r.content), requests + 1
                cursor = body["next_cursor"]
                if cursor is None:
                    return n, size, requests

        out: dict[str, Any] = {"sessions": sessions + 1, "transcript_items": items}
        t, r = timed(lambda: get("sessions"), repeat)
        out["first_page"] = {"ms": round(t * 1000, 1), "bytes": len(r.content), "rows": len(r.json()["sessions"])}
        for limit in (100, 500):
            t, (n, size, requests) = timed(lambda limit=limit: walk(limit), repeat)
            out[f"walk_limit_{limit}"] = {"ms": round(t * 1000, 1), "bytes": size, "rows": n, "requests": requests}
        t, r = timed(lambda: get("sessions", q="session 99"), repeat)
        out["filter_text"] = {"ms": round(t * 1000, 1), "rows": len(r.json()["sessions"])}
        t, r = timed(lambda: get("sessions", state="idle,queued"), repeat)
        out["filter_state"] = {"ms": round(t * 1000, 1), "rows": len(r.json()["sessions"])}
        t, r = timed(lambda: get(f"sessions/{long_sid}", before="latest", limit=200), repeat)
        out["transcript_latest_page"] = {"ms": round(t * 1000, 1), "bytes": len(r.content),
                                         "items": len(r.json()["transcript"]["items"])}
        t, r = timed(lambda: get(f"sessions/{long_sid}", after=0, limit=200), repeat)
        out["transcript_first_page"] = {"ms": round(t * 1000, 1), "bytes": len(r.content)}
        assert server.proc is not None
        out["server_rss_mb"] = rss_mb(server.proc.pid)
    finally:
        http.close()
        server.kill()
        shutil.rmtree(base, ignore_errors=True)
    return out


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process (``/proc/<pid>/status``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    out = run(args.sessions, args.items, args.repeat)
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['sessions']} sessions, one of them with a {args.items}-item transcript (median of {args.repeat})")
    for key, value in out.items():
        if isinstance(value, dict):
            print(f"  {key:24} " + "  ".join(f"{k}={v}" for k, v in value.items()))


if __name__ == "__main__":
    main()
