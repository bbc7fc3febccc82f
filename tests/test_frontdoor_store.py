"""The front door's store functions on SQLite and PostgreSQL (one contract, both backends): keyset
session pages with filters, transcript pages in both directions, and recovery pass records."""

from __future__ import annotations

from typing import Any

from jupyter_goals.models import ItemKind
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery_passes as rp
from jupyter_goals.store.db import Tx
from tests.storekit import PERMS, Backend


def test_session_pages_walk_newest_first_and_filter_by_state_and_text(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def seed(tx: Tx) -> list[str]:
        ids = []
        for i in range(7):
            s = c.create_session(tx, f"Title {i} 50%_off" if i % 2 else f"Title {i}", f"/data/p{i}", "scripted:x", PERMS)
            tx.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (1000.0 + i // 2, s["session_id"]))
            ids.append(s["session_id"])
        work = c.create_work(tx, c.get_session(tx, ids[3]), "chat", {"text": "x"}, auto_recover=True, host="h")
        c.set_phase(tx, work, "waiting", "awaiting_approval")
        return ids

    ids = db.transact(seed)
    expected = sorted(ids, key=lambda sid: (1000.0 + ids.index(sid) // 2, sid), reverse=True)  # ties by id

    def walk(limit: int, **kw: Any) -> list[str]:
        out: list[str] = []
        after = None
        while True:
            rows = db.transact(lambda tx, after=after: c.page_sessions(tx, limit=limit, after=after, **kw))
            out += [r["session_id"] for r in rows]
            if len(rows) < limit:
                return out
            after = (rows[-1]["activity"], rows[-1]["session_id"])

    assert walk(2) == walk(3) == walk(100) == expected
    assert walk(2, states=["waiting"]) == [ids[3]]
    assert set(walk(2, states=["idle"])) == set(ids) - {ids[3]}
    assert set(walk(2, text="50%_OFF")) == {ids[1], ids[3], ids[5]}
    assert walk(2, text="5_%") == []  # wildcards are literal
    assert walk(2, text="/data/p6") == [ids[6]]
    row = db.transact(lambda tx: c.page_sessions(tx, limit=1, states=["waiting"]))[0]
    assert row["state"] == "waiting" and row["permissions"] == PERMS


def test_transcript_pages_back_and_forward_with_cursors(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def seed(tx: Tx) -> str:
        sid = str(c.create_session(tx, "t", "/", "scripted:x", PERMS)["session_id"])
        other = str(c.create_session(tx, "o", "/", "scripted:x", PERMS)["session_id"])
        for i in range(10):
            c.append_item(tx, sid, ItemKind.USER, "user", f"m{i}")
            c.append_item(tx, other, ItemKind.USER, "user", f"o{i}")
        return sid

    sid = db.transact(seed)

    def page(**kw: Any) -> dict[str, Any]:
        return db.transact(lambda tx: c.transcript_page(tx, sid, limit=4, **kw))

    latest = page(before=2**62)
    assert [i["content"] for i in latest["items"]] == ["m6", "m7", "m8", "m9"]
    assert latest["next_cursor"] is None and latest["prev_cursor"] == latest["items"][0]["seq"]
    older = page(before=latest["prev_cursor"])
    assert [i["content"] for i in older["items"]] == ["m2", "m3", "m4", "m5"]
    assert older["next_cursor"] == older["items"][-1]["seq"]
    first = page(before=older["prev_cursor"])
    assert [i["content"] for i in first["items"]] == ["m0", "m1"] and first["prev_cursor"] is None
    start = page()
    assert [i["content"] for i in start["items"]] == ["m0", "m1", "m2", "m3"] and start["prev_cursor"] is None
    nxt = page(after=start["next_cursor"])
    assert [i["content"] for i in nxt["items"]] == ["m4", "m5", "m6", "m7"]
    assert page(after=latest["items"][-1]["seq"]) == {"items": [], "next_cursor": None, "prev_cursor": None}


def test_a_recovery_pass_records_each_item_once_with_its_outcome(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def seed(tx: Tx) -> dict[str, str]:
        s = c.create_session(tx, "s", "/", "scripted:x", PERMS)
        made = {}
        for name in ("run", "paused", "stopped", "done"):
            made[name] = c.create_work(tx, s, "chat", {"text": name}, auto_recover=True, host="h")
        c.apply_control(tx, made["paused"], "pause", None)
        c.apply_control(tx, made["stopped"], "stop", None)
        c.set_phase(tx, made["done"], "done", "completed")
        return {k: str(v["work_id"]) for k, v in made.items()}

    work = db.transact(seed)
    assert db.transact(lambda tx: rp.last_pass(tx)) == (None, [])
    found = db.transact(rp.unfinished_work)
    assert found == [work["run"], work["paused"]]  # stopped with no attempt was cancelled at once
    counts = db.transact(lambda tx: rp.record_pass(tx, "pass_1", found, host="h1", boot="b1"))
    assert counts == {"continued": 1, "waiting": 0, "paused": 1, "stopped": 0, "failed": 0}
    db.transact(lambda tx: rp.record_pass(tx, "pass_1", found, host="h1", boot="b1"))  # repeated: no duplicates
    header, rows = db.transact(rp.last_pass)
    assert header is not None and (header["pass_id"], header["host_name"], header["boot_id"]) == ("pass_1", "h1", "b1")
    assert [(r["work_id"], r["detail"]["outcome"], r["reason_code"]) for r in rows] == [
        (work["run"], "continued", "queued"), (work["paused"], "paused", "user_paused")]
    assert rows[1]["detail"]["reason"] == "You paused this work." and rows[0]["title"] == "s"
