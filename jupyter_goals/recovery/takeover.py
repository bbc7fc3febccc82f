"""Takeover of a lost host's work (DESIGN §3): explicit (``jupyter goals takeover --from HOST``,
``POST /actions {action: takeover, host}``, a session's ``takeover`` action) or, with
``allow_cross_host_takeover``, by the Coordinator once that host's leases expired.

One transaction: nothing moves unless every session's folder exists on this host and the old host's
leases have expired. Then each work item moves to this host; the old host's attempts are fenced (a
running one dies, so its worker's next write gets ``FencedError``; an admitted one ends unclaimed); the
calls it had dispatched become unknown outcomes here (never run again without approval: the next turn is
restricted) without looking at any process or file, which live on the old host; and a durable record
plus a ``work.taken_over`` event say who took what over, from where, and when. A host-wide takeover also
fences the old host's workers. The old host, back, claims nothing it lost and reports the exit files
of the taken-over calls as late receipts (``Coordinator._late_receipts``, by dispatch host).
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_goals.identity import ProcessIdentity
from jupyter_goals.models import DesiredState, Phase, ReasonCode, RecoveryMode, TurnState
from jupyter_goals.recovery.interrupt import interrupt_turn, record_decision
from jupyter_goals.store import control as c
from jupyter_goals.store import hosts
from jupyter_goals.store import recovery as rs
from jupyter_goals.store.db import Row, Tx, VersionConflict


@dataclass
class Takeover:
    """What one takeover moved: work ids, the calls whose outcome became unknown, fenced workers."""

    taken: list[str] = field(default_factory=list)
    unknown_calls: list[str] = field(default_factory=list)
    fenced_workers: list[str] = field(default_factory=list)


def claimant() -> str:
    """This process as a recovery claimant (``host|boot|pid|start``, as the Coordinator writes it)."""
    me = ProcessIdentity.current()
    return f"{me.host_name}|{me.boot_id}|{me.pid}|{me.start_time}"


def when(ts: float | None) -> str:
    """A time for people (UTC, to the second)."""
    if ts is None:
        return "a time not recorded"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def unreachable_reason(presence: hosts.HostPresence) -> str:
    """The sentence beside ``owner_host_unreachable``: which host, since when, and what a person can do."""
    return (f"Running on {presence.host} (unreachable since {when(presence.last_seen)}): its work waits until"
            f" {presence.host} is back, or until a person takes it over (jupyter goals takeover --from"
            f" {presence.host}).")


def take_over(tx: Tx, *, from_host: str, to_host: str, by: str, claimant: str, session_id: str | None = None,
              folder_exists: Callable[[str], bool] = os.path.isdir, now: float | None = None) -> Takeover:
    """Move ``from_host``'s unfinished work (of ``session_id`` only, when given) to ``to_host``. Refused
    with ``VersionConflict`` (409), nothing moved, when ``from_host`` is this host or still holds a lease,
    or when a session's folder does not exist here (``folder_exists``, checked on this host)."""
    now = time.time() if now is None else now
    if from_host == to_host:
        raise VersionConflict(f"{from_host} is this host: its work is already here")
    presence = hosts.host_presence(tx, from_host)
    if presence.reachable(now):
        raise VersionConflict(
            f"{from_host} is reachable: its workers hold a lease until {when(presence.lease_until)}. A host's"
            " work is taken over only once its lease has expired (the host is down or cut off).")
    works = hosts.work_of_host(tx, from_host, session_id)
    sessions: dict[str, Row] = {}
    for work in works:
        sessions.setdefault(work["session_id"], c.get_session(tx, work["session_id"]))
    missing = [f"{s['title']!r} ({s['cwd']})" for s in sessions.values() if not folder_exists(s["cwd"])]
    if missing:
        raise VersionConflict(
            f"Nothing was taken over: the folder of {', '.join(missing)} does not exist on {to_host}. Make it"
            f" available here at the same path (a shared or copied folder), then take over again.")
    result = Takeover()
    for work in works:
        if not hosts.move_work(tx, work, to_host):
            continue  # another takeover moved it first
        calls = _fence_attempts(tx, work, from_host, to_host, claimant, now)
        result.taken.append(work["work_id"])
        result.unknown_calls += calls
        hosts.record_takeover(tx, work, from_host=from_host, to_host=to_host, by=by, now=now,
                              detail={"unknown_calls": calls, "session_id": work["session_id"]})
    if session_id is None:
        result.fenced_workers = hosts.fence_host_workers(tx, from_host, f"taken over by {to_host}")
    return result


def _fence_attempts(tx: Tx, work: Row, from_host: str, to_host: str, claimant: str, now: float) -> list[str]:
    """Fence the old host's attempts of one work item and settle its running turn here; the call ids
    whose outcome became unknown."""
    cause = f"host {from_host} was lost and its work taken over by {to_host}"
    unknown_calls: list[str] = []
    fenced = False
    for attempt in rs.live_attempts_of(tx, work["work_id"]):
        if attempt["state"] == "admitted":
            hosts.end_unstarted_attempt(tx, attempt, f"taken over by {to_host} before it started")
            continue
        if not hosts.fence_attempt(tx, attempt, f"taken over by {to_host} from {from_host}"):
            continue
        fenced = True
        key = f"recover:{attempt['attempt_id']}"
        rs.claim_recovery(tx, key, work, claimant, now)
        turn = rs.get_turn(tx, attempt["turn_id"])
        mode = None
        if turn is not None and turn["state"] == TurnState.RUNNING:
            unknown = hosts.dispatched_calls(tx, turn["turn_id"])
            unknown_calls += [str(e["call_id"]) for e in unknown]
            mode = interrupt_turn(tx, work, turn, attempt, unknown, cause)
        record_decision(tx, key, c.get_work(tx, work["work_id"]), attempt, mode or RecoveryMode.NONE)
    if fenced and work["desired_state"] == DesiredState.RUN:
        c.set_phase(tx, c.get_work(tx, work["work_id"]), Phase.RECOVERING, ReasonCode.RECOVERED,
                    f"Taken over from {from_host}: continuing on {to_host}.")
    return unknown_calls


# --------------------------------------------------------------------------- how views show another host's work


@dataclass(frozen=True)
class ForeignOwner:
    """The host that runs a work item, when it is not this server's host: whether it is reachable now
    (one of its workers holds a lease) and when it was last heard from."""

    host: str
    reachable: bool
    last_seen: float | None

    def reason(self) -> str:
        return unreachable_reason(hosts.HostPresence(self.host, None, self.last_seen))


def owner_of(tx: Tx, work: Row, me: str, now: float | None = None) -> ForeignOwner | None:
    """None for this host's own work (no extra read); else the owner host's presence."""
    if work["host_name"] == me:
        return None
    presence = hosts.host_presence(tx, work["host_name"])
    return ForeignOwner(presence.host, presence.reachable(time.time() if now is None else now), presence.last_seen)


def owner_view(view: dict[str, Any], owner: ForeignOwner | None) -> dict[str, Any]:
    """A work view as this host shows another host's work: the owner named, and while that host is
    unreachable its unfinished, running work as ``waiting`` / ``owner_host_unreachable`` with the host and
    since when. Read-only: this host writes nothing about work it does not own."""
    if owner is None or view["phase"] in (Phase.DONE, Phase.CANCELLED):
        return view
    view = {**view, "owner_host": owner.host}
    if owner.reachable:
        return view
    view["unreachable_since"] = owner.last_seen
    if view["desired_state"] == DesiredState.RUN:
        view.update(phase=Phase.WAITING.value, reason_code=ReasonCode.OWNER_HOST_UNREACHABLE.value,
                    reason=owner.reason())
    return view


def may_take_over(work: Mapping[str, Any] | None, owner: ForeignOwner | None) -> bool:
    """``can_takeover``: unfinished work whose owner host is unreachable."""
    return (work is not None and owner is not None and not owner.reachable
            and work["phase"] not in (Phase.DONE, Phase.CANCELLED))
