"""The front door's store functions on SQLite and PostgreSQL (one contract, both backends): keyset
session pages with filters, transcript pages in both directions, and recovery pass records."""

from __future__ import annotations

import json
from typing import Any

from jupyter_goals.models import EffectState, ItemKind
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


def test_a_stop_says_a_command_was_terminated_only_when_one_was(backend: Backend) -> None:
    """The stop marker (item ``stopped:<work>``, reason code ``user_stopped``) says "a command still
    running was terminated" only when this stop ended one: a shell call still running (no live worker:
    the Coordinator kills it) or one the stop itself cancelled. A call never started, a finished one or
    one the person had cancelled alone before the stop leaves "Stopped by you: this turn ended here."."""
    db = backend.open("control", migrated="control")
    ended_here = "Stopped by you: this turn ended here."
    terminated = "Stopped by you: this turn ended here; a command still running was terminated."

    def stopped(call: str | None, then: str, n: int) -> dict[str, Any]:
        def run(tx: Tx) -> dict[str, Any]:
            s = c.create_session(tx, then, "/", "scripted:x", PERMS)
            work = c.create_work(tx, s, "chat", {"text": "slow"}, auto_recover=True, host="h")
            turn_id = c.new_turn(tx, work, False)
            if call is not None:
                c.plan_call(tx, work, turn_id, f"call-{n}", call, {"command": "sleep 10"}, capability="shell",
                            impl_identity="x", impl_digest="d", seq=1)
                eff = tx.one("SELECT * FROM effects WHERE call_id = ?", (f"call-{n}",))
                assert eff is not None
                if then != "planned":
                    c.mark_dispatched(tx, eff, "att-x")
                if then == "committed":
                    c.set_effect_state(tx, eff, EffectState.COMMITTED, "exit status 0")
                elif then == "cancelled by its own Cancel":
                    c.request_cancel_tool(tx, s["session_id"], eff["effect_id"])
                    assert c.commit_cancelled(tx, eff, "cancelled: the person cancelled this call")
                elif then == "cancelled by the stop":  # the worker killed it and committed, then yields
                    c.apply_control(tx, work, "stop", None)
                    assert c.commit_cancelled(tx, eff, "cancelled: the work was stopped")
            if then == "cancelled by the stop":
                c.finish_cancelled(tx, c.get_work(tx, work["work_id"]))
            else:  # no live attempt: the stop persists as cancelled at once
                c.apply_control(tx, c.get_work(tx, work["work_id"]), "stop", None)
            row = tx.one("SELECT content, meta FROM transcript WHERE item_id = ?", (f"stopped:{work['work_id']}",))
            assert row is not None
            return {"content": row["content"], "meta": json.loads(row["meta"]),
                    "phase": c.get_work(tx, work["work_id"])["phase"]}
        return db.transact(run)

    for n, (call, then, words) in enumerate([
        (None, "no call", ended_here),
        ("shell", "planned", ended_here),
        ("shell", "committed", ended_here),
        ("shell", "cancelled by its own Cancel", ended_here),
        ("read_file", "dispatched", ended_here),  # not a command: nothing to kill
        ("shell", "dispatched", terminated),
        ("shell", "cancelled by the stop", terminated),
    ]):
        got = stopped(call, then, n)
        assert got == {"content": words, "meta": {"reason_code": "user_stopped"}, "phase": "cancelled"}, then
