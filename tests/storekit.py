"""Shared store-test kit: one Backend per database kind (SQLite file or a private PostgreSQL schema).

The `backend` fixture itself lives in conftest.py so every test module gets it without imports.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.store.schema import migrate

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
PERMS = {"mode": "ask", "allow": []}


@functools.cache
def postgres_unreachable() -> str | None:
    try:
        import psycopg

        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
    except Exception as exc:  # ImportError included: no driver, no PostgreSQL tests
        where, _, database = PG_ADMIN_URL.rpartition("@")[2].partition("/")
        return f"PostgreSQL at {where} (database '{database}') is unreachable: {exc}"
    return None


def require(reason: str | None) -> None:
    """A test that needs something this machine lacks (``reason`` says what): in CI (``CI`` set) the
    test fails with the reason, so a PostgreSQL variant never passes as a silent skip; elsewhere it is
    skipped with the reason (the summary prints it: addopts has ``-rs``)."""
    import pytest

    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {reason}. CI runs every PostgreSQL test: start PostgreSQL (.ci/run does) "
                    "or unset CI to skip them locally.", pytrace=False)
    pytest.skip(reason)


def require_postgres() -> None:
    """The PostgreSQL server on 127.0.0.1:5432 (database ``test``) answers, else :func:`require` fails or skips."""
    require(postgres_unreachable())


class Backend:
    """Opens named databases ('control', 'usage', ...) of one kind; each name is its own database."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.token = uuid.uuid4().hex[:10]
        self.schemas: list[str] = []
        self.opened: list[Database] = []

    def url(self, name: str) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp_path / f'{name}.db'}"
        schema_name = f"test_{self.token}_{name}"
        if schema_name not in self.schemas:
            self._admin(f'CREATE SCHEMA "{schema_name}"')
            self.schemas.append(schema_name)
        return f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema_name}"

    def path(self, name: str) -> Path:
        assert self.kind == "sqlite"
        return self.tmp_path / f"{name}.db"

    def open(self, name: str, *, migrated: str | None = None) -> Database:
        db = Database(self.url(name))
        self.opened.append(db)
        if migrated:
            migrate(db, migrated)
        return db

    def close_all(self) -> None:
        for db in self.opened:
            db.close()
        self.opened.clear()

    def cleanup(self) -> None:
        self.close_all()
        for schema_name in self.schemas:
            self._admin(f'DROP SCHEMA IF EXISTS "{schema_name}" CASCADE')

    @staticmethod
    def _admin(sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]


def new_chat(tx: Tx, text: str = "hello", client_request_id: str = "req-1") -> tuple[dict[str, Any], dict[str, Any]]:
    session = c.create_session(tx, "chat", "/tmp", "scripted:none.json", PERMS)
    msg, created = c.accept_message(tx, session, text, client_request_id, "queue", auto_recover=True, host="host-a")
    assert created
    return session, c.get_work(tx, msg["work_id"])


def request(rid: str, model: str = "openai:m", **extra: Any) -> dict[str, Any]:
    return {"request_id": rid, "session_id": "ses_1", "work_id": "wrk_1", "turn_id": "trn_1", "goal_id": "gol_1",
            "goal_revision": 3, "purpose": "work", "provider": model.partition(":")[0], "model": model,
            "created_at": time.time(), **extra}
