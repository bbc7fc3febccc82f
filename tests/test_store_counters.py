"""PostgreSQL's commit-ordered logs (``Tx.insert_seq``) lock their counter rows in one order, the event
counter first, so two writers that append in opposite orders wait for each other instead of deadlocking.

Seen before the fix on the real server (test_crash_storms.py's PostgreSQL run, about one run in eight): a
worker's transaction appended a transcript item (transcript counter, then its event) while the
Coordinator's held the event counter and wanted the transcript counter; PostgreSQL aborted the worker's
(``deadlock detected``), the worker exited and its death was charged to every chat it ran.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from jupyter_goals.models import ItemKind
from jupyter_goals.store import shared, transcript
from jupyter_goals.store.db import Database, Tx
from tests.servers import wait_for
from tests.storekit import Backend


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_an_event_then_an_item_and_an_item_then_its_event_commit_both_without_a_deadlock(backend: Backend) -> None:
    import psycopg

    backend.open("control", migrated="control")
    url = backend.url("control")
    first, second = Database(url), Database(url)
    b_pid: dict[str, int] = {}
    a_holds, b_ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    with psycopg.connect(url, autocommit=True) as watch:

        def b_waits_on_a_lock() -> bool:
            row = watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (b_pid["pid"],)).fetchone()
            return row is not None and row[0] == "Lock"

        def event_then_item(tx: Tx) -> None:  # holds the event counter, then appends once B waits
            shared.emit(tx, "test.first", {})
            a_holds.set()
            b_ready.wait(10)
            wait_for(b_waits_on_a_lock, timeout=10, what="B's append waiting on a lock A holds")
            transcript.append_item(tx, "ses_a", ItemKind.USER, "user", "from A")

        def item_then_event(tx: Tx) -> None:  # an append: its item, then its event
            b_pid["pid"] = int(tx.scalar("SELECT pg_backend_pid() AS pid"))
            b_ready.set()
            transcript.append_item(tx, "ses_b", ItemKind.USER, "user", "from B")

        def run(db: Database, fn: Any) -> None:
            try:
                db.transact(fn)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(first, event_then_item)),
                   threading.Thread(target=run, args=(second, item_then_event))]
        try:
            threads[0].start()
            assert a_holds.wait(10)
            threads[1].start()
            for t in threads:
                t.join(30)
        finally:
            first.close()
            second.close()
    assert errors == []
    items = Database(url)
    try:
        rows = items.transact(lambda tx: tx.all("SELECT content FROM transcript ORDER BY seq"))
    finally:
        items.close()
    assert [r["content"] for r in rows] == ["from A", "from B"]  # A committed first; B waited for it
