"""Slash commands of the ACP agent (``/goal``, ``/goal status``, ``/pause``, ``/resume``, ``/stop``,
``/verify``), the recovered state told after ``session/load`` and ``usage_update`` from the ledger.

Commands go through the same REST routes as every other client: ``POST /goals``,
``POST /sessions/{id}/actions``, ``POST /goals/{id}/actions``. A control the server refuses (409, or not
offered by its ``actions``) answers the prompt with stop reason ``refusal`` and the server's words."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import acp.schema
from acp.schema import (
    AvailableCommand,
    AvailableCommandInput,
    AvailableCommandsUpdate,
    UnstructuredCommandInput,
)

from jupyter_goals.clients.rest import GoalsError

StopReason = Literal["end_turn", "refusal"]

COMMANDS: tuple[tuple[str, str, str | None], ...] = (
    ("goal", "Start a Goal: /goal <objective>, requirements on the following lines; /goal status shows it",
     "<objective> (requirements on the next lines) or: status"),
    ("pause", "Pause this session's work (it stays durable; /resume goes on)", None),
    ("resume", "Resume this session's paused work", None),
    ("stop", "Stop this session's work (its running command is killed)", None),
    ("verify", "Check the current Goal's requirements again", None),
)
SESSION_ACTIONS = ("pause", "resume", "stop")
# the transcript's words for a work item's phase, told after a load (done work tells nothing)
PHASE_WORDS = {"queued": "running", "working": "running", "recovering": "running (recovering)",
               "waiting": "waiting", "paused": "paused", "cancelled": "stopped", "failed": "failed",
               "interrupted": "interrupted"}


class CommandHost(Protocol):
    async def get(self, path: str, params: dict[str, Any] | None) -> Any: ...

    async def post(self, path: str, body: dict[str, Any], method: str = "POST") -> Any: ...


@dataclass
class Reply:
    text: str
    stop_reason: StopReason = "end_turn"


def commands_update() -> AvailableCommandsUpdate:
    return AvailableCommandsUpdate(session_update="available_commands_update", available_commands=[
        AvailableCommand(name=name, description=text,
                         input=AvailableCommandInput(root=UnstructuredCommandInput(hint=hint)) if hint else None)
        for name, text, hint in COMMANDS])


def parse(text: str) -> tuple[str, str, str] | None:
    """``/name rest-of-line`` and the following lines, for a known command; None for any other prompt."""
    if not text.startswith("/"):
        return None
    first, _, body = text.partition("\n")
    name, _, rest = first[1:].partition(" ")
    if name not in {n for n, _, _ in COMMANDS}:
        return None
    return name, rest.strip(), body


def goal_request_id(request_key: str) -> str:
    """The ``client_request_id`` of the Goal one ACP prompt request starts (``request_key``: the key the
    agent derives from that request, as for a message): a retried ``/goal`` prompt answers the same Goal
    instead of a 409, whatever the key's length."""
    return "acp-goal-" + hashlib.sha256(request_key.encode()).hexdigest()[:32]


async def run(host: CommandHost, session_id: str, name: str, rest: str, body: str, *,
              request_key: str | None = None) -> Reply:
    """``request_key``: the prompt request's idempotency key (``feed.client_request_id``); ``/goal`` sends
    one derived from it, so the same request sent again never starts a second Goal."""
    try:
        if name == "goal":
            if rest == "status" and not body.strip():
                return await goal_status(host, session_id)
            return await start_goal(host, session_id, rest, body, request_key=request_key)
        if name in SESSION_ACTIONS:
            return await session_action(host, session_id, name)
        return await verify(host, session_id)
    except GoalsError as exc:
        if exc.status in (400, 404, 409):
            return Reply(f"Refused: {exc.message}", "refusal")
        raise


async def start_goal(host: CommandHost, session_id: str, objective: str, body: str, *,
                     request_key: str | None = None) -> Reply:
    if not objective:
        return Reply("Usage: /goal <objective>, with requirements on the following lines"
                     " (`command: …`, `file_exists: path`, `file_digest: path sha256`, or plain text); /goal status")
    from IPython.core.error import UsageError

    from jupyter_goals.clients.notebook.magics import parse_requirements  # the rules %%goal takes

    try:
        requirements = parse_requirements(body) if body.strip() else None
    except UsageError as exc:
        return Reply(f"Refused: {exc}", "refusal")
    create: dict[str, Any] = {"session_id": session_id, "objective": objective}
    if requirements:
        create["requirements"] = requirements
    if request_key:
        create["client_request_id"] = goal_request_id(request_key)
    goal = await host.post("/goals", create)
    lines = [f"Goal started: {goal['objective']}"]
    lines += [f"- {r['text']}" for r in goal.get("requirements") or []]
    if not goal.get("requirements"):
        lines.append("(its requirements are taken from the objective)")
    return Reply("\n".join(lines))


async def current_goal(host: CommandHost, session_id: str) -> dict[str, Any] | None:
    snap = await host.get(f"/sessions/{session_id}", {"before": "latest", "limit": 1})
    goal = snap.get("goal")
    if not goal:
        listed = (await host.get("/goals", {"session_id": session_id})).get("goals") or []
        goal = listed[-1] if listed else None
    return await host.get(f"/goals/{goal['goal_id']}", None) if goal else None


def goal_text(goal: dict[str, Any]) -> str:
    """Objective, state, phase, reason and each requirement with the verdict that counts now."""
    lines = [f"Goal: {goal['objective']}", f"State: {goal['state']} ({goal['phase']})"]
    if goal.get("reason"):
        lines.append(f"Reason: {goal['reason']}")
    verdicts = {v.get("requirement_id"): v for v in goal.get("verdicts") or []}
    if goal.get("requirements"):
        lines.append("Requirements:")
    for req in goal.get("requirements") or []:
        verdict = verdicts.get(req.get("id"))
        word = verdict["verdict"] if verdict and verdict.get("checked") else "not checked yet"
        lines.append(f"- {req['text']}: {word}")
    return "\n".join(lines)


async def goal_status(host: CommandHost, session_id: str) -> Reply:
    goal = await current_goal(host, session_id)
    if goal is None:
        return Reply("No Goal in this session yet: start one with /goal <objective>.")
    return Reply(goal_text(goal))


async def session_action(host: CommandHost, session_id: str, action: str) -> Reply:
    snap = await host.get(f"/sessions/{session_id}", {"before": "latest", "limit": 1})
    allowed = snap.get("actions") or {}
    if not allowed.get(f"can_{action}"):
        work = snap.get("work") or {}
        state = f"the work is {PHASE_WORDS.get(work['phase'], work['phase'])}" if work else "there is no work"
        why = str(work.get("reason") or allowed.get("reason_code") or "").rstrip(".")
        return Reply(f"Cannot {action} now: {state}" + (f" ({why})" if why else "") + ".", "refusal")
    after = await host.post(f"/sessions/{session_id}/actions", {"action": action})
    words = {"pause": "Pause", "resume": "Resume", "stop": "Stop"}[action]
    return Reply(f"{words} committed: the work is {PHASE_WORDS.get(after['phase'], after['phase'])}.")


async def verify(host: CommandHost, session_id: str) -> Reply:
    goal = await current_goal(host, session_id)
    if goal is None:
        return Reply("No Goal to verify in this session.", "refusal")
    if not (goal.get("actions") or {}).get("can_verify"):
        why = str(goal.get("reason") or goal["actions"].get("reason_code") or "").rstrip(".")
        return Reply(f"Cannot verify this Goal now: it is {goal['state']} ({goal['phase']})"
                     + (f" - {why}" if why else "") + ".", "refusal")
    after = await host.post(f"/goals/{goal['goal_id']}/actions",
                            {"action": "verify", "expected_revision": goal["revision"]})
    return Reply("Verifying the Goal's requirements.\n" + goal_text(after))


def recovered_state(snap: dict[str, Any]) -> str | None:
    """What a loaded session's work is doing now, in the transcript's words, with its reason sentence;
    None when nothing is going on (no work, or done)."""
    work = snap.get("work") or {}
    phase = work.get("phase")
    if phase not in PHASE_WORDS:
        return None
    word = PHASE_WORDS[phase]
    if any(a.get("state") == "pending" for a in snap.get("approvals") or []):
        word = "waiting for your approval"
    if work.get("desired_state") == "cancelled" and phase not in ("cancelled", "failed"):
        word = "stopping"
    reason = str(work.get("reason") or "").strip().rstrip(".")
    return f"Recovered state: {word}" + (f" - {reason}" if reason else "") + "."


def usage_settled(usage: dict[str, Any]) -> bool:
    """The ledger holds every receipt of what ran (nothing in flight, nothing waiting in the outbox)."""
    return not usage.get("in_flight_requests") and not usage.get("ledger_writes_pending")


def usage_update(usage: dict[str, Any], context_window: int | None) -> Any:
    """``GET /usage?session_id=`` as ``usage_update``: ``used`` = the known tokens (input + output),
    ``size`` = the model's context window (0 when unknown), ``cost`` only when every request's cost is
    known (never an invented 0); the ledger's own words in ``_meta.jupyter_goals``."""
    update, cost_of = getattr(acp.schema, "UsageUpdate", None), getattr(acp.schema, "Cost", None)
    tokens = usage.get("known_tokens")
    if update is None or cost_of is None or tokens is None:  # an SDK without it, or usage.db unreadable now
        return None
    unknown = bool(usage.get("unknown_usage_requests") or usage.get("unpriced_requests")
                   or usage.get("lower_bound_requests") or not usage_settled(usage))
    cost = usage.get("known_cost_usd")
    meta = {"known_tokens": tokens, "known_cost_usd": cost, "estimated_cost_usd": usage.get("estimated_cost_usd"),
            "unknown_usage_requests": usage.get("unknown_usage_requests"), "display": usage.get("display"),
            "cost": "unknown" if cost is None or unknown else "known"}
    return update(session_update="usage_update", used=int(tokens["input"]) + int(tokens["output"]),
                  size=int(context_window or 0),
                  cost=cost_of(amount=float(cost), currency="USD") if cost is not None and not unknown else None,
                  field_meta={"jupyter_goals": meta})
