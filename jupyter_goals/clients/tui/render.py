"""What the terminal UI shows, as plain text: pure functions of the server's answers, no I/O, no Textual.

Everything is said in words (``[tool shell: committed]``, ``-- interrupted: … --``, ``Pause: not now
(…)``), so the screen reads the same without colour (``NO_COLOR``) and in 80 columns."""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_goals.models import EffectState, ItemKind
from jupyter_goals.models.reasons import reason_text

# items a person never sees in the chat (a Goal's continuation prompt, its terminal record is a marker)
HIDDEN = frozenset({ItemKind.GOAL_PROMPT.value, ItemKind.COMPACTION.value})
# effect states a live event may move a call's badge to before its result item exists
OPEN_STATES = (EffectState.PLANNED.value, EffectState.DISPATCHED.value)
RESULT_PREVIEW = 6  # lines of a tool result shown collapsed
FOLDER_WIDTH = 16  # the picker's folder column (title, state, folder and time fit in 80 columns)

# the session actions: (action, key, label, the ``actions`` flag that allows it)
SESSION_ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("pause", "f2", "Pause", "can_pause"),
    ("resume", "f3", "Resume", "can_resume"),
    ("stop", "f4", "Stop", "can_stop"),
    ("retry", "f5", "Retry", "can_retry"),
)
# the Goal actions (``POST /goals/{id}/actions``), allowed by the Goal's own ``actions``
GOAL_ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("verify", "f6", "Verify", "can_verify"),
    ("end", "f7", "End", "can_end"),
)


def tool_title(tool: str | None, arguments: dict[str, Any] | None) -> str:
    """``shell: ls -l``: the tool and its most telling argument."""
    args = arguments or {}
    for key in ("command", "path", "pattern", "objective"):
        if isinstance(args.get(key), str):
            return f"{tool}: {args[key]}"
    return str(tool or "tool")


def item_lines(item: dict[str, Any], effect_state: str | None = None, expanded: bool = False) -> str:
    """One transcript item as text ('' for a hidden one). ``effect_state``: the latest live state of a
    tool call whose result is not in yet."""
    kind, content = str(item.get("kind")), str(item.get("content") or "")
    if kind in HIDDEN:
        return ""
    if kind == ItemKind.USER:
        return f"> you: {content}"
    if kind == ItemKind.ASSISTANT:
        cut = " [answer cut short]" if (item.get("meta") or {}).get("interrupted") else ""
        return f"assistant: {content}{cut}" if content or cut else ""
    if kind == ItemKind.TOOL_CALL:
        state = effect_state or "planned"
        return f"[tool {tool_title(item.get('tool'), item.get('arguments'))}] ({state})"
    if kind in (ItemKind.TOOL_RESULT, ItemKind.RECONCILIATION):
        state = item.get("state") or (EffectState.RECONCILED.value if kind == ItemKind.RECONCILIATION else "committed")
        head = f"  result of {item.get('tool') or 'tool'} ({state})"
        lines = content.splitlines()
        if not expanded and len(lines) > RESULT_PREVIEW:
            more = len(lines) - RESULT_PREVIEW
            lines = [*lines[:RESULT_PREVIEW], f"… {more} more line(s): press x to expand"]
        return "\n".join([head + ":", *("    " + line for line in lines)]) if lines else head
    if kind == ItemKind.INTERRUPTION:
        if is_stop_marker(item):
            return f"-- stopped: {content or 'stopped by you'} --"
        return f"-- interrupted: {content or 'the turn was interrupted'} --"
    if kind == ItemKind.NOTICE:
        return f"-- {content} --" if content else ""
    if kind == ItemKind.SUBTASK_RESULT:
        return f"-- subtask result: {content} --"
    if kind == ItemKind.GOAL_RECORD:
        return f"-- {content or 'Goal ended'} (its record: F8) --"
    return f"-- {kind}: {content} --" if content else ""


def is_stop_marker(item: dict[str, Any]) -> bool:
    """The interruption item a Stop writes (``stopped:<work id>``, reason ``user_stopped``)."""
    return str(item.get("kind")) == ItemKind.INTERRUPTION and (
        (item.get("meta") or {}).get("reason_code") == "user_stopped" or str(item.get("item_id", "")).startswith("stopped:"))


def phase_line(work: dict[str, Any] | None) -> str:
    """``working`` / ``waiting: A tool call is waiting for your approval.``"""
    if not work:
        return "idle"
    phase, reason = str(work.get("phase")), str(work.get("reason") or "")
    retry = work.get("retry_at")
    if retry:
        reason += f" (retry in {max(0, int(float(retry) - time.time()))} s)"
    return f"{phase}: {reason}" if reason and phase not in ("working", "queued") else phase


def active_time(seconds: float | None) -> str:
    s = int(seconds or 0)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def status_line(snap: dict[str, Any], connection: str, mode: str) -> str:
    """Session, model, mode, phase and reason, usage, active time, connection: one or two lines."""
    session = snap.get("session") or {}
    usage = snap.get("usage") or {}
    perms = (session.get("permissions") or {}).get("mode", "ask")
    model = str(session.get("model") or "")
    if model.startswith("scripted:"):
        model = "scripted"
    head = f"{session.get('title') or session.get('session_id', '')} | {model} | {perms} | {mode} | {connection}"
    return (f"{head}\n{phase_line(snap.get('work'))}\n"
            f"{usage.get('display') or 'usage: none yet'} | active {active_time(usage.get('active_seconds'))}")


def not_allowed(actions: dict[str, Any], work: dict[str, Any] | None) -> str:
    """Why an action is not offered now: the server's reason, in words."""
    code = str(actions.get("reason_code") or "")
    sentence = (work or {}).get("reason") if work and work.get("reason_code") == code else ""
    return str(sentence or (reason_text(code) if code else "nothing to act on"))


def actions_line(actions: dict[str, Any], work: dict[str, Any] | None, goal: dict[str, Any] | None) -> str:
    """``keys: F2 Pause  F4 Stop | off: Resume, Retry, Verify, End`` and, below, why the off ones are off."""
    goal_actions = (goal or {}).get("actions") or {}
    on: list[tuple[str, str]] = []
    off: list[tuple[str, str]] = []
    for _, key, label, flag in SESSION_ACTIONS:
        (on if actions.get(flag) else off).append((key, label))
    for _, key, label, flag in GOAL_ACTIONS:
        (on if goal_actions.get(flag) else off).append((key, f"{label} Goal" if label == "End" else label))
    line = "keys: " + ("  ".join(f"{k.upper()} {label}" for k, label in on) or "none now")
    if off:
        line += " | off: " + ", ".join(label for _, label in off)
        why = [not_allowed(actions, work)] if any(a for a, _, _, f in SESSION_ACTIONS if not actions.get(f)) else []
        if goal and any(not goal_actions.get(f) for *_, f in GOAL_ACTIONS):
            why.append(f"Goal: {goal.get('reason') or goal.get('state')}")
        elif not goal:
            why.append("no current Goal")
        line += "\nwhy off: " + "; ".join(w.rstrip(".") for w in why)
    return line


def approval_text(approval: dict[str, Any]) -> str:
    """The approval question: tool, arguments, why it asks, and what each answer covers."""
    args = json.dumps(approval.get("arguments"), indent=2, ensure_ascii=False)
    unknown = approval.get("unknown_effects") or []
    lines = [f"Tool: {approval.get('tool')}  (capability: {approval.get('capability')})",
             "Arguments:", *("  " + line for line in args.splitlines()),
             f"Why: {approval.get('reason')}"]
    if unknown:
        lines.append(f"Unknown outcomes this covers: {len(unknown)} earlier call(s) whose result is unknown")
    lines += ["Scope: y approves this one call; a approves it and always allows "
              f"{approval.get('tool')} in this session (a rule you can revoke in its permissions); n denies it."]
    return "\n".join(lines)


def goal_text(goal: dict[str, Any] | None) -> str:
    """The current Goal: objective, state, phase, each requirement with its verdict, the Todo."""
    if not goal:
        return "No current Goal. Type /goal <objective> in the message box to start one."
    verdicts = {v.get("requirement_id"): v for v in goal.get("verdicts") or []}
    lines = [f"Goal: {goal.get('objective')}",
             f"State: {goal.get('state')} | phase {goal.get('phase')} | revision {goal.get('revision')}"]
    if goal.get("reason"):
        lines.append(f"Why: {goal.get('reason')}")
    usage = goal.get("usage") or {}
    if usage.get("display"):
        lines.append(f"Usage: {usage['display']}")
    lines.append("Requirements:")
    for r in goal.get("requirements") or []:
        v = verdicts.get(r.get("id")) or {}
        verdict = v.get("verdict", "unknown") if v.get("checked") else "not checked yet"
        lines.append(f"  [{verdict}] {r.get('id')}: {r.get('text')}")
    if not goal.get("requirements"):
        lines.append("  (none yet)")
    todo = goal.get("todo") or []
    if todo:
        lines.append("Todo:")
        lines += [f"  [{t.get('status')}] {t.get('text')}" + (" (required)" if t.get("required") else "") for t in todo]
    return "\n".join(lines)


def history_line(record: dict[str, Any]) -> str:
    snap = record.get("snapshot") or {}
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(record.get("created_at") or 0)))
    return f"{when}  {record.get('state')}: {snap.get('objective', record.get('goal_id'))}"


def session_row(summary: dict[str, Any]) -> tuple[str, str, str, str]:
    """A picker row: title, state (with the Goal's), folder, last activity."""
    goal = summary.get("goal")
    state = str(summary.get("state") or "idle") + (f" / Goal {goal.get('state')}" if goal else "")
    when = time.strftime("%m-%d %H:%M", time.localtime(float(summary.get("activity_at") or 0)))
    return (str(summary.get("title") or "(untitled)"), state, folder_tail(str(summary.get("cwd") or "")), when)


def folder_tail(path: str, width: int = FOLDER_WIDTH) -> str:
    """A folder cut to its last characters (``…/project/notebooks``): the end names it, and 80 columns hold it."""
    return path if len(path) <= width else "…" + path[-(width - 1):]


# what the person does about each kind of GET /attention item, in keys and words
ATTENTION_ACTIONS = {"decide": "y / n / a", "answer": "answer it", "retry": "Retry (F5)", "edit_goal": "Goal (F8)",
                     "settle": "check it ran", "permissions": "permissions", "takeover": "take over", "open": "open it"}


def attention_rows(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``GET /attention`` items as ``(session_id, what, its action)``."""
    rows: list[tuple[str, str, str]] = []
    for item in items:
        sid, title = str(item.get("session_id")), str(item.get("title") or "untitled")
        if item.get("kind") == "approval":
            what = f"approval: {tool_title(item.get('tool'), item.get('arguments'))} ({title})"
        elif item.get("kind") == "unknown_outcome" and item.get("tool"):
            what = f"outcome unknown: {tool_title(item.get('tool'), item.get('arguments'))} ({title})"
        else:
            what = f"{str(item.get('kind')).replace('_', ' ')}: {title}: {item.get('reason')}"
        rows.append((sid, what, ATTENTION_ACTIONS.get(str(item.get("action")), "open it")))
    return rows


def unsent_question(count: int) -> str:
    """The question asked at quit while messages wait in the outbox."""
    return f"{count} message{'' if count == 1 else 's'} not sent: quit anyway? y/n"


# what each permission mode means, in the words the permissions screen shows
MODE_TEXT = {"ask": "ask (built-in reads in the chat's folder run; any other call asks unless a rule allows it)",
             "bypass": "bypass (nothing asks, except after an unknown outcome)"}


def model_name(name: str) -> str:
    """A model as a person reads it: a script's path is cut to its file name (``scripted: demo.json``)."""
    if name.startswith("scripted:"):
        return "scripted: " + name.removeprefix("scripted:").rsplit("/", 1)[-1]
    return name


def rule_row(rule: str | dict[str, Any]) -> tuple[str, str]:
    """An allow rule as ``(tool, what it lets run without asking)``."""
    if isinstance(rule, str):
        return rule, f"every {rule} call"
    tool, path = str(rule.get("tool")), rule.get("path")
    return tool, f"{tool} calls on a path in {path}" if path else f"every {tool} call"


def permissions_text(session: dict[str, Any]) -> str:
    """The head of the permissions screen: the mode, the model, the added folders."""
    perms = session.get("permissions") or {}
    mode = str(perms.get("mode") or "ask")
    folders = ", ".join(str(f) for f in perms.get("folders") or []) or "none"
    return "\n".join([f"Permissions and model of: {session.get('title') or session.get('session_id')}",
                      f"Mode: {MODE_TEXT.get(mode, mode)}",
                      f"Model: {model_name(str(session.get('model') or ''))} (a new model applies from the next turn)",
                      f"Added folders: {folders}",
                      "Allow rules (d revokes the highlighted one: its tool asks again):"])


def model_row(info: dict[str, Any], current: str) -> tuple[str, str]:
    """A model picker row: its name, and in words whether it is in use, the default, and whether the
    server has its credentials."""
    name = str(info.get("name"))
    notes = []
    if current in (name, f"{info.get('provider')}:{info.get('model')}"):
        notes.append("in use")
    if info.get("default"):
        notes.append("default")
    notes.append("has credentials" if info.get("credentials_present") else "no credentials: cannot answer yet")
    return model_name(name), ", ".join(notes)


def model_about(info: dict[str, Any]) -> str:
    """The line under the model picker: the highlighted model's ``provider:model`` and description."""
    about = model_name(f"{info.get('provider')}:{info.get('model')}")
    return f"{about}: {info['description']}" if info.get("description") else about
