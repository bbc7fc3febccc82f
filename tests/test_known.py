"""store/known.py on real SQLite files: which control store a state dir used, and when it is lost."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from jupyter_goals.store import known, schema
from jupyter_goals.store.db import Database


def migrated(path: Path) -> float:
    db = Database(f"sqlite:///{path}")
    try:
        schema.migrate(db, "control")
        created = db.transact(schema.created_at, write=False)
    finally:
        db.close()
    assert created is not None
    return created


def test_a_store_never_remembered_is_never_lost(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'control.db'}")
    assert known.lost(tmp_path, db) is None  # a first start
    assert not (tmp_path / "control.db").exists()


def test_a_remembered_file_gone_is_lost_and_the_look_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "control.db"
    known.remember(tmp_path, f"sqlite:///{path}", migrated(path))
    assert (tmp_path / known.FILE).stat().st_mode & 0o777 == 0o600
    path.unlink()
    db = Database(f"sqlite:///{path}")
    gone = known.lost(tmp_path, db)
    assert gone is not None and "is gone" in gone.message and "--start-over" in gone.action
    assert not path.exists()
    db.close()


def test_an_empty_file_or_another_store_in_its_place_is_lost_and_the_right_one_back_is_not(tmp_path: Path) -> None:
    path = tmp_path / "control.db"
    url = f"sqlite:///{path}"
    created = migrated(path)
    known.remember(tmp_path, url, created)
    path.rename(tmp_path / "aside.db")

    sqlite3.connect(path).close()  # an empty file
    db = Database(url)
    empty = known.lost(tmp_path, db)
    assert empty is not None and "holds no records" in empty.message
    db.close()
    path.unlink()

    migrated(path)  # another store, with a schema of its own
    db = Database(url)
    other = known.lost(tmp_path, db)
    assert other is not None and "is another control store" in other.message, other
    assert "to use the one there now" in other.action
    db.close()

    path.unlink()
    (tmp_path / "aside.db").rename(path)
    db = Database(url)
    assert known.lost(tmp_path, db) is None
    db.close()


def test_forget_is_the_choice_to_start_over_and_urls_are_remembered_without_their_password(tmp_path: Path) -> None:
    known.remember(tmp_path, "postgresql://me:secret@db.example/goals", 12.5)
    known.remember(tmp_path, f"sqlite:///{tmp_path}/sub/../control.db", 7.0)
    saved = (tmp_path / known.FILE).read_text()
    assert "secret" not in saved
    assert json.loads(saved) == {"postgresql://***@db.example/goals": 12.5, f"sqlite:///{tmp_path}/control.db": 7.0}
    assert known.remembered(tmp_path, "postgresql://me:other@db.example/goals") == 12.5
    assert known.forget(tmp_path, f"sqlite:///{tmp_path / 'control.db'}") is True
    assert known.forget(tmp_path, f"sqlite:///{tmp_path / 'control.db'}") is False
    assert known.remembered(tmp_path, f"sqlite:///{tmp_path / 'control.db'}") is None
