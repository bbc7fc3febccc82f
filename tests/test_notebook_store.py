"""``store/notebooks.py`` on SQLite and PostgreSQL: one session per notebook path, get-or-create,
rebinding, and renames of a file or of a folder (the store half of ``PUT /notebook-session``)."""

from __future__ import annotations

import pytest

from jupyter_goals.store import control as c
from jupyter_goals.store import notebooks
from jupyter_goals.store.db import NotFound
from tests.storekit import Backend

PERMS = {"mode": "ask", "allow": []}


def test_get_or_create_binds_one_session_per_path(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    first, created = db.transact(lambda tx: notebooks.get_or_create(tx, "a/nb.ipynb", "nb", "/tmp", "m", PERMS))
    again, created_again = db.transact(lambda tx: notebooks.get_or_create(tx, "a/nb.ipynb", "nb", "/tmp", "m", PERMS))
    assert created and not created_again and again["session_id"] == first["session_id"]
    other, _ = db.transact(lambda tx: notebooks.get_or_create(tx, "b.ipynb", "b", "/tmp", "m", PERMS))
    assert other["session_id"] != first["session_id"]
    assert db.transact(lambda tx: tx.scalar("SELECT COUNT(*) FROM notebook_sessions"), write=False) == 2


def test_bind_replaces_the_binding_and_refuses_an_unknown_session(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    db.transact(lambda tx: notebooks.get_or_create(tx, "nb.ipynb", "nb", "/tmp", "m", PERMS))
    sid = db.transact(lambda tx: c.create_session(tx, "other", "/tmp", "m", PERMS))["session_id"]
    assert db.transact(lambda tx: notebooks.bind(tx, "nb.ipynb", sid))["session_id"] == sid
    with pytest.raises(NotFound):
        db.transact(lambda tx: notebooks.bind(tx, "nb.ipynb", "ses_missing"))
    assert db.transact(lambda tx: notebooks.get(tx, "nb.ipynb"), write=False)["session_id"] == sid


def test_rename_moves_a_file_or_everything_under_a_folder_and_nothing_else(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    sids = {p: db.transact(lambda tx, p=p: notebooks.get_or_create(tx, p, p, "/tmp", "m", PERMS))[0]["session_id"]
            for p in ("proj/a.ipynb", "proj/sub/b.ipynb", "project/c.ipynb", "x.ipynb")}
    assert db.transact(lambda tx: notebooks.rename(tx, "proj", "done")) == 2
    assert db.transact(lambda tx: notebooks.rename(tx, "x.ipynb", "y.ipynb")) == 1
    rows = db.transact(lambda tx: tx.all("SELECT path, session_id FROM notebook_sessions ORDER BY path"), write=False)
    assert [(r["path"], r["session_id"]) for r in rows] == [
        ("done/a.ipynb", sids["proj/a.ipynb"]), ("done/sub/b.ipynb", sids["proj/sub/b.ipynb"]),
        ("project/c.ipynb", sids["project/c.ipynb"]), ("y.ipynb", sids["x.ipynb"])]  # "project/" is not under "proj"
    kinds = [e["kind"] for e in db.transact(lambda tx: c.events_after(tx, 0, 100), write=False)]
    assert kinds.count("notebook.renamed") == 3
