"""History repair (DESIGN §7): one unit test per rule, then property tests of the tool protocol."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_goals.models import ItemKind, ProviderMessage, ToolCallSpec, TranscriptItem
from jupyter_goals.recovery.repair import (
    INTERRUPTED_MARKER,
    AmbiguousCallIds,
    IncrementalHistory,
    estimate_tokens,
    never_started_text,
    placeholder_text,
    repair_history,
)

# --------------------------------------------------------------------------- builders


class T:
    """Builds transcript items with increasing seq."""

    def __init__(self) -> None:
        self.items: list[TranscriptItem] = []

    def add(self, kind: ItemKind, role: str, **fields: Any) -> TranscriptItem:
        seq = len(self.items) + 1
        item = TranscriptItem(item_id=f"i{seq}", seq=seq, kind=kind, role=role, **fields)
        self.items.append(item)
        return item

    def user(self, text: str) -> T:
        self.add(ItemKind.USER, "user", content=text)
        return self

    def assistant(self, rid: str, text: str = "", **meta: Any) -> T:
        self.add(ItemKind.ASSISTANT, "assistant", content=text, response_id=rid, meta=meta)
        return self

    def call(self, rid: str, cid: str, tool: str = "shell", pid: str | None = None, **args: Any) -> T:
        self.add(
            ItemKind.TOOL_CALL,
            "assistant",
            response_id=rid,
            call_id=cid,
            provider_call_id=pid,
            tool=tool,
            arguments=args,
        )
        return self

    def result(self, cid: str | None, content: str, state: str = "committed", pid: str | None = None) -> T:
        self.add(
            ItemKind.TOOL_RESULT, "tool", call_id=cid, provider_call_id=pid, content=content, state=state
        )
        return self

    def reconcile(self, cid: str, content: str) -> T:
        self.add(ItemKind.RECONCILIATION, "tool", call_id=cid, content=content, state="reconciled")
        return self


def shape(msgs: list[ProviderMessage]) -> list[tuple[str, str]]:
    return [(m.role, m.tool_call_id or m.content) for m in msgs]


def tool_msgs(msgs: list[ProviderMessage]) -> list[ProviderMessage]:
    return [m for m in msgs if m.role == "tool"]


# --------------------------------------------------------------------------- rules


def test_result_matches_nearest_preceding_call_by_call_id() -> None:
    t = T().user("go").assistant("r1").call("r1", "c1").result("c1", "first")
    t.user("again").assistant("r2").call("r2", "c1").result("c1", "second")
    tools = tool_msgs(repair_history(t.items))
    assert [(m.tool_call_id, m.content) for m in tools] == [("c1", "first"), ("c1", "second")]


def test_result_matches_by_provider_call_id_when_call_id_matches_nothing() -> None:
    t = T().assistant("r1").call("r1", "c1", pid="toolu_1").call("r1", "c2", pid="toolu_2")
    t.result("toolu_2", "via call_id field").result(None, "via provider field", pid="toolu_1")
    tools = tool_msgs(repair_history(t.items))
    assert [(m.tool_call_id, m.content) for m in tools] == [
        ("c1", "via provider field"),
        ("c2", "via call_id field"),
    ]


def test_real_output_wins_over_unknown_placeholder() -> None:
    t = T().assistant("r1").call("r1", "c1").result("c1", "done").result("c1", "", state="unknown")
    t.assistant("r2").call("r2", "c2").result("c2", "", state="unknown").reconcile("c2", "late receipt")
    t1, t2 = tool_msgs(repair_history(t.items))
    assert (t1.content, t1.unknown_outcome) == ("done", False)
    assert (t2.content, t2.unknown_outcome) == ("late receipt", False)


def test_duplicate_real_results_last_saved_wins() -> None:
    t = T().assistant("r1").call("r1", "c1").result("c1", "old").result("c1", "", state="unknown")
    t.result("c1", "new", state="reconciled").result("c1", "", state="unknown")
    (only,) = tool_msgs(repair_history(t.items))
    assert (only.content, only.unknown_outcome) == ("new", False)


def test_missing_result_gets_deterministic_unknown_placeholder() -> None:
    t = T().assistant("r1").call("r1", "c1", tool="edit_file")
    (only,) = tool_msgs(repair_history(t.items))
    assert only == ProviderMessage(
        role="tool", tool_call_id="c1", unknown_outcome=True, content=placeholder_text("c1", "edit_file")
    )
    assert placeholder_text("c1", "edit_file") == placeholder_text("c1", "edit_file")
    assert "unknown" in only.content and "c1" in only.content and "edit_file" in only.content


def test_stored_unknown_result_projects_as_unknown_outcome() -> None:
    t = T().assistant("r1").call("r1", "c1").result("c1", "executor died", state="unknown")
    (only,) = tool_msgs(repair_history(t.items))
    assert only.unknown_outcome
    assert only.content.startswith(placeholder_text("c1", "shell")) and "executor died" in only.content


def test_never_started_result_says_so_and_is_not_unknown() -> None:
    t = T().assistant("r1").call("r1", "c1").call("r1", "c2").result("c2", "", state="never_started")
    unknown, never = tool_msgs(repair_history(t.items))
    assert unknown.unknown_outcome
    assert (never.content, never.unknown_outcome) == (never_started_text("c2", "shell"), False)
    assert "never started" in never.content


def test_call_and_result_adjacent_and_user_order_kept() -> None:
    t = T().user("u1").assistant("r1", "working").call("r1", "c1").call("r1", "c2")
    t.user("steer while running").result("c2", "two").user("u3").result("c1", "one")
    assert shape(repair_history(t.items)) == [
        ("user", "u1"),
        ("assistant", "working"),
        ("tool", "c1"),
        ("tool", "c2"),
        ("user", "steer while running"),
        ("user", "u3"),
    ]


def test_calls_without_assistant_item_form_an_assistant_message() -> None:
    t = T().user("u1").call("r1", "c1").call("r1", "c2").result("c1", "x")
    msgs = repair_history(t.items)
    assert shape(msgs) == [("user", "u1"), ("assistant", ""), ("tool", "c1"), ("tool", "c2")]
    assert [c.id for c in msgs[1].tool_calls] == ["c1", "c2"]


def test_assistant_carries_tool_calls_in_seq_order() -> None:
    t = (
        T()
        .assistant("r1", "hi")
        .call("r1", "c1", tool="read_file", path="a")
        .call("r1", "c2", tool="grep", q="b")
    )
    (assistant,) = [m for m in repair_history(t.items) if m.role == "assistant"]
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("c1", "read_file", {"path": "a"}),
        ("c2", "grep", {"q": "b"}),
    ]


def test_orphan_results_are_not_sent() -> None:
    t = T().user("u").result("ghost", "boo").assistant("r1").call("r1", "c1").result("c1", "ok")
    t.result("ghost2", "boo", pid="nope")
    assert shape(repair_history(t.items)) == [("user", "u"), ("assistant", ""), ("tool", "c1")]


def test_result_before_its_call_is_an_orphan() -> None:
    t = T().result("c1", "too early").assistant("r1").call("r1", "c1")
    (only,) = tool_msgs(repair_history(t.items))
    assert only.unknown_outcome


def test_interrupted_response_keeps_partial_text_and_marker_drops_signature() -> None:
    t = T().user("u").assistant("r1", "half a sent", interrupted=True, reasoning_signature="sig-XYZ")
    t.assistant("r2", "", interrupted=True)
    msgs = repair_history(t.items)
    assert [m.content for m in msgs[1:]] == [f"half a sent\n{INTERRUPTED_MARKER}", INTERRUPTED_MARKER]
    dumped = str([m.model_dump() for m in msgs])
    assert "sig-XYZ" not in dumped and "reasoning_signature" not in dumped


def test_ambiguous_duplicate_call_ids_in_one_response_raise() -> None:
    t = T().assistant("r1").call("r1", "c1").call("r1", "c1")
    with pytest.raises(AmbiguousCallIds, match="r1.*'c1'"):
        repair_history(t.items)
    t = T().assistant("r1").call("r1", "c1", pid="p").call("r1", "c2", pid="p")
    with pytest.raises(AmbiguousCallIds, match="provider call ID"):
        repair_history(t.items)


def test_same_call_id_in_different_responses_is_allowed() -> None:
    t = T().assistant("r1").call("r1", "c1").assistant("r2").call("r2", "c1").result("c1", "for r2")
    tools = tool_msgs(repair_history(t.items))
    assert [(m.unknown_outcome, m.content) for m in tools] == [
        (True, placeholder_text("c1", "shell")),
        (False, "for r2"),
    ]


def test_stored_history_unchanged() -> None:
    t = T().user("u").assistant("r1", "x", interrupted=True, reasoning_signature="s").call("r1", "c1", a=[1])
    t.result("c1", "", state="unknown").reconcile("c1", "late")
    items = list(reversed(t.items))
    before = copy.deepcopy([i.model_dump() for i in items])
    msgs = repair_history(items)
    msgs[1].tool_calls[0].arguments["a"].append(2)  # the output does not alias stored arguments
    assert [i.model_dump() for i in items] == before
    assert [i.item_id for i in items] == [i.item_id for i in reversed(t.items)]


def test_deterministic() -> None:
    t = T().user("u").assistant("r1").call("r1", "c1").call("r1", "c2").result("c2", "ok").user("v")
    assert repair_history(t.items) == repair_history(list(reversed(t.items))) == repair_history(t.items)


def test_system_prompt_is_first_message() -> None:
    t = T().user("u")
    assert shape(repair_history(t.items, system_prompt="be careful")) == [
        ("system", "be careful"),
        ("user", "u"),
    ]
    assert shape(repair_history(t.items)) == [("user", "u")]


def test_interruption_and_notice_items_are_not_sent() -> None:
    t = T().user("u")
    t.add(ItemKind.INTERRUPTION, "system", content="executor died")
    t.add(ItemKind.NOTICE, "system", content="recovered")
    assert shape(repair_history(t.items)) == [("user", "u")]


# --------------------------------------------------------------------------- properties

RESULT_VARIANTS = ["committed", "unknown", "never_started", "denied", "reconciled", "reconciliation"]


@st.composite
def transcripts(draw: st.DrawFn) -> list[TranscriptItem]:
    """Users and responses (0-3 calls); results missing, duplicated, orphaned, late; shuffled input."""
    base: list[dict[str, Any]] = []  # users, assistants and calls in stored order
    late: list[tuple[int, dict[str, Any]]] = []  # (earliest base index, item) for results
    for r in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            base.append(dict(kind=ItemKind.USER, role="user", content=f"user-{r}"))
            continue
        rid = f"r{r}"
        cids = draw(st.lists(st.sampled_from(["c0", "c1", "c2", "c3"]), max_size=3, unique=True))
        if not cids or draw(st.booleans()):
            meta = {"interrupted": True, "reasoning_signature": "sig"} if draw(st.booleans()) else {}
            base.append(
                dict(kind=ItemKind.ASSISTANT, role="assistant", response_id=rid, content=rid, meta=meta)
            )
        for j, cid in enumerate(cids):
            pid = draw(st.sampled_from([None, f"p-{rid}-{j}"]))
            base.append(
                dict(
                    kind=ItemKind.TOOL_CALL,
                    role="assistant",
                    response_id=rid,
                    call_id=cid,
                    provider_call_id=pid,
                    tool="shell",
                    arguments={"n": j},
                )
            )
            for variant in draw(st.lists(st.sampled_from(RESULT_VARIANTS), max_size=3)):
                by_pid = pid is not None and draw(st.booleans())
                kind = ItemKind.RECONCILIATION if variant == "reconciliation" else ItemKind.TOOL_RESULT
                late.append(
                    (
                        len(base),
                        dict(
                            kind=kind,
                            role="tool",
                            call_id=pid if by_pid else cid,
                            state=variant,
                            content=f"{variant}-{rid}-{cid}",
                        ),
                    )
                )
    for o in range(draw(st.integers(0, 2))):
        late.append(
            (
                0,
                dict(
                    kind=ItemKind.TOOL_RESULT,
                    role="tool",
                    call_id=f"orphan{o}",
                    state="committed",
                    content="orphan",
                ),
            )
        )
    # a result goes just before base[p] for some p after its call (p == len(base): at the end)
    keyed = [((i, 1), fields) for i, fields in enumerate(base)]
    keyed += [((draw(st.integers(earliest, len(base))), 0), fields) for earliest, fields in late]
    ordered = [fields for _, fields in sorted(keyed, key=lambda kv: kv[0])]  # stable among results
    items = [TranscriptItem(item_id=f"i{seq}", seq=seq, **f) for seq, f in enumerate(ordered)]
    return draw(st.permutations(items))


def assert_valid_tool_protocol(msgs: list[ProviderMessage]) -> None:
    i = 0
    while i < len(msgs):
        m = msgs[i]
        assert m.role != "tool", f"tool message not right after its assistant message at {i}"
        if m.role == "assistant":
            ids = [c.id for c in m.tool_calls]
            following = msgs[i + 1 : i + 1 + len(ids)]
            assert [(t.role, t.tool_call_id) for t in following] == [("tool", cid) for cid in ids]
            i += len(ids)
        i += 1


@settings(max_examples=300, deadline=None)
@given(transcripts())
def test_property_output_is_valid_tool_protocol(items: list[TranscriptItem]) -> None:
    before = copy.deepcopy([i.model_dump() for i in items])
    msgs = repair_history(items, system_prompt="sys")

    assert msgs[0].role == "system"
    assert_valid_tool_protocol(msgs[1:])
    stored = sorted(items, key=lambda it: it.seq)
    users = [it.content for it in stored if it.kind == ItemKind.USER]
    assert [m.content for m in msgs if m.role == "user"] == users
    responses = {it.response_id for it in stored if it.kind in (ItemKind.ASSISTANT, ItemKind.TOOL_CALL)}
    assert sum(m.role == "assistant" for m in msgs) == len(responses)
    calls = [it for it in stored if it.kind == ItemKind.TOOL_CALL]
    assert sum(m.role == "tool" for m in msgs) == len(calls)
    assert all("orphan" not in m.content for m in msgs)
    assert "sig" not in str([m.model_dump() for m in msgs])

    assert repair_history(list(reversed(items)), system_prompt="sys") == msgs  # deterministic, order-free
    assert [i.model_dump() for i in items] == before  # input unchanged


@settings(max_examples=200, deadline=None)
@given(transcripts())
def test_property_real_results_never_reported_unknown(items: list[TranscriptItem]) -> None:
    """Without reused call IDs, a call with any real result never projects as unknown."""
    stored = sorted(items, key=lambda it: it.seq)
    calls = [it for it in stored if it.kind == ItemKind.TOOL_CALL]
    if len({c.call_id for c in calls}) != len(calls):
        return
    tools = [m for m in repair_history(items) if m.role == "tool"]
    for call, msg in zip(calls, tools, strict=True):
        mine = {call.call_id, call.provider_call_id} - {None}
        real = [r for r in stored if r.role == "tool" and r.call_id in mine and r.state != "unknown"]
        assert msg.unknown_outcome == (not real)
        if real and real[-1].state != "never_started":
            assert msg.content == real[-1].content


def test_protocol_checker_rejects_broken_protocols() -> None:
    with pytest.raises(AssertionError):
        assert_valid_tool_protocol([ProviderMessage(role="tool", tool_call_id="x")])
    with pytest.raises(AssertionError):
        assert_valid_tool_protocol(
            [ProviderMessage(role="assistant", tool_calls=[ToolCallSpec(id="a", name="t")])]
        )


# --------------------------------------------------------------------------- late receipts


def test_late_receipt_after_later_turns_replaces_the_placeholder_in_place() -> None:
    from jupyter_goals.recovery.repair import late_receipt_text

    t = T().user("go").assistant("r1").call("r1", "c1").result("c1", placeholder_text("c1", "shell"), state="unknown")
    t.user("next").assistant("r2", "ok")
    stored = copy.deepcopy(t.items)
    t.reconcile("c1", late_receipt_text("c1", "exit status: 0"))
    msgs = repair_history(t.items)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "user", "assistant"]
    assert msgs[2].unknown_outcome is False
    assert msgs[2].content == late_receipt_text("c1", "exit status: 0") and "exit status: 0" in msgs[2].content
    assert t.items[: len(stored)] == stored  # the old items are untouched


def test_late_receipt_text_is_deterministic() -> None:
    from jupyter_goals.recovery.repair import late_receipt_text

    assert late_receipt_text("c1", "x") == late_receipt_text("c1", "x")
    assert late_receipt_text("c1", "x").startswith("[late result]")


# --------------------------------------------------------------------------- incremental history (issue 14)


def _full_or_error(items: list[TranscriptItem]) -> list[ProviderMessage] | type[Exception]:
    try:
        return repair_history(items, system_prompt="sys")
    except AmbiguousCallIds:
        return AmbiguousCallIds


@settings(max_examples=400, deadline=None)
@given(transcripts(), st.data())
def test_property_incremental_history_equals_a_full_rebuild_at_every_step(
    items: list[TranscriptItem], data: st.DataObject
) -> None:
    """Fed in seq order in random chunks (as a worker reads new items each step), the incremental
    projection equals ``repair_history`` of everything so far after every chunk: for late and
    duplicate receipts, reconciliations, unknown outcomes, orphans and interrupted responses."""
    ordered = sorted(items, key=lambda it: it.seq)
    history = IncrementalHistory("sys")
    fed = 0
    while fed < len(ordered):
        n = data.draw(st.integers(1, max(1, len(ordered) - fed)))
        chunk, fed = ordered[fed:fed + n], fed + n
        expected = _full_or_error(ordered[:fed])
        if expected is AmbiguousCallIds:
            with pytest.raises(AmbiguousCallIds):
                history.update(chunk)
            return
        assert history.update(chunk) == expected
        assert isinstance(expected, list) and history.tokens == estimate_tokens(expected)


@settings(max_examples=150, deadline=None)
@given(transcripts(), st.data())
def test_property_a_compaction_replaces_what_it_covers_incrementally_too(
    items: list[TranscriptItem], data: st.DataObject
) -> None:
    """A compaction item covering a closed prefix: requests carry the summary plus the later items,
    both from a full rebuild and incrementally; the stored items are never changed."""
    ordered = sorted(items, key=lambda it: it.seq)
    cut = data.draw(st.integers(0, len(ordered)))
    top = ordered[-1].seq + 1 if ordered else 0
    summary = TranscriptItem(item_id="cmp", seq=top, kind=ItemKind.COMPACTION, role="system", content="summary",
                             meta={"up_to_seq": ordered[cut - 1].seq if cut else -1})
    after = [it.model_copy(update={"seq": top + 1 + k, "item_id": f"a{k}"}) for k, it in enumerate(ordered[cut:])]
    everything = [*ordered, summary, *after]
    expected = _full_or_error(everything)
    history = IncrementalHistory("sys")
    try:
        history.update(ordered)
    except AmbiguousCallIds:
        return  # the uncompacted prefix alone is ambiguous: nothing to compare
    if expected is AmbiguousCallIds:
        with pytest.raises(AmbiguousCallIds):
            history.update([summary, *after])
        return
    assert history.update([summary, *after]) == expected
    assert isinstance(expected, list) and history.tokens == estimate_tokens(expected)
    assert isinstance(expected, list) and expected[1].content.startswith("[summary of the earlier conversation")


def test_a_tool_loop_step_rebuilds_nothing() -> None:
    """The common step (a new response, then its result) re-projects only the open tail: no rebuild
    however long the session is."""
    history = IncrementalHistory("sys")
    seq = 0
    history.update([TranscriptItem(item_id="u", seq=seq, kind=ItemKind.USER, role="user", content="go")])
    for step in range(200):
        seq += 1
        call = TranscriptItem(item_id=f"c{step}", seq=seq, kind=ItemKind.TOOL_CALL, role="assistant",
                              response_id=f"r{step}", call_id=f"call{step}", tool="read_file", arguments={})
        seq += 1
        result = TranscriptItem(item_id=f"t{step}", seq=seq, kind=ItemKind.TOOL_RESULT, role="tool",
                                call_id=f"call{step}", state="committed", content=f"out {step}")
        history.update([call])
        msgs = history.update([result])
    assert history.rebuilds == 0
    assert len(msgs) == 1 + 1 + 2 * 200 and msgs[-1].content == "out 199"
