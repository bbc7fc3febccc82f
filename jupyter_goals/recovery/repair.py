"""Request-history repair (DESIGN §7): durable transcript items → a valid provider message list.

Pure: no I/O, inputs are never mutated. It grants no execution permission and makes no recovery
decision; it only tells the model, truthfully, what is known about each earlier tool call.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

from jupyter_goals.models import EffectState, ItemKind, ProviderMessage, ToolCallSpec, TranscriptItem

UNKNOWN_OUTCOME_TEXT = (
    "[outcome unknown] Tool call {call_id} ({tool}) was started but no result was recorded; "
    "it may or may not have taken effect. Check the current state before repeating it."
)
NEVER_STARTED_TEXT = "[never started] Tool call {call_id} ({tool}) never started; it had no effect."
INTERRUPTED_MARKER = "[response interrupted]"
LATE_RECEIPT_TEXT = "[late result] Tool call {call_id} did finish after its outcome was reported unknown; its real result:\n{content}"
#: a person's answer for a call whose outcome was unknown (a ``reconciliation`` item with ``meta.settled``)
SETTLED_TEXT = {
    "ran": "[outcome settled by the user] Tool call {call_id} ({tool}) was started but no result was recorded; "
           "the user says it ran (took effect). Its output is not known.",
    "did_not_run": "[outcome settled by the user] Tool call {call_id} ({tool}) was started but no result was "
                   "recorded; the user says it did not run: it had no effect.",
}

# Stored result states that do not tell what happened; any other stored result is a real output.
_UNKNOWN_STATES = frozenset({EffectState.UNKNOWN, EffectState.DISPATCHED, EffectState.PLANNED})
_RESPONSE_KINDS = frozenset({ItemKind.ASSISTANT, ItemKind.TOOL_CALL})
_RESULT_KINDS = frozenset({ItemKind.TOOL_RESULT, ItemKind.RECONCILIATION})


class AmbiguousCallIds(ValueError):
    """Two tool calls of one provider response share an ID, so results cannot be attributed."""


def placeholder_text(call_id: str, tool: str) -> str:
    """The deterministic stand-in for a missing or unknown result (depends only on its inputs)."""
    return UNKNOWN_OUTCOME_TEXT.format(call_id=call_id, tool=tool)


def late_receipt_text(call_id: str, content: str) -> str:
    """The content of a reconciliation item: the real result, saying it arrived late."""
    return LATE_RECEIPT_TEXT.format(call_id=call_id, content=content)


def settled_text(call_id: str, tool: str, outcome: str) -> str:
    """What the model reads for a person's answer (``ran`` / ``did_not_run``) in place of the placeholder."""
    return SETTLED_TEXT[outcome].format(call_id=call_id, tool=tool)


def never_started_text(call_id: str, tool: str) -> str:
    """The text sent for a call recorded as ``never_started``."""
    return NEVER_STARTED_TEXT.format(call_id=call_id, tool=tool)


COMPACTION_TEXT = "[summary of the earlier conversation, compacted to fit the context window]\n{content}"


def compacted(items: Sequence[TranscriptItem]) -> list[TranscriptItem]:
    """What a request reads: after the newest ``compaction`` item, that summary plus the items after
    the seq it covers (``meta.up_to_seq``); without one, every item. Ordered by seq; pure."""
    ordered = sorted(items, key=lambda it: it.seq)
    summaries = [it for it in ordered if it.kind == ItemKind.COMPACTION]
    if not summaries:
        return ordered
    last = summaries[-1]
    up_to = int(last.meta.get("up_to_seq", last.seq))
    return [last, *(it for it in ordered if it.seq > up_to and it.kind != ItemKind.COMPACTION)]


def repair_history(
    items: Sequence[TranscriptItem], system_prompt: str | None = None
) -> list[ProviderMessage]:
    """Project stored transcript items into provider messages that obey the tool protocol.

    Invariants of the output:
    - ``system_prompt`` (when given) is the first message.
    - Every assistant message is followed immediately by exactly one ``tool`` message per tool call,
      in call order, and ``tool`` messages appear nowhere else. A user message stored between a
      call and its result comes after that response's tool messages; user order is kept.
    - A result matches the nearest preceding call with the same ``call_id``; failing that, the
      nearest preceding call whose ``provider_call_id`` equals the result's call or provider ID.
      Results matching no call (orphans) are not sent.
    - Real outputs (committed, reconciled, denied, never_started, reconciliation items) beat
      unknown ones; of several real outputs the last saved wins. A call with no real output gets
      the deterministic ``placeholder_text`` with ``unknown_outcome=True``. A person's answer (a
      reconciliation item with ``meta.settled`` ``ran`` / ``did_not_run``) is sent as ``settled_text``.
    - An interrupted response keeps its partial text plus ``INTERRUPTED_MARKER``; reasoning
      signatures are never carried.
    - Two calls of one response with the same call ID (or provider call ID) raise
      ``AmbiguousCallIds``. Items are ordered by ``seq``; the inputs are not modified and equal
      inputs give equal outputs.
    - After a ``compaction`` item only its summary (user-role) and the items after the seq it covers
      are projected (``compacted``).
    """
    ordered = compacted(items)
    groups = _group_responses(ordered)
    results = _match_results(ordered)

    messages = [ProviderMessage(role="system", content=system_prompt)] if system_prompt is not None else []
    emitted: set[tuple[str, str]] = set()
    for item in ordered:
        if item.kind in (ItemKind.USER, ItemKind.GOAL_PROMPT, ItemKind.SUBTASK_RESULT):  # continuation prompts and
            # delivered subtask results are user-role
            messages.append(ProviderMessage(role="user", content=item.content))
        elif item.kind == ItemKind.COMPACTION:
            messages.append(ProviderMessage(role="user", content=COMPACTION_TEXT.format(content=item.content)))
        elif item.kind in _RESPONSE_KINDS and _group_key(item) not in emitted:
            # The first item of a response (in seq order) fixes where the whole response goes.
            emitted.add(_group_key(item))
            messages.extend(_project_response(groups[_group_key(item)], results))
    return messages


def _group_key(item: TranscriptItem) -> tuple[str, str]:
    return ("response", item.response_id) if item.response_id else ("item", item.item_id)


def _call_id(call: TranscriptItem) -> str:
    return call.call_id or call.provider_call_id or call.item_id


def _group_responses(ordered: list[TranscriptItem]) -> dict[tuple[str, str], list[TranscriptItem]]:
    """Assistant and tool_call items by response, each list in seq order; rejects ambiguous IDs."""
    groups: dict[tuple[str, str], list[TranscriptItem]] = {}
    for item in ordered:
        if item.kind in _RESPONSE_KINDS:
            groups.setdefault(_group_key(item), []).append(item)
    for key, group in groups.items():
        calls = [it for it in group if it.kind == ItemKind.TOOL_CALL]
        for label, ids in (
            ("call ID", [_call_id(c) for c in calls]),
            ("provider call ID", [c.provider_call_id for c in calls if c.provider_call_id]),
        ):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            if dupes:
                raise AmbiguousCallIds(
                    f"response {key[1]!r} has several tool calls with the same {label}: "
                    f"{', '.join(map(repr, dupes))}; their results cannot be attributed"
                )
    return groups


def _is_real(result: TranscriptItem) -> bool:
    return result.kind == ItemKind.RECONCILIATION or result.state not in _UNKNOWN_STATES


def _match_results(ordered: list[TranscriptItem]) -> dict[str, TranscriptItem]:
    """The winning result per call (keyed by the call's item_id); orphan results are left out."""
    latest_by_call_id: dict[str, TranscriptItem] = {}
    latest_by_provider_id: dict[str, TranscriptItem] = {}
    chosen: dict[str, TranscriptItem] = {}
    for item in ordered:
        if item.kind == ItemKind.TOOL_CALL:
            latest_by_call_id[_call_id(item)] = item
            if item.provider_call_id:
                latest_by_provider_id[item.provider_call_id] = item
        elif item.kind in _RESULT_KINDS:
            call = (
                latest_by_call_id.get(item.call_id or "")
                or latest_by_provider_id.get(item.call_id or "")
                or latest_by_provider_id.get(item.provider_call_id or "")
            )
            if call is None:
                continue  # orphan
            previous = chosen.get(call.item_id)
            if previous is None or _is_real(item) or not _is_real(previous):
                chosen[call.item_id] = item
    return chosen


def _project_response(
    group: list[TranscriptItem], results: dict[str, TranscriptItem]
) -> list[ProviderMessage]:
    """One assistant message followed by exactly one tool message per call, in call order."""
    texts = [it for it in group if it.kind == ItemKind.ASSISTANT]
    calls = [it for it in group if it.kind == ItemKind.TOOL_CALL]
    content = "".join(it.content for it in texts)
    if any(it.meta.get("interrupted") for it in texts):
        content = f"{content}\n{INTERRUPTED_MARKER}" if content else INTERRUPTED_MARKER
    assistant = ProviderMessage(
        role="assistant",
        content=content,
        tool_calls=[
            ToolCallSpec(id=_call_id(c), name=c.tool or "", arguments=copy.deepcopy(c.arguments or {}))
            for c in calls
        ],
    )
    return [assistant, *(_tool_message(c, results.get(c.item_id)) for c in calls)]


def _tool_message(call: TranscriptItem, result: TranscriptItem | None) -> ProviderMessage:
    call_id, tool = _call_id(call), call.tool or ""
    if result is not None and _is_real(result):
        if result.state == EffectState.NEVER_STARTED:
            content = _join(never_started_text(call_id, tool), result.content)
        elif result.kind == ItemKind.RECONCILIATION and result.meta.get("settled") in SETTLED_TEXT:
            content = settled_text(call_id, tool, str(result.meta["settled"]))  # a person's words, not tool output
        else:
            content = result.content
        return ProviderMessage(role="tool", tool_call_id=call_id, content=content)
    stored = result.content if result is not None else ""
    return ProviderMessage(
        role="tool",
        tool_call_id=call_id,
        unknown_outcome=True,
        content=_join(placeholder_text(call_id, tool), stored),
    )


def _join(head: str, tail: str) -> str:
    return f"{head}\n{tail}" if tail else head


def message_chars(message: ProviderMessage) -> int:
    """A message's size for the token estimate (about 4 characters a token; provider-neutral)."""
    return len(message.content) + sum(len(c.name) + len(json.dumps(c.arguments)) for c in message.tool_calls) + 8


def estimate_tokens(messages: Sequence[ProviderMessage]) -> int:
    """A provider-neutral estimate, enough to decide when to compact."""
    return sum(message_chars(m) for m in messages) // 4


class IncrementalHistory:
    """``repair_history`` kept up to date step by step at the cost of what changed.

    The items are split at a *closed* boundary: every tool call before it has its winning real result
    before it. The projection of that prefix cannot change unless a later item joins one of its
    responses or is a result for one of its calls (a late or duplicate receipt) or is a compaction:
    then everything is rebuilt once. Otherwise a step re-projects only the open tail. Equal to
    ``repair_history(all items, system_prompt)`` for any input fed in seq order (property-tested).
    """

    def __init__(self, system_prompt: str | None = None) -> None:
        self.system_prompt = system_prompt
        self.items: list[TranscriptItem] = []
        self.last_seq = -1  # seqs start at 1; -1 takes every item
        self._boundary = 0  # items[:boundary] are projected into _prefix
        self._prefix: list[ProviderMessage] = self._head()
        self._groups: set[tuple[str, str]] = set()  # response groups inside the prefix
        self._call_ids: set[str] = set()  # call and provider call IDs inside the prefix
        self._prefix_chars = sum(message_chars(m) for m in self._prefix)
        self.rebuilds = 0
        self.tokens = 0  # ``estimate_tokens`` of the last projection, kept at the cost of what changed

    def _head(self) -> list[ProviderMessage]:
        return [ProviderMessage(role="system", content=self.system_prompt)] if self.system_prompt is not None else []

    def update(self, new: Sequence[TranscriptItem]) -> list[ProviderMessage]:
        """Add items newer than ``last_seq`` (in any order) and answer the full projection."""
        fresh = sorted((it for it in new if it.seq > self.last_seq), key=lambda it: it.seq)
        if any(self._invalidates(it) for it in fresh):
            self._reset()
        self.items.extend(fresh)
        if fresh:
            self.last_seq = fresh[-1].seq
        if any(it.kind == ItemKind.COMPACTION for it in fresh):
            self.items = compacted(self.items)  # what a compaction covers is never read again
        self._advance()
        tail = repair_history(self.items[self._boundary:])
        self.tokens = (self._prefix_chars + sum(message_chars(m) for m in tail)) // 4
        return [*self._prefix, *tail]

    def compactable(self) -> tuple[int, list[ProviderMessage]] | None:
        """What a compaction could cover: the seq of the last item of the closed prefix and the
        prefix's messages (without the system prompt); None when the prefix holds nothing but an
        earlier summary (compacting again would not make the request smaller)."""
        prefix = self.items[:self._boundary]
        if not any(it.kind != ItemKind.COMPACTION for it in prefix):
            return None
        return prefix[-1].seq, self._prefix[len(self._head()):]

    def _invalidates(self, item: TranscriptItem) -> bool:
        if item.kind == ItemKind.COMPACTION:
            return True
        if item.kind in _RESPONSE_KINDS and _group_key(item) in self._groups:
            return True
        if item.kind in _RESULT_KINDS:
            return bool({item.call_id, item.provider_call_id} & self._call_ids)
        if item.kind == ItemKind.TOOL_CALL:  # a later call reusing an ID changes which call results match
            return bool({_call_id(item), item.provider_call_id} & self._call_ids)
        return False

    def _reset(self) -> None:
        self.rebuilds += 1
        self._boundary = 0
        self._prefix = self._head()
        self._prefix_chars = sum(message_chars(m) for m in self._prefix)
        self._groups.clear()
        self._call_ids.clear()

    def _advance(self) -> None:
        """Move the boundary to the end of the longest closed run of the tail."""
        tail = self.items[self._boundary:]
        end = _closed_end(tail)
        if end == 0:
            return
        chunk = tail[:end]
        closed = repair_history(chunk)
        self._prefix.extend(closed)
        self._prefix_chars += sum(message_chars(m) for m in closed)
        for item in chunk:
            if item.kind in _RESPONSE_KINDS:
                self._groups.add(_group_key(item))
            if item.kind == ItemKind.TOOL_CALL:
                self._call_ids.update(i for i in (_call_id(item), item.provider_call_id) if i)
        self._boundary += end


def _closed_end(tail: Sequence[TranscriptItem]) -> int:
    """The largest n such that no item of ``tail[n:]`` refers back into ``tail[:n]`` (joins one of its
    responses, is a result for or reuses the ID of one of its calls) and every call of ``tail[:n]``
    already has a result there (so the usual next item, its result, does not force a rebuild); 0
    when there is none. One pass forward, one backward."""
    anchor = list(range(len(tail)))  # the earliest index each item refers to (itself when none)
    group_first: dict[tuple[str, str], int] = {}
    by_call_id: dict[str, int] = {}
    by_provider_id: dict[str, int] = {}
    waiting: set[int] = set()  # calls without a result yet
    closed = [True] * (len(tail) + 1)
    for i, item in enumerate(tail):
        if item.kind in _RESPONSE_KINDS:
            anchor[i] = group_first.setdefault(_group_key(item), i)
        if item.kind == ItemKind.TOOL_CALL:
            for earlier in (by_call_id.get(_call_id(item)), by_provider_id.get(item.provider_call_id or "")):
                if earlier is not None:
                    anchor[i] = min(anchor[i], earlier)
            by_call_id[_call_id(item)] = i
            if item.provider_call_id:
                by_provider_id[item.provider_call_id] = i
            waiting.add(i)
        elif item.kind in _RESULT_KINDS:  # the call _match_results would give it
            target = (by_call_id.get(item.call_id or "") if item.call_id in by_call_id else None)
            if target is None:
                target = by_provider_id.get(item.call_id or "", by_provider_id.get(item.provider_call_id or ""))
            if target is not None:
                anchor[i] = min(anchor[i], target)
                waiting.discard(target)
        closed[i + 1] = not waiting
    reach = len(tail)  # min(anchor[p] for p >= n)
    for n in range(len(tail), 0, -1):
        if n < len(tail):
            reach = min(reach, anchor[n])
        if closed[n] and reach >= n:
            return n
    return 0
