"""Pure Goal rules (spec "Todo manages the plan; acceptance manages the objective"): facts in, decision out.

No I/O here. The shell around these functions (``store/goals.py``, ``goals/hooks.py``, ``goals/acceptance.py``) loads the
facts, calls them and commits the decision in one transaction.

- ``after_turn``: the turn-completion check (continue / verify / block / stop). No round cap: only
  the same no-progress reply recurring ``BLOCKED_AFTER`` turns in a row blocks a Goal.
- ``check_requirement``: deterministic requirements judged from real receipts and files.
- ``merge_verdicts`` / ``outcome``: one verdict per requirement; a missing one is ``unknown``.
- ``may_achieve``: only the current goal_id + revision + newest result version may commit ``achieved``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from jupyter_goals.models import (
    TERMINAL_GOAL_STATES,
    Actions,
    Capability,
    EffectState,
    GoalPhase,
    GoalState,
    ReasonCode,
    Requirement,
    Verdict,
)

BLOCKED_AFTER = 3  # the same no-progress reply this many turns in a row is a recurring blocker


class InvalidGoalChange(ValueError):
    """A Goal change the rules forbid (bad requirement, scope reduced without a human reason)."""


# --------------------------------------------------------------------------- requirements


def normalize_requirements(given: Iterable[Requirement | dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every requirement a stable id (``r1``, ``r2`` … for unnamed ones) and check its fields."""
    reqs = [r if isinstance(r, Requirement) else Requirement.model_validate(r) for r in given]
    taken = {r.id for r in reqs if r.id}
    out: list[dict[str, Any]] = []
    n = 0
    for r in reqs:
        rid = r.id
        if rid is None:
            n += 1
            while f"r{n}" in taken:
                n += 1
            rid = f"r{n}"
            taken.add(rid)
        if any(o["id"] == rid for o in out):
            raise InvalidGoalChange(f"requirement id {rid!r} is used twice")
        if r.kind == "command" and not r.command:
            raise InvalidGoalChange(f"requirement {rid}: kind 'command' needs a command")
        if r.kind in ("file_exists", "file_digest") and not r.path:
            raise InvalidGoalChange(f"requirement {rid}: kind {r.kind!r} needs a path")
        if r.kind == "file_digest" and not r.sha256:
            raise InvalidGoalChange(f"requirement {rid}: kind 'file_digest' needs a sha256")
        out.append({"id": rid, "text": r.text, "kind": r.kind, "command": r.command, "path": r.path,
                    "sha256": r.sha256})
    return out


def removed_ids(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[str]:
    """Requirements a revision drops (or weakens: same id, different condition)."""
    now = {r["id"]: r for r in new}
    return [r["id"] for r in old if r["id"] not in now or _condition(now[r["id"]]) != _condition(r)]


def _condition(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r.get("kind"), r.get("command"), r.get("path"), r.get("sha256"), r.get("text"))


def fallback_requirements(objective: str) -> list[dict[str, Any]]:
    """When no verifiable requirement could be extracted, the objective itself is judged by review."""
    return normalize_requirements([Requirement(id="r1", text=objective, kind="semantic")])


# --------------------------------------------------------------------------- turn-completion check


class Next(StrEnum):
    CONTINUE = "continue"
    VERIFY = "verify"
    BLOCK = "block"
    STOP = "stop"


@dataclass(frozen=True)
class TurnFacts:
    state: GoalState
    phase: GoalPhase
    made_progress: bool  # the turn committed a change (a write, a Todo update, an objective revision)
    reply_digest: str  # digest of the turn's final reply
    blocker: str = ""  # digest of the previous no-progress reply
    blocker_count: int = 0
    required_todo: int = 0
    open_required_todo: int = 0
    todo_version: int = 0
    verified_todo_version: int = 0


@dataclass(frozen=True)
class TurnDecision:
    next: Next
    blocker: str = ""
    blocker_count: int = 0


def after_turn(f: TurnFacts) -> TurnDecision:
    """Continue, verify, block or stop after a Goal turn. There is no round cap."""
    if f.state != GoalState.ACTIVE:
        return TurnDecision(Next.STOP, f.blocker, f.blocker_count)
    if f.phase == GoalPhase.VERIFYING:  # a complete candidate was submitted, or a person asked
        return TurnDecision(Next.VERIFY)
    if f.required_todo and not f.open_required_todo and f.todo_version > f.verified_todo_version:
        return TurnDecision(Next.VERIFY)  # every required Todo item is done and not verified yet
    if f.made_progress:
        return TurnDecision(Next.CONTINUE)
    count = f.blocker_count + 1 if f.reply_digest == f.blocker else 1
    if count >= BLOCKED_AFTER:
        return TurnDecision(Next.BLOCK, f.reply_digest, count)
    return TurnDecision(Next.CONTINUE, f.reply_digest, count)


def continuation_prompt(objective: str, requirements: Sequence[dict[str, Any]],
                        open_verdicts: Sequence[dict[str, Any]] = (), note: str = "") -> str:
    """The user-role message that starts the next Goal turn (an internal record, not chat)."""
    lines = [f"Continue working toward the Goal: {objective}"]
    if note:
        lines.append(note)
    status = {v["requirement_id"]: v["verdict"] for v in open_verdicts}
    lines.append("Requirements:")
    for r in requirements:
        mark = f" [{status[r['id']]}]" if r["id"] in status else ""
        lines.append(f"- {r['id']}: {r['text']}{mark}")
    lines.append("When you believe every requirement holds, call update_goal with candidate=true;"
                 " acceptance is checked independently.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- acceptance


@dataclass(frozen=True)
class FileFact:
    exists: bool
    sha256: str | None = None
    mtime: float | None = None


@dataclass(frozen=True)
class CommandRun:
    """A committed ``shell`` effect of the Goal's work: a real receipt."""

    call_id: str
    command: str
    exit_status: int | None
    started_at: float


@dataclass(frozen=True)
class EvidenceFacts:
    files: dict[str, FileFact] = field(default_factory=dict)  # by requirement path
    runs: tuple[CommandRun, ...] = ()  # oldest first
    last_write: dict[str, float] = field(default_factory=dict)  # path -> newest write (effect or mtime)
    unknown_since: float = 0.0  # newest dispatch time of an effect whose outcome is unknown
    last_any_write: float = 0.0  # newest end of any call that may have written (see ``evidence_facts``)


WRITING = frozenset({Capability.IDEMPOTENT, Capability.UNKNOWN})  # a call that may change files
_RAN = frozenset({EffectState.COMMITTED, EffectState.RECONCILED})


def evidence_facts(work_id: str, effects: Iterable[dict[str, Any]], requirements: Sequence[dict[str, Any]],
                   files: dict[str, FileFact], mtimes: dict[str, float]) -> EvidenceFacts:
    """The facts a check reads, from the calls of a Goal's work item and its subtasks (oldest first)
    and the current requirement files.

    - ``runs``: the work item's own committed ``shell`` calls (receipts: command, exit status, start);
    - ``last_write``: per requirement path, its newest ``write_file``/``edit_file`` or its mtime;
    - ``unknown_since``: the newest dispatch of a call whose outcome is unknown;
    - ``last_any_write``: the newest end of a call that ran (committed, reconciled or cancelled) with a
      capability that may write (idempotent or unknown: a write tool, a shell command, an MCP or custom
      tool); runs of the requirements' own commands are checks, not writes.
    """
    checks = {str(r["command"]).strip() for r in requirements if r.get("kind") == "command" and r.get("command")}
    runs: list[CommandRun] = []
    writes: dict[str, float] = {}
    unknown_since = last_any = 0.0
    for e in effects:
        args = e["arguments"] if isinstance(e["arguments"], dict) else json.loads(e["arguments"] or "{}")
        state = e["state"]
        if state == EffectState.UNKNOWN:
            unknown_since = max(unknown_since, float(e["dispatched_at"] or 0))
            continue
        if state in _RAN and e["tool"] == "shell" and e["work_id"] == work_id:
            runs.append(CommandRun(e["call_id"], str(args.get("command", "")), _exit_status(e["result"]),
                                   float(e["dispatched_at"] or 0)))
        if state in _RAN and e["tool"] in ("write_file", "edit_file") and args.get("path"):
            path = str(args["path"])
            writes[path] = max(writes.get(path, 0.0), float(e["ended_at"] or 0))
        a_check = e["tool"] == "shell" and str(args.get("command", "")).strip() in checks
        if (state in _RAN or state == EffectState.CANCELLED) and e["capability"] in WRITING and not a_check:
            last_any = max(last_any, float(e["ended_at"] or e["dispatched_at"] or 0))
    paths = sorted({str(r["path"]) for r in requirements if r.get("path")})
    last_write = {p: max(writes.get(p, 0.0), mtimes.get(p, 0.0)) for p in paths}
    return EvidenceFacts(files=dict(files), runs=tuple(runs), last_write=last_write, unknown_since=unknown_since,
                         last_any_write=last_any)


def _exit_status(text: str | None) -> int | None:
    if not text or not text.startswith("exit status: "):
        return None
    head = text.split("\n", 1)[0].removeprefix("exit status: ").strip()
    return int(head) if head.lstrip("-").isdigit() else None


def check_requirement(req: dict[str, Any], facts: EvidenceFacts) -> dict[str, Any] | None:
    """The verdict of a deterministic requirement from real evidence; None for a semantic one."""
    rid, kind = req["id"], req["kind"]
    if kind == "file_exists":
        f = facts.files.get(req["path"], FileFact(False))
        if f.exists:
            return _verdict(rid, Verdict.MET, [{"kind": "file", "path": req["path"], "sha256": f.sha256, "mtime": f.mtime}])
        return _verdict(rid, Verdict.UNMET, [{"kind": "file", "path": req["path"], "exists": False}])
    if kind == "file_digest":
        f = facts.files.get(req["path"], FileFact(False))
        ok = f.exists and f.sha256 == req["sha256"]
        return _verdict(rid, Verdict.MET if ok else Verdict.UNMET,
                        [{"kind": "file", "path": req["path"], "exists": f.exists, "sha256": f.sha256}])
    if kind == "command":
        runs = [r for r in facts.runs if r.command.strip() == str(req["command"]).strip()]
        if not runs:
            return _verdict(rid, Verdict.UNKNOWN, [{"kind": "missing", "detail": f"no run of {req['command']!r} recorded"}])
        run = runs[-1]
        evidence = [{"kind": "receipt", "call_id": run.call_id, "exit_status": run.exit_status, "at": run.started_at}]
        # what the run checked: its path when given, otherwise anything the agent may have written since
        written = facts.last_write.get(req["path"], 0.0) if req.get("path") else facts.last_any_write
        changed = max(written, facts.unknown_since)
        if changed > run.started_at:  # inputs changed (or may have) after the run: it proves nothing now
            return _verdict(rid, Verdict.UNKNOWN, [*evidence, {"kind": "stale", "changed_at": changed}])
        return _verdict(rid, Verdict.MET if run.exit_status == 0 else Verdict.UNMET, evidence)
    return None


def _verdict(rid: str, verdict: Verdict, evidence: list[dict[str, Any]]) -> dict[str, Any]:
    return {"requirement_id": rid, "verdict": verdict.value, "evidence": evidence}


def merge_verdicts(requirements: Sequence[dict[str, Any]], deterministic: Sequence[dict[str, Any]],
                   review: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One verdict per requirement, in requirement order. Deterministic ones come from evidence and
    are never overridden by the review; a requirement the review did not judge is ``unknown``."""
    det = {v["requirement_id"]: v for v in deterministic}
    rev: dict[str, dict[str, Any]] = {}
    for v in review:
        rid = str(v.get("requirement_id", ""))
        if rid and rid not in rev:
            rev[rid] = v
    out = []
    for r in requirements:
        if r["id"] in det:
            out.append(det[r["id"]])
            continue
        found = rev.get(r["id"])
        if found is None:
            out.append(_verdict(r["id"], Verdict.UNKNOWN, [{"kind": "missing", "detail": "the review gave no verdict"}]))
            continue
        v = found
        verdict = str(v.get("verdict", ""))
        evidence = v.get("evidence", [])
        evidence = evidence if isinstance(evidence, list) else [{"kind": "review", "detail": str(evidence)}]
        out.append(_verdict(r["id"], Verdict(verdict) if verdict in Verdict.__members__.values() else Verdict.UNKNOWN,
                            evidence))
    return out


def current_verdicts(requirements: Sequence[dict[str, Any]], revision: int,
                     acceptance: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The verdict that counts now for each requirement, in requirement order (the Goal answer's
    ``verdicts``; clients only render it): the one of the acceptance that checked this ``revision``,
    with ``checked`` true; ``unknown`` with ``checked`` false where none did — an acceptance of an older
    revision no longer counts."""
    found: dict[str, dict[str, Any]] = {}
    if acceptance is not None and acceptance.get("revision") == revision:
        for v in acceptance.get("verdicts") or []:
            found.setdefault(str(v.get("requirement_id", "")), v)
    out = []
    for r in requirements:
        v = found.get(str(r.get("id", "")))
        out.append({"requirement_id": r.get("id"), "verdict": v["verdict"] if v else Verdict.UNKNOWN.value,
                    "evidence": v.get("evidence", []) if v else [], "checked": v is not None})
    return out


def outcome(verdicts: Sequence[dict[str, Any]]) -> Verdict:
    if verdicts and all(v["verdict"] == Verdict.MET for v in verdicts):
        return Verdict.MET
    if any(v["verdict"] == Verdict.UNMET for v in verdicts):
        return Verdict.UNMET
    return Verdict.UNKNOWN


def may_achieve(*, state: str, phase: str, revision: int, checked_revision: int, result_version: int,
                newest_result_version: int, result: Verdict) -> bool:
    """``achieved`` only for the current goal_id + revision + newest verified result, all met."""
    return (state == GoalState.ACTIVE and phase == GoalPhase.VERIFYING and revision == checked_revision
            and result_version == newest_result_version and result == Verdict.MET)


# --------------------------------------------------------------------------- actions


def goal_actions(state: str, phase: str, reason_code: str) -> Actions:
    """Button permissions for a Goal; clients never infer them from state strings."""
    s = GoalState(state)
    ended = s in TERMINAL_GOAL_STATES
    return Actions(
        can_pause=s in (GoalState.ACTIVE, GoalState.BLOCKED),
        can_resume=s in (GoalState.PAUSED, GoalState.BLOCKED, GoalState.BUDGET_EXHAUSTED),
        can_end=not ended,
        can_retry=False,
        can_verify=s in (GoalState.ACTIVE, GoalState.BLOCKED) and phase != GoalPhase.VERIFYING,
        reason_code=reason_code or (str(ReasonCode.GOAL_ACHIEVED) if s == GoalState.ACHIEVED else ""),
    )
