"""``GET /attention``: everything across sessions that waits for a person, each with the action that fits
(issue 32 item 7, issue 31 item 5). Rebuilt from durable rows on every read, so it is the same after any
restart; the JupyterLab inbox and the TUI's attention list both show this answer."""

from __future__ import annotations

from typing import Any, Literal

import tornado.web
from jupyter_server.auth.decorator import authorized

from jupyter_goals.models import ReasonCode
from jupyter_goals.server.answers import Answer
from jupyter_goals.server.base_handler import GoalsHandler, api
from jupyter_goals.store import attention as store
from jupyter_goals.store.db import Tx

Kind = Literal["approval", "question", "failed", "budget", "blocked", "unknown_outcome", "permissions",
               "host_unreachable", "needs_you"]
Action = Literal["decide", "answer", "retry", "edit_goal", "settle", "permissions", "takeover", "open"]

_KIND: dict[str, Kind] = {
    ReasonCode.AWAITING_CLARIFICATION: "question",
    ReasonCode.BUDGET_EXHAUSTED: "budget",
    ReasonCode.BUDGET_UNVERIFIABLE: "budget",
    ReasonCode.GOAL_BLOCKED: "blocked",
    ReasonCode.PERMISSION_REVOKED: "permissions",
    ReasonCode.OWNER_HOST_UNREACHABLE: "host_unreachable",
    ReasonCode.UNKNOWN_EFFECTS_NEED_REVIEW: "unknown_outcome",
}
_ACTION: dict[Kind, Action] = {
    "approval": "decide", "question": "answer", "failed": "retry", "budget": "edit_goal", "blocked": "edit_goal",
    "permissions": "permissions", "host_unreachable": "takeover", "unknown_outcome": "settle", "needs_you": "open",
}


class AttentionItem(Answer):
    """One thing that waits for a person. ``action`` names what fits: ``decide`` (Approve / Deny the
    approval), ``answer`` (reply in the chat), ``retry``, ``edit_goal`` (raise the budget, revise or end the
    Goal), ``settle`` (say whether an unknown call ran), ``permissions``, ``takeover``, ``open``."""

    key: str
    kind: Kind
    action: Action
    session_id: str
    title: str
    work_id: str
    goal_id: str | None
    approval_id: str | None
    effect_id: str | None  # an unknown outcome's call, for ``settle``
    call_id: str | None
    tool: str | None
    arguments: Any
    reason_code: str
    reason: str
    since: float
    control_version: int | None


class Attention(Answer):
    """Approvals first (oldest first: they wait longest), then work and calls (newest change first)."""

    items: list[AttentionItem]
    count: int


def attention(tx: Tx) -> Attention:
    items: list[AttentionItem] = []
    for ap in store.pending_approvals(tx):
        items.append(AttentionItem(
            key=f"approval:{ap['approval_id']}", kind="approval", action="decide", session_id=str(ap["session_id"]),
            title=str(ap["title"]), work_id=str(ap["work_id"]), goal_id=None, approval_id=str(ap["approval_id"]),
            effect_id=None, call_id=str(ap["call_id"]), tool=str(ap["tool"]), arguments=ap["arguments"],
            reason_code=str(ReasonCode.AWAITING_APPROVAL), reason=str(ap["reason"] or "A call waits for your approval."),
            since=float(ap["created_at"]), control_version=int(ap["control_version"])))
    for w in store.waiting_work(tx):
        kind: Kind = "failed" if w["phase"] == "failed" else _KIND.get(w["reason_code"], "needs_you")
        items.append(AttentionItem(
            key=f"work:{w['work_id']}:{w['reason_code'] or w['phase']}", kind=kind, action=_ACTION[kind],
            session_id=w["session_id"], title=w["title"], work_id=w["work_id"], goal_id=w["goal_id"],
            approval_id=None, effect_id=None, call_id=None, tool=None, arguments=None, reason_code=w["reason_code"],
            reason=w["reason"], since=w["updated_at"], control_version=w["control_version"]))
    for e in store.unknown_calls(tx):
        items.append(AttentionItem(
            key=f"call:{e['effect_id']}", kind="unknown_outcome", action="settle", session_id=e["session_id"],
            title=e["title"], work_id=e["work_id"], goal_id=None, approval_id=None, effect_id=e["effect_id"],
            call_id=e["call_id"],
            tool=e["tool"], arguments=e["arguments"], reason_code=str(ReasonCode.UNKNOWN_EFFECTS_NEED_REVIEW),
            reason=f"Whether this {e['tool']} call ran is unknown: it is not run again, and later writes of this work"
                   " need your approval until you say whether it ran.",
            since=e["ended_at"] or e["dispatched_at"] or e["created_at"], control_version=None))
    return Attention(items=items, count=len(items))


class AttentionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.answer(await self.service.queries.read(attention))
