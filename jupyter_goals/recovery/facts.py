"""The facts ``decide()`` reads about one work item, loaded by the Coordinator in its pass's transaction
(DESIGN §8): who owns its live attempt, whether it was interrupted, its waits, permissions, budget,
model, tools and deaths. Loading reads only; ``decide()`` (pure) chooses, the Coordinator commits.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_goals.config import GoalsConfig
from jupyter_goals.goals.lifecycle import goal_wait
from jupyter_goals.models import DesiredState, ReasonCode
from jupyter_goals.providers.resolve import check_model
from jupyter_goals.recovery.decide import Owner, RecoveryFacts
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery as rs
from jupyter_goals.store import waits
from jupyter_goals.store.db import Row, Tx
from jupyter_goals.usage import budget
from jupyter_goals.usage.prices import PriceTable


class ToolIdentity(Protocol):
    @property
    def digest(self) -> str: ...


class ToolLookup(Protocol):
    """The trusted tool registry as recovery sees it: a planned call's implementation digest now."""

    def get(self, name: str) -> ToolIdentity | None: ...


@dataclass(frozen=True)
class WorkFacts:
    """One work item's facts, with what the sentences for people need beside them."""

    facts: RecoveryFacts
    held: budget.Problem | None = None  # the hard budget that holds it (what is known, reserved, missing)
    revoked: str | None = None  # the sentence for people when its permissions were revoked


def load_facts(
    tx: Tx, work: Row, session: Row, *, config: GoalsConfig, registry: ToolLookup, prices: PriceTable | None,
    host_name: str, now: float, models: dict[str, ReasonCode | None], dead_workers: frozenset[str] = frozenset(),
    pending_approvals: set[str] | None = None, reads: rs.PassReads | None = None,
) -> WorkFacts:
    """Load one work item's facts. ``models`` caches model checks for one pass (a scripted model
    check parses its file; a pass may run many times a second while work arrives); ``dead_workers``:
    the deaths a pass would confirm (``recover --explain``); ``pending_approvals``: the work ids with a
    pending approval when the pass read them all at once (``rs.works_with_pending_approval``); ``reads``: the
    rest of what an admission pass read at once for all its work items (``rs.pass_reads``), else read here."""
    model = session["model"] or config.default_model
    if model not in models:
        models[model] = check_model(model)
    wid = work["work_id"]
    live = reads.live.get(wid, []) if reads is not None else rs.live_attempts_of(tx, wid)
    owner = Owner.NONE
    died = any(a["worker_id"] in dead_workers for a in live)  # explain: deaths a pass would confirm
    for a in live:
        if a["worker_id"] in dead_workers:
            continue
        if a["state"] == "running" and a["w_host"] not in (None, host_name) and a["w_lease"] < now:
            owner = Owner.UNREACHABLE
        else:
            owner = Owner.LIVE
    turn = reads.open_turns.get(wid) if reads is not None else c.open_turn(tx, work)
    changed: list[str] = []
    if turn is not None:
        planned = (reads.planned.get(turn["turn_id"], []) if reads is not None
                   else rs.planned_tool_digests(tx, turn["turn_id"]))
        for eff in planned:
            spec = registry.get(eff["tool"])
            if spec is not None and eff["impl_digest"] and spec.digest != eff["impl_digest"]:
                changed.append(eff["tool"])
    latest = reads.latest.get(wid) if reads is not None else rs.latest_attempt(tx, wid)
    interrupted = died or (latest is not None and latest["state"] == "dead"
                           and int(latest["control_version"]) == int(work["control_version"]))
    pending = (work["work_id"] in pending_approvals if pending_approvals is not None
               else rs.has_pending_approval(tx, work["work_id"]))
    open_waits = reads.open_waits.get(wid, 0) if reads is not None else waits.open_wait_count(tx, wid)
    revoked = revoked_permissions(tx, work, session)
    # hard budgets are rechecked before every admission, recovery included (never a default limit)
    held = budget.admission_problem(tx, work, model, prices, now)
    facts = RecoveryFacts(
        desired_state=DesiredState(work["desired_state"]),
        reason_code=work["reason_code"],
        owner=owner,
        interrupted=interrupted,
        auto_recover=bool(work["auto_recover"]),
        pending_approval=pending,
        goal_wait=goal_wait(tx, work["work_id"]) if work["kind"] == "goal" else None,
        dependency_wait=ReasonCode.AWAITING_SUBTASK if open_waits else None,
        steer_pending=bool(open_waits) and bool(c.pending_steer(tx, work["work_id"])),
        permission_revoked=revoked is not None,
        budget_problem=held.code if held else None,
        cwd_exists=os.path.isdir(session["cwd"]),
        model_problem=models[model],
        changed_tools=tuple(changed),
        recovery_attempts=int(work["recovery_attempts"]),
        max_recovery_attempts=config.max_recovery_attempts,
        retry_at=float(work["next_attempt_at"] or 0),
        now=now,
        has_open_turn=turn is not None,
        unknown_effects=tuple(u["call_id"] for u in (reads.unknown.get(wid, []) if reads is not None
                                                     else c.unknown_effects(tx, wid))),
    )
    return WorkFacts(facts, held=held, revoked=revoked)


def revoked_permissions(tx: Tx, work: Row, session: Row) -> str | None:
    """The sentence for people when the scope this work runs with grants more than an authority it
    derives from allows now: its session, the chat that started it (a Job, or a subtask of one) or
    its parent (a subtask). The work waits; nothing is widened or narrowed by itself."""
    saved = _scope(work["permission_scope"] or "{}")
    authorities: list[tuple[str, dict[str, Any]]] = [("this session", session["permissions"])]
    if work["job_id"]:
        caller = c.get_session(tx, waits.get_job(tx, work["job_id"])["caller_session_id"])
        authorities.append((f"the chat that started this Job ({caller['title']!r})", caller["permissions"]))
    if work["parent_work_id"]:
        parent = c.get_work(tx, work["parent_work_id"])
        authorities.append(("the parent work", json.loads(parent["permission_scope"] or "{}")))
    for whose, current in authorities:
        if lost := scope_lost(saved, current):
            return (f"The permissions this work ran with were revoked: {whose} no longer allows "
                    f"{', '.join(lost)}. Grant them again and the work continues by itself; or set this"
                    " session's permissions to the narrower ones, or End it.")
    return None


@functools.lru_cache(maxsize=256)
def _scope(text: str) -> dict[str, Any]:
    """A work item's saved permission scope, parsed once per distinct text (a pass meets the same few texts
    for all its items). Shared: read it, never change it."""
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def scope_lost(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What the permission scope ``saved`` lets run that ``current`` no longer does (empty: nothing
    revoked). Only a narrowing counts: a wider ``current`` is never applied to running work by itself."""
    lost: list[str] = []
    if current.get("mode") != "bypass":
        if saved.get("mode") == "bypass":
            lost.append("bypass mode")
        else:
            allowed = current.get("allow") or []
            lost += [f"the allow rule {json.dumps(r, sort_keys=True)}" for r in saved.get("allow") or [] if r not in allowed]
            folders = current.get("folders") or []
            lost += [f"reads in the folder {f}" for f in saved.get("folders") or [] if f not in folders]
    env = current.get("env_allow") or []
    lost += [f"the environment variable {n}" for n in saved.get("env_allow") or [] if n not in env]
    return lost
