"""A tool loop's step rate in a long session, with and without a model context window (issue 33 item 4).

Run:  python -m bench.windowed_loop [--small 10000] [--large 100000] [--loop-items 2000] [--quick] [--json]

Target: on a model with a context window (so history is compacted), a ``read_file`` tool loop's
items/s in a session that already holds ``--large`` (100,000) transcript items is at least 0.9x the
rate in one that holds ``--small`` (10,000). A loop from 0 to 100,000 items would take far longer than
the whole benchmark command may, so each run starts from a seeded history instead:

1. a fresh state dir gets a session with an N-item transcript, written by the product's own store
   functions (``jupyter_goals/testing/seed.py``, ``seed_long_session``: groups of user message, shell
   call, its committed result, answer), whose model is the loop's and whose folder is the server's root;
2. a real ``jupyter server`` starts on it (``ServerProcess``); the session's permissions become
   ``bypass`` over REST (``PATCH /sessions/{id}``) and one message is posted to that same session;
3. its scripted model answers every work request with a ``read_file`` call (three transcript items a
   step: the answer, its call, the call's result; ``items_per_step`` in the detail) and every
   compaction request with a short summary;
4. the first request of the turn reads the whole seeded history (the worker's history cache is
   empty) and, on the windowed model, must compact it first: that warm-up is reported separately
   (POST -> the first compaction summary, POST -> the first new tool result); the rate is then
   measured over the next ``--loop-items`` items from the items' own ``created_at`` (read-only from
   control.db), so polling adds no error, together with the workers' CPU ms per item (/proc), which
   load from other processes on the machine skews less; each size runs ``--repeat`` (3) times,
   interleaved, and its best rate counts (a 2,000-item window lasts about 2 s: one busy moment of
   another process on the machine moves a single run by 30%);
5. every compaction is counted (``transcript`` items of kind ``compaction`` and ``requests`` rows of
   purpose ``compaction``): in the warm-up (with how many items its summary covers: the whole
   seeded history plus the new message shows it was read) and inside the measured window.

The windowed model is a named model (``--GoalsApp.models``, ``provider: scripted`` with the script's path
as ``model`` and ``context_window: --window`` tokens): a request is compacted once the history would
fill 80% of it (``runtime/turn.py`` ``COMPACT_AT``). The same is measured on the plain script as model
(no context window: history is never compacted, every request carries all of it) at ``--small`` and
``--nowindow-large`` (50,000) seeded items over fewer loop items: that rate falls with the history,
and it is what a user of a model configured without ``context_window`` meets.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.long_session import children, cpu_s
from jupyter_goals.testing import ServerProcess, write_script
from jupyter_goals.testing.seed import seed_long_session

MODEL_NAME = "loop-windowed"
SUMMARY = "The user asked to read small.txt over and over; it was read many times, always 'a short file'."
# small enough that the measured window holds several compactions (about one every 600 loop items); a
# step's cost is bounded by the window, not by the transcript, whatever its size
WINDOW = 4000
TIMEOUT_S = 900.0  # one run; a loop that gets nowhere for this long is a failure, not a figure


def write_loop_script(path: Path) -> str:
    """The scripted model: a short summary for a compaction request, a ``read_file`` call for anything else."""
    return write_script(path, [{"when": {"purpose": "compaction"},
                                "respond": {"text": SUMMARY, "usage": {"input_tokens": 1000, "output_tokens": 30}}}],
                        {"tool_calls": [{"name": "read_file", "arguments": {"path": "small.txt"}}],
                         "usage": {"input_tokens": 10, "output_tokens": 5}})


def one_run(seeded: int, loop_items: int, *, window: int | None) -> dict[str, Any]:
    """Seed a session with ``seeded`` items, start a server, run the loop in that session for the warm-up
    plus ``loop_items`` items; ``window``: the model's context window in tokens (None: the plain script,
    never compacted)."""
    base = Path(tempfile.mkdtemp(prefix="jg-bench-windowed-"))
    state, root = base / "state", base / "root"
    root.mkdir()
    (root / "small.txt").write_text("a short file\n")
    script = write_loop_script(base / "loop.json")
    extra: list[str] = []
    if window is not None:
        models = {MODEL_NAME: {"provider": "scripted", "model": script.removeprefix("scripted:"),
                               "context_window": window}}
        extra.append(f"--GoalsApp.models={json.dumps(models)}")
    session_model = MODEL_NAME if window is not None else script

    t0 = time.perf_counter()
    sid = seed_long_session(state, seeded, title=f"seeded {seeded}", cwd=str(root), model=session_model)
    seed_s = time.perf_counter() - t0

    server = ServerProcess(state, root, model=script, extra=extra)
    http: httpx.Client | None = None
    counter: sqlite3.Connection | None = None
    try:
        t0 = time.perf_counter()
        server.start(timeout=120)
        start_s = time.perf_counter() - t0
        assert server.proc is not None
        http = httpx.Client(base_url=server.url + "api/goals", headers={"Authorization": f"token {server.token}"},
                            timeout=120)
        # the seeded session asks before tools run (seed.py): bypass, as a person would set it
        http.patch(f"/sessions/{sid}", json={"permissions": {"mode": "bypass", "allow": []}}).raise_for_status()
        counter = sqlite3.connect(f"file:{state / 'control.db'}?mode=ro", uri=True)
        last_seeded = int(counter.execute("SELECT MAX(seq) FROM transcript WHERE session_id = ?", (sid,)).fetchone()[0])
        seeded_rows = int(counter.execute("SELECT COUNT(*) FROM transcript WHERE session_id = ?", (sid,)).fetchone()[0])
        assert seeded_rows == seeded, (seeded_rows, seeded)

        posted = time.time()
        http.post(f"/sessions/{sid}/messages", json={"text": "read small.txt forever", "client_request_id": "go"}
                  ).raise_for_status()

        def first_new(kind: str) -> tuple[int, float] | None:
            row = counter.execute("SELECT seq, created_at FROM transcript WHERE session_id = ? AND seq > ? AND kind = ?"
                                  " ORDER BY seq LIMIT 1", (sid, last_seeded, kind)).fetchone() if counter else None
            return None if row is None else (int(row[0]), float(row[1]))

        deadline = time.monotonic() + TIMEOUT_S
        while (first := first_new("tool_result")) is None:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                raise SystemExit(f"no tool result {TIMEOUT_S:.0f} s after the message:\n{server.log()[-4000:]}")
            time.sleep(0.05)
        first_seq, first_at = first
        cpu_start = sum(cpu_s(w) for w in children(server.proc.pid))
        n_start = int(counter.execute("SELECT COUNT(*) FROM transcript WHERE session_id = ? AND seq > ?",
                                      (sid, first_seq)).fetchone()[0])
        while True:
            n = int(counter.execute("SELECT COUNT(*) FROM transcript WHERE session_id = ? AND seq > ?",
                                    (sid, first_seq)).fetchone()[0])
            if n >= loop_items:
                break
            if time.monotonic() > deadline or server.proc.poll() is not None:
                raise SystemExit(f"only {n} of {loop_items} loop items after {TIMEOUT_S:.0f} s:\n{server.log()[-4000:]}")
            time.sleep(0.1)
        cpu_end = sum(cpu_s(w) for w in children(server.proc.pid))
        http.post(f"/sessions/{sid}/actions", json={"action": "stop"})
        # the window: the first new tool result, then exactly loop_items items; timed by their created_at
        row = counter.execute("SELECT seq, created_at FROM transcript WHERE session_id = ? AND seq > ?"
                              " ORDER BY seq LIMIT 1 OFFSET ?", (sid, first_seq, loop_items - 1)).fetchone()
        last_seq, last_at = int(row[0]), float(row[1])
        rate = loop_items / (last_at - first_at) if last_at > first_at else float("nan")

        def compactions(lo: int, hi: int) -> int:
            return int(counter.execute("SELECT COUNT(*) FROM transcript WHERE session_id = ? AND kind = 'compaction'"
                                       " AND seq > ? AND seq <= ?", (sid, lo, hi)).fetchone()[0]) if counter else 0

        compaction_requests = int(counter.execute(
            "SELECT COUNT(*) FROM requests WHERE session_id = ? AND purpose = 'compaction'", (sid,)).fetchone()[0])
        work_requests = [float(r[0]) for r in counter.execute(
            "SELECT created_at FROM requests WHERE session_id = ? AND purpose = 'work' ORDER BY created_at", (sid,))]
        summary = first_new("compaction")
        covered = None  # items the warm-up summary stands for: the whole seeded history, when it was read
        if summary is not None:
            meta = counter.execute("SELECT meta FROM transcript WHERE seq = ?", (summary[0],)).fetchone()[0]
            covered = int(counter.execute("SELECT COUNT(*) FROM transcript WHERE session_id = ? AND seq <= ?",
                                          (sid, int(json.loads(meta)["up_to_seq"]))).fetchone()[0])
        items_per_step = round(loop_items / max(1, sum(1 for t in work_requests if first_at < t <= last_at)), 2)
        return {
            "seeded_items": seeded, "window_tokens": window, "loop_items": loop_items,
            "seed_s": round(seed_s, 2), "server_start_s": round(start_s, 2),
            "first_compaction_s": round(summary[1] - posted, 3) if summary else None,
            "first_summary_covers_items": covered,
            "first_result_s": round(first_at - posted, 3),
            "rate": round(rate, 1), "loop_s": round(last_at - first_at, 2),
            # cpu sampled at the poll that saw the first result and the one that saw the end: close, not exact
            "worker_cpu_ms_per_item": round(1000 * (cpu_end - cpu_start) / max(1, n - n_start), 3),
            "items_per_step": items_per_step,
            "compactions_warmup": compactions(last_seeded, first_seq),
            "compactions_in_window": compactions(first_seq, last_seq),
            "compactions_total": compactions(last_seeded, 1 << 62), "compaction_requests": compaction_requests,
        }
    finally:
        if counter is not None:
            counter.close()
        if http is not None:
            http.close()
        if server.proc is not None:
            server.kill()
        shutil.rmtree(base, ignore_errors=True)


def pair(small: list[dict[str, Any]], large: list[dict[str, Any]]) -> dict[str, Any]:
    """The two sizes' figures from their runs: the best rate of each size (its run is the one detailed),
    every rate beside it."""
    s, b = (max(runs, key=lambda d: d["rate"]) for runs in (small, large))
    ratio = b["rate"] / s["rate"] if s["rate"] else float("nan")
    cpu_ratio = s["worker_cpu_ms_per_item"] / b["worker_cpu_ms_per_item"] if b["worker_cpu_ms_per_item"] else float("nan")
    return {"rate_small": s["rate"], "rate_large": b["rate"], "ratio": round(ratio, 3),
            "rates_small": [d["rate"] for d in small], "rates_large": [d["rate"] for d in large],
            "cpu_ms_per_item_small": s["worker_cpu_ms_per_item"], "cpu_ms_per_item_large": b["worker_cpu_ms_per_item"],
            "cpu_ratio": round(cpu_ratio, 3),
            "compactions_small": s["compactions_total"], "compactions_large": b["compactions_total"],
            "first_result_s_small": s["first_result_s"], "first_result_s_large": b["first_result_s"],
            "seed_s_small": s["seed_s"], "seed_s_large": b["seed_s"],
            "detail": {"small": s, "large": b}}


def run(small: int = 10000, large: int = 100000, loop_items: int = 2000, nowindow_large: int = 50000,
        nowindow_items: int = 200, window: int = WINDOW, repeat: int = 3) -> dict[str, Any]:
    """The runs of the module docstring: windowed at ``small`` and ``large`` seeded items over ``loop_items``,
    ``repeat`` times each, interleaved, the best rate of each size counting; without a window once at
    ``small`` and ``nowindow_large`` over ``nowindow_items``. ``window``: the named model's context window
    in tokens."""
    started = time.perf_counter()
    w_small: list[dict[str, Any]] = []
    w_large: list[dict[str, Any]] = []
    for _ in range(max(1, repeat)):
        w_small.append(one_run(small, loop_items, window=window))
        w_large.append(one_run(large, loop_items, window=window))
    n_small = one_run(small, nowindow_items, window=None)
    n_large = one_run(nowindow_large, nowindow_items, window=None)
    windowed = pair(w_small, w_large)
    windowed["pass"] = windowed["ratio"] >= 0.9
    return {"windowed": windowed, "no_window": pair([n_small], [n_large]),
            "sizes": {"small": small, "large": large, "loop_items": loop_items, "nowindow_large": nowindow_large,
                      "nowindow_items": nowindow_items, "window_tokens": window, "repeat": max(1, repeat)},
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=None, help="seeded items of the small session (default 10,000)")
    p.add_argument("--large", type=int, default=None, help="seeded items of the large windowed one (default 100,000)")
    p.add_argument("--loop-items", type=int, default=None, help="items measured on the windowed model (default 2,000)")
    p.add_argument("--nowindow-large", type=int, default=None, help="seeded items of the large no-window one (50,000)")
    p.add_argument("--nowindow-items", type=int, default=None, help="items measured without a window (default 200)")
    p.add_argument("--window", type=int, default=WINDOW, help="the windowed model's context window in tokens")
    p.add_argument("--repeat", type=int, default=3, help="windowed runs per size, interleaved; the best rate counts")
    p.add_argument("--quick", action="store_true", help="a tenth of the seeded sizes (1,000 / 10,000 / 5,000)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    q = args.quick
    result = run(args.small or (1000 if q else 10000), args.large or (10000 if q else 100000),
                 args.loop_items or (1000 if q else 2000), args.nowindow_large or (5000 if q else 50000),
                 args.nowindow_items or (100 if q else 200), args.window, args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    s = result["sizes"]
    w, n = result["windowed"], result["no_window"]
    print(f"windowed model ({s['window_tokens']:,}-token context window), {s['loop_items']:,} loop items each:")
    print(f"  items/s with {s['small']:,} seeded: {w['rate_small']}; with {s['large']:,}: {w['rate_large']} "
          f"(ratio {w['ratio']:.2f}, target >= 0.9: {'PASS' if w['pass'] else 'FAIL'})")
    print(f"  every run's items/s: {w['rates_small']} / {w['rates_large']} (best of {s['repeat']} counts)")
    print(f"  worker CPU ms/item: {w['cpu_ms_per_item_small']} / {w['cpu_ms_per_item_large']} (ratio {w['cpu_ratio']:.2f})")
    for label, d in (("small", w["detail"]["small"]), ("large", w["detail"]["large"])):
        print(f"  {label}: seeded in {d['seed_s']} s; POST -> first summary {d['first_compaction_s']} s, -> first "
              f"new tool result {d['first_result_s']} s; compactions: {d['compactions_warmup']} in the warm-up "
              f"(covering {d['first_summary_covers_items']:,} items), "
              f"{d['compactions_in_window']} in the measured window ({d['compaction_requests']} requests)")
    print(f"no context window (never compacted), {s['nowindow_items']:,} loop items each:")
    print(f"  items/s with {s['small']:,} seeded: {n['rate_small']}; with {s['nowindow_large']:,}: {n['rate_large']} "
          f"(ratio {n['ratio']:.2f}; every request carries the whole history)")
    print(f"  POST -> first new tool result: {n['first_result_s_small']} s / {n['first_result_s_large']} s; "
          f"compactions: {n['compactions_small']} / {n['compactions_large']}")
    print(f"wall time: {result['wall_s']} s")


if __name__ == "__main__":
    main()
