"""Durable notebook views: MIME bundles that carry only ids, with a ``text/html`` snapshot beside them.

Kernel-held widget models die with the kernel, so a notebook output that must stay live after a
kernel restart, a server restart or reopening the notebook with no kernel carries only the ids it
shows. The labextension's mime renderer reads REST and the event stream itself for those ids; any
other frontend (nbviewer, GitHub, a notebook opened without the extension) shows the HTML snapshot
taken when the output was made, marked as such.
"""

from __future__ import annotations

import datetime
from html import escape
from typing import Any

GOAL_MIME = "application/vnd.jupyter-goals.goal+json"
APPROVAL_MIME = "application/vnd.jupyter-goals.approval+json"
HISTORY_MIME = "application/vnd.jupyter-goals.history+json"
CHAT_MIME = "application/vnd.jupyter-goals.chat+json"

_STYLE = ("border:1px solid #ccc;border-radius:4px;padding:6px 10px;margin:2px 0;"
          "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px")


def goal_bundle(goal: dict[str, Any]) -> dict[str, Any]:
    """The output of ``%goal`` for a Goal answer (``GET /goals/{id}``)."""
    return {
        GOAL_MIME: {"goal_id": goal["goal_id"], "session_id": goal["session_id"]},
        "text/html": _snapshot_note(goal_html(goal)),
        "text/plain": goal_text(goal),
    }


def approval_bundle(approval: dict[str, Any]) -> dict[str, Any]:
    return {
        APPROVAL_MIME: {"approval_id": approval["approval_id"], "session_id": approval["session_id"]},
        "text/html": _snapshot_note(approval_html(approval)),
        "text/plain": f"Approval {approval['approval_id']} ({approval['state']}): {approval['tool']}"
                      f" {approval.get('arguments')}",
    }


def history_bundle(record: dict[str, Any]) -> dict[str, Any]:
    """A terminal Goal record: read-only, its snapshot never changes."""
    snap = record["snapshot"]
    return {
        HISTORY_MIME: {"record_id": record["record_id"], "session_id": record["session_id"]},
        "text/html": (f'<div style="{_STYLE}"><b>Goal {escape(str(record["state"]))}</b>: '
                      f'{escape(str(snap.get("objective", "")))}'
                      f'<div style="color:#666">ended {escape(_when(record.get("created_at")))}'
                      f' &middot; record {escape(record["record_id"])}</div></div>'),
        "text/plain": f"Goal {record['state']}: {snap.get('objective', '')} (record {record['record_id']})",
    }


def chat_bundle(session_id: str, work_id: str, message_id: str, question: str,
                answer: list[dict[str, Any]] | None = None, phase: str | None = None) -> dict[str, Any]:
    """The output of ``%chat``: one message and its answer (the transcript items of its work item)."""
    shown = [i for i in answer or [] if i.get("kind") in ("assistant", "tool_call", "tool_result")]
    rows = "".join(
        f'<div><code>{escape(str(i.get("tool") or i["kind"]))}</code> {escape(str(i.get("content") or "")[:2000])}</div>'
        if i["kind"] != "assistant" else f'<div>{escape(str(i.get("content") or ""))}</div>' for i in shown)
    status = f'<div style="color:#666">{escape(phase)}</div>' if phase else ""
    texts = [str(i.get("content") or "") for i in shown if i["kind"] == "assistant"]
    return {
        CHAT_MIME: {"session_id": session_id, "work_id": work_id, "message_id": message_id},
        "text/html": _snapshot_note(f'<div style="{_STYLE}"><div><b>You</b> {escape(question)}</div>'
                                    f'{rows or "<div>(waiting for the answer)</div>"}{status}</div>'),
        "text/plain": f"You: {question}\n" + ("\n".join(texts) if texts else "(waiting for the answer)"),
    }


def goal_text(goal: dict[str, Any]) -> str:
    lines = [f"Goal {goal['goal_id']}: {goal['objective']}",
             f"  state {goal['state']}, phase {goal['phase']}" + (f" - {goal['reason']}" if goal.get("reason") else "")]
    verdicts = _verdicts(goal)
    for r in goal.get("requirements") or []:
        lines.append(f"  [{verdicts.get(r['id'], 'unknown')}] {r['text']}")
    usage = (goal.get("usage") or {}).get("display")
    if usage:
        lines.append(f"  {usage}")
    return "\n".join(lines)


def goal_html(goal: dict[str, Any]) -> str:
    verdicts = _verdicts(goal)
    reqs = "".join(
        f"<li><code>{escape(verdicts.get(r['id'], 'unknown'))}</code> {escape(r['text'])}</li>"
        for r in goal.get("requirements") or [])
    todo = "".join(f"<li><code>{escape(str(t.get('status', '')))}</code> {escape(str(t.get('text', '')))}</li>"
                   for t in goal.get("todo") or [])
    usage = (goal.get("usage") or {}).get("display") or ""
    reason = f" &mdash; {escape(goal['reason'])}" if goal.get("reason") else ""
    return (f'<div style="{_STYLE}"><div><b>Goal</b> {escape(goal["objective"])}</div>'
            f'<div>{escape(goal["state"])} &middot; {escape(goal["phase"])}{reason}</div>'
            + (f"<div>Requirements</div><ul>{reqs}</ul>" if reqs else "")
            + (f"<div>Todo</div><ul>{todo}</ul>" if todo else "")
            + (f'<div style="color:#666">{escape(usage)}</div>' if usage else "")
            + "</div>")


def approval_html(approval: dict[str, Any]) -> str:
    return (f'<div style="{_STYLE}"><b>Approval</b> {escape(str(approval["state"]))}: '
            f'<code>{escape(str(approval["tool"]))}</code> {escape(str(approval.get("arguments")))}'
            f'<div style="color:#666">{escape(str(approval.get("reason") or ""))}</div></div>')


def _verdicts(goal: dict[str, Any]) -> dict[str, str]:
    """The server's verdicts that count now (``verdicts``), by requirement id."""
    return {str(v.get("requirement_id")): str(v.get("verdict")) for v in goal.get("verdicts") or []}


def _snapshot_note(html: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return html + f'<div style="color:#888;font-size:11px">snapshot taken {stamp}; live with the jupyter_goals extension</div>'


def _when(ts: Any) -> str:
    try:
        return datetime.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return "?"
