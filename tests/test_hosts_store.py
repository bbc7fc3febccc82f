"""Several hosts on one store, at the store and takeover level (SQLite and PostgreSQL): a worker claims
only its host's work, a host's recovery reads only its own work and its own late receipts, takeover is
refused while the old host holds a lease or a folder is missing, and once done it fences the old
attempt, makes its dispatched call an unknown outcome, records who took what over, and moves only what
it was asked to; another host's unreachable work is shown waiting ``owner_host_unreachable``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from jupyter_goals.models import ItemKind
from jupyter_goals.recovery import takeover
from jupyter_goals.store import control as c
from jupyter_goals.store import hosts
from jupyter_goals.store import recovery as rs
from jupyter_goals.store.db import Database, FencedError, Tx, VersionConflict
from tests.storekit import PERMS, Backend


def chat_on(tx: Tx, host: str, title: str, cwd: str = "/tmp") -> dict[str, Any]:
    """A chat of ``host`` with one admitted attempt; its work row."""
    session = c.create_session(tx, title, cwd, "scripted:none.json", PERMS)
    msg, _ = c.accept_message(tx, session, "hi", f"req-{title}", "queue", auto_recover=True, host=host)
    work = c.get_work(tx, msg["work_id"])
    c.admit(tx, work, mode="fresh", turn_id=None)
    return c.get_work(tx, msg["work_id"])


def running_call(db: Database, host: str, title: str, worker: str, ttl: float = 30.0,
                 cwd: str = "/tmp") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
    """A chat of ``host`` whose attempt runs on ``worker`` (of ``host``) with one shell call dispatched."""

    def run(tx: Tx) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
        work = chat_on(tx, host, title, cwd)
        gen = c.register_worker(tx, worker, host, "boot-1", 999999, None, ttl)
        attempt = c.claim_attempt(tx, worker, gen, host)
        assert attempt is not None
        c.plan_call(tx, work, attempt["turn_id"], f"call-{title}", "shell", {"command": "sleep 60"},
                    capability="unknown", impl_identity="x", impl_digest="d", seq=1)
        eff = tx.one("SELECT * FROM effects WHERE call_id = ?", (f"call-{title}",))
        assert eff is not None
        c.mark_dispatched(tx, eff, attempt["attempt_id"])
        return work, attempt, eff, gen

    return db.transact(run)


def test_a_worker_claims_only_its_own_hosts_work(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    a_work = db.transact(lambda tx: chat_on(tx, "host-a", "a"))
    gen_b = db.transact(lambda tx: c.register_worker(tx, "wkr_b", "host-b", "boot-1", 1, None, 30.0))
    assert db.transact(lambda tx: c.claim_attempt(tx, "wkr_b", gen_b, "host-b")) is None
    assert db.transact(lambda tx: (c.live_attempts(tx, "host-b"), c.live_attempts(tx, "host-a"))) == (0, 1)
    gen_a = db.transact(lambda tx: c.register_worker(tx, "wkr_a", "host-a", "boot-1", 2, None, 30.0))
    claimed = db.transact(lambda tx: c.claim_attempt(tx, "wkr_a", gen_a, "host-a"))
    assert claimed is not None and claimed["work_id"] == a_work["work_id"]
    assert [w["work_id"] for w in db.transact(lambda tx: rs.unfinished_work(tx, "host-b"))] == []
    assert [w["work_id"] for w in db.transact(lambda tx: rs.unfinished_work(tx, "host-a"))] == [a_work["work_id"]]


def test_takeover_is_refused_while_the_host_holds_a_lease_or_a_folder_is_missing(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    work, *_ = running_call(db, "host-a", "a", "wkr_a", ttl=30.0)

    def take(**kw: Any) -> takeover.Takeover:
        return db.transact(lambda tx: takeover.take_over(tx, from_host="host-a", to_host="host-b", by="ann",
                                                         claimant="host-b|b|1|1", **kw))

    before = db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)
    with pytest.raises(VersionConflict, match="host-a is reachable"):
        take()
    later = time.time() + 60  # the lease has expired by then
    with pytest.raises(VersionConflict, match=r"folder of 'a' \(/tmp\) does not exist on host-b"):
        take(now=later, folder_exists=lambda _: False)
    with pytest.raises(VersionConflict, match="is this host"):
        db.transact(lambda tx: takeover.take_over(tx, from_host="host-b", to_host="host-b", by="ann", claimant="x|y|1|1"))
    assert db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False) == before
    assert db.transact(lambda tx: hosts.takeovers_of(tx, work["work_id"]), write=False) == []


def test_takeover_fences_the_old_attempt_makes_its_call_unknown_and_records_who_took_what(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    work, attempt, eff, gen = running_call(db, "host-a", "a", "wkr_a", ttl=0.01)
    other, *_ = running_call(db, "host-a", "other", "wkr_a2", ttl=0.01)
    time.sleep(0.05)  # both of host-a's leases expire

    moved = db.transact(lambda tx: takeover.take_over(tx, from_host="host-a", to_host="host-b", by="ann on host-b",
                                                      claimant="host-b|b|1|1", session_id=work["session_id"]))
    assert moved.taken == [work["work_id"]] and moved.unknown_calls == [eff["call_id"]]
    assert moved.fenced_workers == []  # one session: the host's workers are not fenced

    def state(tx: Tx) -> dict[str, Any]:
        return {
            "work": c.get_work(tx, work["work_id"]),
            "other": c.get_work(tx, other["work_id"]),
            "attempt": tx.one("SELECT state, end_reason FROM attempts WHERE attempt_id = ?", (attempt["attempt_id"],)),
            "call": tx.one("SELECT state FROM effects WHERE effect_id = ?", (eff["effect_id"],)),
            "turn": tx.one("SELECT state FROM turns WHERE turn_id = ?", (attempt["turn_id"],)),
            "decision": rs.recovery_claim(tx, f"recover:{attempt['attempt_id']}"),
            "records": hosts.takeovers_of(tx, work["work_id"]),
            "items": [(i.item_id, i.kind) for i in c.transcript(tx, work["session_id"])],
            "events": [e["payload"] for e in c.events_after(tx, 0, 10000) if e["kind"] == "work.taken_over"],
        }

    s = db.transact(state, write=False)
    assert s["work"]["host_name"] == "host-b" and s["other"]["host_name"] == "host-a"
    assert s["attempt"]["state"] == "dead" and "taken over by host-b" in s["attempt"]["end_reason"]
    assert s["call"]["state"] == "unknown" and s["turn"]["state"] == "interrupted"
    assert s["decision"]["state"] == "decided" and s["decision"]["mode"] == "new_turn"
    assert (f"repair:{eff['call_id']}", ItemKind.TOOL_RESULT) in s["items"]
    assert (f"interrupt:{attempt['attempt_id']}", ItemKind.INTERRUPTION) in s["items"]
    [record] = s["records"]
    assert (record["from_host"], record["to_host"], record["by"], record["unknown_calls"]) == (
        "host-a", "host-b", "ann on host-b", [eff["call_id"]])
    assert s["events"] == [{"work_id": work["work_id"], "from_host": "host-a", "to_host": "host-b",
                            "by": "ann on host-b", "unknown_calls": [eff["call_id"]]}]
    # the old host's late write is fenced; its recovery no longer sees the work, B's recovery has nothing left
    with pytest.raises(FencedError):
        db.transact(lambda tx: c.fence(tx, attempt["attempt_id"], gen))
    assert db.transact(lambda tx: rs.unrecovered_attempts(tx, "host-b"), write=False) == []
    assert [w["work_id"] for w in db.transact(lambda tx: rs.unfinished_work(tx, "host-a"))] == [other["work_id"]]
    # the unknown call's late receipt is the old host's to report (its exit file is there)
    assert [e["call_id"] for e in db.transact(lambda tx: rs.unknown_shell_effects(tx, "host-a"))] == [eff["call_id"]]
    assert db.transact(lambda tx: rs.unknown_shell_effects(tx, "host-b")) == []

    # the rest of host-a: all of it, and its workers fenced (their next heartbeat fails)
    rest = db.transact(lambda tx: takeover.take_over(tx, from_host="host-a", to_host="host-b", by="ann",
                                                     claimant="host-b|b|1|1"))
    assert rest.taken == [other["work_id"]] and sorted(rest.fenced_workers) == ["wkr_a", "wkr_a2"]
    assert db.transact(lambda tx: c.heartbeat_worker(tx, "wkr_a", gen, 30.0)) is False


def test_another_hosts_unreachable_work_is_shown_waiting_with_the_host_and_since_when(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    work, *_ = running_call(db, "host-a", "a", "wkr_a", ttl=30.0)
    row = db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)
    live = db.transact(lambda tx: takeover.owner_of(tx, row, "host-b"), write=False)
    assert live is not None and live.reachable
    view = takeover.owner_view(c.work_view(row), live)
    assert view["owner_host"] == "host-a" and view["phase"] == "working" and "unreachable_since" not in view
    assert not takeover.may_take_over(row, live)

    lost = db.transact(lambda tx: takeover.owner_of(tx, row, "host-b", now=time.time() + 60), write=False)
    assert lost is not None and not lost.reachable and lost.last_seen is not None
    view = takeover.owner_view(c.work_view(row), lost)
    assert (view["phase"], view["reason_code"]) == ("waiting", "owner_host_unreachable")
    assert view["reason"].startswith("Running on host-a (unreachable since ") and view["unreachable_since"] == lost.last_seen
    assert takeover.may_take_over(row, lost)
    assert db.transact(lambda tx: takeover.owner_of(tx, row, "host-a"), write=False) is None  # its own host
