"""Every notebook_sessions statement: one durable session per notebook path (control schema v6).

A notebook's chat and Goals live in the session bound to its path, so a kernel restart (which
forgets everything) finds them again by asking for its path. The contents manager's renames move
the binding with the file; a copy starts a new conversation (it gets no binding until first used).
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Row, Tx


def view(row: Row) -> dict[str, Any]:
    return {"path": row["path"], "session_id": row["session_id"], "created_at": row["created_at"],
            "updated_at": row["updated_at"]}


def get(tx: Tx, path: str) -> Row | None:
    return tx.one("SELECT * FROM notebook_sessions WHERE path = ?", (path,))


def bind(tx: Tx, path: str, session_id: str) -> Row:
    """Bind ``path`` to an existing session (``%goal --new`` / ``--session=``), replacing any binding."""
    c.get_session(tx, session_id)  # NotFound → 404
    now = time.time()
    if get(tx, path) is None:
        tx.execute("INSERT INTO notebook_sessions (path, session_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                   (path, session_id, now, now))
    else:
        tx.execute("UPDATE notebook_sessions SET session_id = ?, updated_at = ? WHERE path = ?", (session_id, now, path))
    c.emit(tx, "notebook.bound", {"path": path}, session_id=session_id)
    row = get(tx, path)
    assert row is not None
    return row


def get_or_create(tx: Tx, path: str, title: str, cwd: str, model: str,
                  permissions: dict[str, Any], by: str | None = None) -> tuple[Row, bool]:
    """The session bound to ``path``, else a new session bound to it in the same transaction (its allow
    rules recorded as added by ``by`` with the session)."""
    row = get(tx, path)
    if row is not None:
        return row, False
    session = c.create_session(tx, title, cwd, model, permissions)
    c.record_allow_rules(tx, session["session_id"], [], permissions.get("allow") or [], by, "created",
                         session["created_at"])
    return bind(tx, path, session["session_id"]), True


def rename(tx: Tx, old: str, new: str) -> int:
    """Follow a contents-manager rename of a file or a directory: every binding at ``old`` or under
    ``old/`` moves to the same place under ``new``. Returns how many moved."""
    rows = tx.all("SELECT * FROM notebook_sessions WHERE path = ? OR substr(path, 1, ?) = ?",
                  (old, len(old) + 1, old + "/"))
    now = time.time()
    for row in rows:
        target = new + row["path"][len(old):]
        # the contents manager refuses to overwrite, so a binding at the target belongs to a deleted file
        tx.execute("DELETE FROM notebook_sessions WHERE path = ?", (target,))
        tx.execute("UPDATE notebook_sessions SET path = ?, updated_at = ? WHERE path = ?", (target, now, row["path"]))
        c.emit(tx, "notebook.renamed", {"path": target, "source_path": row["path"]}, session_id=row["session_id"])
    return len(rows)
