"""Durable records → ACP ``session/update`` payloads: pure functions, no I/O.

The agent turns every transcript item into updates with ``item_updates`` whether it replays a session
(``session/load``) or follows it live, so a replayed conversation and a live one are built by the same
code: ids are the durable ones (``toolCallId`` = the call id, ``messageId`` = the item id), and a tool
call's final status comes from its result item, or ``failed`` when its work was stopped first (live
effect-state events move it forward to ``pending`` / ``in_progress``, never to an end).
"""

from __future__ import annotations

from typing import Any, Literal

from acp import text_block
from acp.helpers import plan_entry, start_tool_call, tool_content, update_plan, update_tool_call
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    EmbeddedResourceContentBlock,
    ResourceContentBlock,
    SessionInfoUpdate,
    TextContentBlock,
    TextResourceContents,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from pydantic import BaseModel, ConfigDict

from jupyter_goals.models import EffectState, ItemKind

ToolStatus = Literal["pending", "in_progress", "completed", "failed"]
ToolKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"]
Update = UserMessageChunk | AgentMessageChunk | ToolCallStart | ToolCallProgress

# effect state → ACP tool call status; the words of the transcript's result say why it failed
EFFECT_STATUS: dict[str, ToolStatus] = {
    EffectState.PLANNED: "pending",
    EffectState.DISPATCHED: "in_progress",
    EffectState.COMMITTED: "completed",
    EffectState.RECONCILED: "completed",
    EffectState.UNKNOWN: "failed",
    EffectState.NEVER_STARTED: "failed",
    EffectState.DENIED: "failed",
    EffectState.CANCELLED: "failed",
}
# effect states a live event may report before the result item exists
OPEN_STATES = frozenset({EffectState.PLANNED, EffectState.DISPATCHED})

TOOL_KINDS: dict[str, ToolKind] = {
    "read_file": "read", "list_dir": "read", "file_digest": "read", "process_status": "read",
    "grep": "search", "glob": "search", "write_file": "edit", "edit_file": "edit", "shell": "execute",
    "todo_write": "think", "get_goal": "think", "update_goal": "think", "create_goal": "think",
}
# items a person never sees in the chat (a Goal's continuation prompt, its terminal record, a summary)
HIDDEN = frozenset({ItemKind.GOAL_PROMPT, ItemKind.GOAL_RECORD, ItemKind.COMPACTION})


class TranscriptItem(BaseModel):
    """A transcript item as ``GET /sessions/{id}`` answers it (the fields the agent reads)."""

    model_config = ConfigDict(extra="ignore")

    item_id: str
    seq: int
    kind: str
    role: str | None = None
    content: str = ""
    call_id: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    state: str | None = None
    work_id: str | None = None
    meta: dict[str, Any] | None = None


def tool_title(tool: str | None, arguments: dict[str, Any] | None) -> str:
    """A one-line title: the tool and its most telling argument (``shell: ls -l``, ``write_file: a.txt``)."""
    args = arguments or {}
    for key in ("command", "path", "pattern", "objective"):
        if isinstance(args.get(key), str):
            return f"{tool}: {args[key]}"[:200]
    return str(tool or "tool")


def tool_kind(tool: str | None) -> ToolKind:
    return TOOL_KINDS.get(tool or "", "other")


def tool_call_start(call_id: str, tool: str | None, arguments: dict[str, Any] | None,
                    status: ToolStatus = "pending") -> ToolCallStart:
    return start_tool_call(call_id, tool_title(tool, arguments), kind=tool_kind(tool), status=status,
                           raw_input=arguments or {})


def effect_progress(call_id: str, state: str) -> ToolCallProgress | None:
    """A live ``effect.state`` event as a status update, for the states before a result only."""
    if state not in OPEN_STATES:
        return None
    return update_tool_call(call_id, status=EFFECT_STATUS[state])


def item_updates(item: TranscriptItem) -> list[Update]:
    """The updates one transcript item stands for (none for hidden or empty ones)."""
    kind = item.kind
    if kind in HIDDEN:
        return []
    if kind == ItemKind.USER:
        return [UserMessageChunk(session_update="user_message_chunk", content=text_block(item.content),
                                 message_id=item.item_id)]
    if kind == ItemKind.ASSISTANT:
        return [agent_text(item.item_id, item.content)] if item.content else []
    if kind == ItemKind.TOOL_CALL and item.call_id:
        # a snapshot gives a call's state now: a call still running replays in_progress
        running = item.state == EffectState.DISPATCHED
        return [tool_call_start(item.call_id, item.tool, item.arguments, "in_progress" if running else "pending")]
    if kind in (ItemKind.TOOL_RESULT, ItemKind.RECONCILIATION) and item.call_id:
        state = item.state or (EffectState.RECONCILED if kind == ItemKind.RECONCILIATION else EffectState.COMMITTED)
        return [update_tool_call(item.call_id, status=EFFECT_STATUS.get(state, "completed"),
                                 content=[tool_content(text_block(item.content))],
                                 raw_output={"state": state, "text": item.content})]
    if kind in (ItemKind.INTERRUPTION, ItemKind.NOTICE, ItemKind.SUBTASK_RESULT, ItemKind.RECONCILIATION):
        return [agent_text(item.item_id, f"\n\n_{item.content}_\n\n")] if item.content else []
    return []


# what providers say when an answer ended at the output limit (Anthropic, OpenAI chat, OpenAI responses)
OUTPUT_LIMIT_REASONS = frozenset({"max_tokens", "length", "max_output_tokens"})
STOPPED_TEXT = "Not finished: the work was stopped (Stop) before this call ended."


def turn_stop_reason(provider_stop_reason: Any) -> Literal["end_turn", "max_tokens"]:
    """A finished turn's ACP stop reason from the provider's own word for its last answer (the assistant
    item's ``meta.stop_reason``): ``max_tokens`` when the model hit its output limit, else ``end_turn``."""
    return "max_tokens" if str(provider_stop_reason or "").lower() in OUTPUT_LIMIT_REASONS else "end_turn"


def is_stop_marker(item: TranscriptItem) -> bool:
    """The interruption item a Stop writes (``stopped:<work id>``, reason ``user_stopped``)."""
    return item.kind == ItemKind.INTERRUPTION and ((item.meta or {}).get("reason_code") == "user_stopped"
                                                   or item.item_id.startswith("stopped:"))


def stopped_call(call_id: str) -> ToolCallProgress:
    """A call still open when its work was stopped (waiting for approval, or running): it ends ``failed``,
    never left ``pending``; a result item written after the Stop still updates it."""
    return update_tool_call(call_id, status="failed", content=[tool_content(text_block(STOPPED_TEXT))],
                            raw_output={"state": EffectState.CANCELLED, "text": STOPPED_TEXT})


def session_info(payload: dict[str, Any]) -> SessionInfoUpdate:
    """``session.updated`` (a rename or a new model, from any surface) as ``session_info_update``."""
    return SessionInfoUpdate(session_update="session_info_update", title=payload.get("title") or None,
                             field_meta={"jupyter_goals": {"model": payload.get("model")}})


def plan_update(todo: list[dict[str, Any]]) -> AgentPlanUpdate:
    """The session's Todo (``todo_write``, a Goal's plan) as the ACP plan: a required item is ``high``."""
    return update_plan([plan_entry(str(t.get("text", "")), priority="high" if t.get("required") else "medium",
                                   status=t["status"] if t.get("status") in PLAN_STATUSES else "pending")
                        for t in todo])


PLAN_STATUSES = frozenset({"pending", "in_progress", "completed"})


def agent_text(message_id: str, text: str) -> AgentMessageChunk:
    return AgentMessageChunk(session_update="agent_message_chunk", content=text_block(text), message_id=message_id)


def draft_delta(streamed: str, draft: str) -> str:
    """What a streamed draft adds to the text already sent ('' when it adds nothing or diverges)."""
    return draft[len(streamed):] if draft.startswith(streamed) else ""


def answer_rest(streamed: str, content: str) -> str:
    """The part of a committed answer not streamed yet: all of it when the drafts diverged from it."""
    return content[len(streamed):] if content.startswith(streamed) else content


def prompt_text(blocks: list[Any]) -> str:
    """An ACP prompt as one message: text as is, a resource link as ``[name](uri)``, an embedded text
    resource as a fenced block under its URI. Images, audio and binary resources are not advertised."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(block.resource, TextResourceContents):
            parts.append(f"{block.resource.uri}:\n```\n{block.resource.text}\n```")
    return "\n\n".join(p for p in parts if p)
