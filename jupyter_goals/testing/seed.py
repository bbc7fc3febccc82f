"""Seed a real control.db through the real store functions before a server starts on it.

Shared by the REST paging tests, the browser tests (a 20,000-item session opens fast) and
``bench/sessions_list.py``. Nothing is faked: the rows are written by ``store/control.py`` exactly as a
running server writes them, in a state dir a server then opens (its migrations find it current).
"""

from __future__ import annotations

from pathlib import Path

from jupyter_goals.identity import host_name
from jupyter_goals.models import EffectState, ItemKind
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.store.schema import migrate

BATCH = 2000  # items per transaction: one fsync per batch keeps seeding 20,000 items to a few seconds


def open_control(state_dir: Path) -> Database:
    state_dir.mkdir(parents=True, exist_ok=True)
    db = Database(f"sqlite:///{state_dir / 'control.db'}")
    migrate(db, "control")
    return db


def _append_turn(tx: Tx, sid: str, n: int) -> None:
    """Append the n-th group of a realistic transcript: user, tool call, tool result, answer."""
    call = f"{sid}-call-{n}"
    c.append_item(tx, sid, ItemKind.USER, "user", f"message {n}: list the files", item_id=f"{sid}-u-{n}")
    c.append_item(tx, sid, ItemKind.TOOL_CALL, "assistant", "", item_id=f"{sid}-c-{n}", call_id=call, tool="shell",
                  arguments={"command": "ls -la"}, response_id=f"{sid}-r-{n}")
    c.append_item(tx, sid, ItemKind.TOOL_RESULT, "tool", f"exit status: 0\nstdout:\nfile-{n}.txt\nstderr:\n",
                  item_id=f"{sid}-t-{n}", call_id=call, tool="shell", state=str(EffectState.COMMITTED))
    c.append_item(tx, sid, ItemKind.ASSISTANT, "assistant", f"answer {n}: those are the files.",
                  item_id=f"{sid}-a-{n}", response_id=f"{sid}-r-{n}")


def seed_long_session(state_dir: Path, n_items: int, *, title: str = "Long transcript", cwd: str | None = None,
                      model: str = "scripted:seeded") -> str:
    """A session whose transcript has exactly ``n_items`` items (groups of user, tool call, tool result,
    assistant, in seq order). Returns its session_id. Call before the server starts on ``state_dir``
    (or while it runs: SQLite WAL lets it read the new rows). ``model`` is the session's model string
    (e.g. ``jupyter_goals.server.app.demo_model()`` so a message sent later gets an answer)."""
    db = open_control(state_dir)
    try:
        sid = str(db.transact(lambda tx: c.create_session(tx, title, cwd or str(state_dir.parent), model,
                                                         {"mode": "ask", "allow": []}))["session_id"])
        groups, rest = divmod(n_items, 4)
        per_tx = BATCH // 4
        for first in range(0, groups, per_tx):
            def batch(tx: Tx, first: int = first) -> None:
                for g in range(first, min(groups, first + per_tx)):
                    _append_turn(tx, sid, g)

            db.transact(batch)

        def remainder(tx: Tx) -> None:  # single assistant items after the full groups
            for i in range(rest):
                c.append_item(tx, sid, ItemKind.ASSISTANT, "assistant", f"note {i}", item_id=f"{sid}-n-{i}")

        db.transact(remainder)
        return sid
    finally:
        db.close()


def seed_sessions(state_dir: Path, n: int, *, with_work: bool = True, prefix: str = "Session",
                  model: str = "scripted:seeded") -> list[str]:
    """``n`` sessions titled ``f"{prefix} {i}"`` (cwd ``/tmp/project-{i}``), each with one finished chat
    work item when ``with_work``. Returns their ids, oldest first."""
    db = open_control(state_dir)
    try:
        def run(tx: Tx) -> list[str]:
            ids = []
            for i in range(n):
                s = c.create_session(tx, f"{prefix} {i}", f"/tmp/project-{i}", model, {"mode": "ask", "allow": []})
                if with_work:
                    work = c.create_work(tx, s, "chat", {"text": f"hello {i}"}, auto_recover=True, host=host_name())
                    c.consume_input(tx, work)
                    c.finish_work(tx, work)
                    c.set_phase(tx, work, "done", "completed")
                ids.append(str(s["session_id"]))
            return ids

        return db.transact(run)
    finally:
        db.close()
