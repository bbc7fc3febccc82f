"""Streamed text made durable at a bounded rate, and the partial answer an interruption keeps from it
(issue 32 item 5), on a real control store (SQLite, and PostgreSQL for the store contract).

``DraftStream`` writes ``assistant.draft`` events at most every ``interval_s``, at once when 2 KB are
unwritten, and at the latest ``interval_s`` after a chunk when the stream falls silent; the chunk callback
never waits for a write. ``partial_answer`` turns the newest draft of an unanswered work request into one
assistant item ``partial:<request_id>`` with ``meta.interrupted``: once, never for an answered request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jupyter_goals.models import ItemKind
from jupyter_goals.runtime.drafts import DraftStream
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.store.schema import migrate
from tests.storekit import Backend, new_chat

T = TypeVar("T")


def started(tx: Tx, request_id: str = "req_a") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A chat whose attempt runs and has sent the work request ``request_id``."""
    session, work = new_chat(tx)
    generation = c.register_worker(tx, "wkr_one", "host-a", "boot-1", 4242, None, 10.0)
    c.admit(tx, work, mode="fresh", turn_id=None)
    attempt = c.claim_attempt(tx, "wkr_one", generation)
    assert attempt is not None
    c.record_request(tx, work, request_id=request_id, attempt_id=attempt["attempt_id"], turn_id=attempt["turn_id"],
                     purpose="work", model="scripted:none.json")
    return session, c.get_work(tx, work["work_id"]), attempt


def drafts(db: Database) -> list[str]:
    return [str(e["payload"]["text"]) for e in db.transact(lambda tx: c.events_after(tx, 0, 10000))
            if e["kind"] == "assistant.draft"]


# --------------------------------------------------------------------------- the store: partial_answer


def test_the_newest_draft_of_an_interrupted_request_is_kept_once_before_the_marker(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    session, work, attempt = db.transact(started)
    sid, wid, turn = session["session_id"], work["work_id"], attempt["turn_id"]

    def stream(tx: Tx) -> None:
        for n in range(200):  # other work's events around it: the read is bounded, never confused by them
            c.emit(tx, "work.phase", {"n": n}, session_id="ses_other", work_id="wrk_other")
        c.emit_draft(tx, sid, wid, "req_a", "Hello wor")
        c.emit_draft(tx, "ses_other", "wrk_other", "req_other", "someone else's text")
        c.emit_draft(tx, sid, wid, "req_a", "Hello world, th")

    db.transact(stream)
    seq = db.transact(lambda tx: c.partial_answer(tx, work, turn, "restart", attempt_id=attempt["attempt_id"]))
    assert seq is not None
    # repeated (a second recovery pass), or a stop after the death: nothing more
    assert db.transact(lambda tx: c.partial_answer(tx, work, turn, "restart", attempt_id=attempt["attempt_id"])) is None
    assert db.transact(lambda tx: c.partial_answer(tx, work, turn, "stopped")) is None
    items = db.transact(lambda tx: c.transcript(tx, sid))
    [kept] = [i for i in items if i.meta.get("interrupted")]
    assert (kept.item_id, kept.kind, kept.content, kept.turn_id) == ("partial:req_a", ItemKind.ASSISTANT, "Hello world, th", turn)
    assert kept.meta == {"interrupted": "restart", "request_id": "req_a"}
    # a partial text is never the turn's answer: the resumed attempt asks the model again
    last = db.transact(lambda tx: c.last_item_of_turn(tx, turn))
    assert last is not None and last["kind"] == ItemKind.USER
    assert db.transact(lambda tx: c.last_reply(tx, turn)) is None


def test_an_answered_request_or_one_that_streamed_nothing_keeps_no_partial_text(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    session, work, attempt = db.transact(started)
    sid, wid, turn = session["session_id"], work["work_id"], attempt["turn_id"]
    assert db.transact(lambda tx: c.partial_answer(tx, work, turn, "restart", attempt_id=attempt["attempt_id"])) is None

    def answered(tx: Tx) -> None:
        c.emit_draft(tx, sid, wid, "req_a", "The whole")
        c.append_item(tx, sid, ItemKind.ASSISTANT, "assistant", "The whole answer.", item_id="resp:req_a",
                      work_id=wid, turn_id=turn, response_id="resp:req_a")

    db.transact(answered)
    assert db.transact(lambda tx: c.partial_answer(tx, work, turn, "restart", attempt_id=attempt["attempt_id"])) is None

    def next_request(tx: Tx) -> None:  # the next request streamed nothing yet: its older drafts are not its text
        c.record_request(tx, work, request_id="req_b", attempt_id=attempt["attempt_id"], turn_id=turn,
                         purpose="work", model="scripted:none.json")

    db.transact(next_request)
    assert db.transact(lambda tx: c.partial_answer(tx, work, turn, "restart", attempt_id=attempt["attempt_id"])) is None
    assert not [i for i in db.transact(lambda tx: c.transcript(tx, sid)) if i.meta.get("interrupted")]


def test_a_stop_keeps_the_streamed_text_marked_stopped_then_its_marker(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    session, work, attempt = db.transact(started)
    sid, wid = session["session_id"], work["work_id"]

    def stop(tx: Tx) -> None:
        c.emit_draft(tx, sid, wid, "req_a", "Half an ans")
        c.end_attempt(tx, attempt, "control")  # the worker yields to the stop (turn.py), then the stop ends the turn
        c.apply_control(tx, c.get_work(tx, wid), "stop", None)

    db.transact(stop)
    items = db.transact(lambda tx: c.transcript(tx, sid))
    kinds = [(i.kind, i.content, i.meta.get("interrupted")) for i in items]
    assert kinds[-2:] == [(ItemKind.ASSISTANT, "Half an ans", "stopped"),
                          (ItemKind.INTERRUPTION, "Stopped by you: this turn ended here.", None)], kinds


# --------------------------------------------------------------------------- the worker: DraftStream


def worker_db(tmp_path: Path) -> tuple[Database, str, str]:
    """A migrated SQLite control store opened as a worker opens it (transactions inline), with a chat."""
    url = f"sqlite:///{tmp_path / 'control.db'}"
    setup = Database(url)
    migrate(setup, "control")
    session, work = setup.transact(new_chat)
    setup.close()
    return Database(url, inline=True), session["session_id"], work["work_id"]


def run(tmp_path: Path, scenario: Callable[[DraftStream, Database], Any], **kw: Any) -> Database:
    db, sid, wid = worker_db(tmp_path)

    async def main() -> None:
        await scenario(DraftStream(db, sid, wid, "req_1", **kw), db)

    asyncio.run(main())
    return db


def test_an_answer_that_arrives_at_once_writes_no_draft(tmp_path: Path) -> None:
    async def instant(ds: DraftStream, db: Database) -> None:
        await ds("all at once")
        await ds.close()

    assert drafts(run(tmp_path, instant)) == []


def test_drafts_are_written_at_most_once_per_interval_and_hold_a_prefix_of_the_stream(tmp_path: Path) -> None:
    async def steady(ds: DraftStream, db: Database) -> None:
        for i in range(30):  # 0.6 s of chunks, 20 ms apart
            await ds(f"w{i} ")
            await asyncio.sleep(0.02)
        await ds.close()

    written = drafts(run(tmp_path, steady, interval_s=0.1))
    full = "".join(f"w{i} " for i in range(30))
    assert 3 <= len(written) <= 8, written
    assert all(full.startswith(t) for t in written) and written == sorted(written, key=len)


def test_a_stream_that_falls_silent_is_durable_within_the_interval(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    async def silent(ds: DraftStream, db: Database) -> None:
        await asyncio.sleep(0.15)  # past the first interval, then one chunk and nothing more
        await ds("abc")
        await asyncio.sleep(0.3)
        seen.append(drafts(db))
        await ds.close()

    run(tmp_path, silent, interval_s=0.1)
    assert seen == [["abc"]]


def test_two_kilobytes_unwritten_are_written_at_once_whatever_the_interval(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    async def burst(ds: DraftStream, db: Database) -> None:
        await ds("x" * 1000)
        await asyncio.sleep(0.2)
        seen.append(drafts(db))  # under 2 KB and inside the (long) interval: not yet
        await ds("y" * 1100)
        await asyncio.sleep(0.2)
        seen.append(drafts(db))
        await ds.close()

    run(tmp_path, burst, interval_s=30.0)
    assert seen[0] == [] and seen[1] == ["x" * 1000 + "y" * 1100]


class SlowDatabase(Database):
    """Every transaction takes 0.3 s longer (a busy disk or a far PostgreSQL)."""

    async def run(self, fn: Callable[[Tx], T], *, write: bool = True, durable: bool = True) -> T:
        await asyncio.sleep(0.3)
        return await super().run(fn, write=write, durable=durable)


def test_a_slow_write_never_slows_the_stream_and_close_waits_for_it(tmp_path: Path) -> None:
    db, sid, wid = worker_db(tmp_path)
    slow = SlowDatabase(str(db.url), inline=True)
    db.close()
    took: list[float] = []

    async def main() -> None:
        ds = DraftStream(slow, sid, wid, "req_1", interval_s=0.05)
        await asyncio.sleep(0.06)
        for i in range(20):
            t = time.monotonic()
            await ds(f"c{i} ")
            took.append(time.monotonic() - t)
            await asyncio.sleep(0.01)
        await ds.close(flush=True)  # the stop path: the text received so far, after the write under way

    asyncio.run(main())
    assert max(took) < 0.05, took
    written = drafts(slow)
    assert written[-1] == "".join(f"c{i} " for i in range(20))
    assert len(written) < 20  # coalesced while a write was under way
