"""A LangGraph checkpointed step (``SqliteSaver``, or ``PostgresSaver``), the second anchor of the per-step figure.

The child process (``python bench/langgraph_step.py DIR [POSTGRESQL_URL]``) serves rounds over stdin/stdout like the DBOS
child of ``step_overhead.py``: a line ``steps K`` runs one graph whose single no-op node loops K times
and answers the per-step seconds. Each step is one LangGraph super-step whose checkpoint is written with
``durability="sync"`` (persisted before the next step starts: the durable choice) by ``SqliteSaver`` on a
real file, WAL, ``synchronous=FULL`` (the same settings as the others), or with a PostgreSQL URL by
``PostgresSaver`` on that server (``langgraph-checkpoint-postgres``; its tables in the URL's schema; the
server's default ``synchronous_commit``: each checkpoint waited onto the disk). A step's time is the time
between two entries of the node: the node, the checkpoint commit and the graph's own bookkeeping.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict


def saver_package(pg_url: str | None) -> str:
    """The distribution of the checkpointer measured: ``PostgresSaver``'s with a URL, else ``SqliteSaver``'s."""
    return "langgraph-checkpoint-sqlite" if pg_url is None else "langgraph-checkpoint-postgres"


class LoopState(TypedDict):
    i: int
    k: int


def child(root: Path, pg_url: str | None = None) -> None:
    from contextlib import ExitStack
    from importlib.metadata import version

    from langgraph.graph import END, START, StateGraph

    stack = ExitStack()
    if pg_url is None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(str(root / "langgraph.sqlite"), check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        saver: Any = SqliteSaver(conn)
        settings = {"journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
                    "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0]}
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        saver = stack.enter_context(PostgresSaver.from_conn_string(pg_url))
        saver.setup()
        row = saver.conn.execute("SHOW synchronous_commit").fetchone()  # a dict: the saver's connection's rows
        settings = {"synchronous_commit": row["synchronous_commit"]}
    stamps: list[float] = []

    def tick(s: LoopState) -> dict[str, int]:
        stamps.append(time.perf_counter())
        return {"i": s["i"] + 1}

    g = StateGraph(LoopState)
    g.add_node("tick", tick)  # type: ignore[call-overload]
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", lambda s: "tick" if s["i"] < s["k"] else END)
    app = g.compile(checkpointer=saver)

    def send(obj: Any) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    send({"ok": True, "version": version("langgraph"), "saver": version(saver_package(pg_url)), "pragmas": settings})
    with stack:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] != "steps":
                break
            k = int(cmd[1])
            stamps.clear()
            app.invoke({"i": 0, "k": k + 1},
                       {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": k + 10}, durability="sync")
            send({"steps": [b - a for a, b in zip(stamps, stamps[1:], strict=False)]})


class LangGraphRunner:
    """The parent's handle on the child: ``steps(k)`` keeps that round's per-step seconds."""

    def __init__(self, root: Path, pg_url: str | None = None) -> None:
        """``pg_url``: ``PostgresSaver`` on that PostgreSQL URL (its tables in the URL's schema); else ``SqliteSaver``."""
        self.proc: subprocess.Popen[str] | None = None
        self.rounds: list[list[float]] = []
        try:
            if pg_url is None:
                import langgraph.checkpoint.sqlite  # noqa: F401
            else:
                import langgraph.checkpoint.postgres  # noqa: F401
        except ImportError as exc:
            self.info: dict[str, Any] = {"ok": False, "reason": f"{saver_package(pg_url)} is not installed ({exc});"
                                                                 " run: pip install -e '.[bench]'"}
            return
        d = root / "langgraph"
        d.mkdir()
        self.stderr = open(d / "stderr.txt", "w+")  # noqa: SIM115 - a file, so a chatty child never blocks
        self.proc = subprocess.Popen([sys.executable, __file__, str(d), *([pg_url] if pg_url else [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.info = self._recv() or self.info

    def _recv(self) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        try:
            return dict(json.loads(line))
        except ValueError:
            self.proc.kill()
            self.proc.wait()
            self.stderr.seek(0)
            err = self.stderr.read().strip().splitlines()[-5:]
            self.info = {"ok": False, "reason": "the LangGraph run failed: " + (" | ".join(err) or "no output")}
            self.proc = None
            return None

    def steps(self, k: int, keep: bool = True) -> None:
        if self.proc is None or not self.info.get("ok"):
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"steps {k}\n")
        self.proc.stdin.flush()
        r = self._recv()
        if r is not None and keep:
            self.rounds.append(r["steps"])

    def finish(self) -> dict[str, Any]:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.stderr.close()
        return self.info


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
