"""``decide()`` (DESIGN §8 step 4): one unit test per priority rule, then properties.

Each rule test also switches on every rule of *lower* priority, so it proves both the reason code
and that the rule wins over everything below it: removing or reordering a rule fails its test.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_goals.models import DesiredState, Phase, ReasonCode
from jupyter_goals.recovery.decide import Action, Owner, RecoveryDecision, RecoveryFacts, decide

NOW = 1_700_000_000.0
HOUR = 3600.0

# Every blocking fact below "run intent", highest priority first. A rule test turns on its own
# fact plus all facts after it; facts sharing a field (owner, model_problem) keep the higher one.
RULES: list[tuple[str, dict[str, Any]]] = [
    ("live_owner", {"owner": Owner.LIVE}),
    ("unreachable_owner", {"owner": Owner.UNREACHABLE}),
    ("auto_recover_off", {"interrupted": True, "auto_recover": False}),
    ("pending_approval", {"pending_approval": True}),
    ("permission_revoked", {"permission_revoked": True}),
    ("budget", {"budget_problem": ReasonCode.BUDGET_EXHAUSTED}),
    ("cwd", {"cwd_exists": False}),
    ("model", {"model_problem": ReasonCode.RESOURCE_MISSING_MODEL}),
    ("credentials", {"model_problem": ReasonCode.RESOURCE_MISSING_CREDENTIALS}),
    ("tool_changed", {"changed_tools": ("edit_file",)}),
    ("attempts_exceeded", {"recovery_attempts": 6, "max_recovery_attempts": 5}),
    ("provider_retrying", {"retry_at": NOW + 30}),
]
RULE_NAMES = [name for name, _ in RULES]


def facts(**fields: Any) -> RecoveryFacts:
    base: dict[str, Any] = {"desired_state": DesiredState.RUN, "now": NOW}
    base.update(fields)
    return RecoveryFacts(**base)


def from_rule(name: str, **overrides: Any) -> RecoveryFacts:
    """Facts where rule ``name`` and every lower-priority rule hold at once."""
    fields: dict[str, Any] = {"interrupted": True, "unknown_effects": ("call_w",)}
    start = RULE_NAMES.index(name)
    for _, rule_fields in reversed(RULES[start:]):
        fields.update(rule_fields)
    fields.update(overrides)
    return facts(**fields)


def every_problem(**overrides: Any) -> RecoveryFacts:
    return from_rule(RULE_NAMES[0], **overrides)


def expect(d: RecoveryDecision, action: Action, phase: Phase, reason: ReasonCode) -> None:
    assert (d.action, d.phase, d.reason_code) == (action, phase, reason)


# --------------------------------------------------------------------------- user intent wins


def test_stop_beats_every_other_fact() -> None:
    d = decide(every_problem(desired_state=DesiredState.CANCELLED, reason_code=ReasonCode.USER_PAUSED))
    expect(d, Action.CANCEL, Phase.CANCELLED, ReasonCode.USER_STOPPED)


def test_done_work_stays_done() -> None:
    expect(decide(every_problem(desired_state=DesiredState.DONE)), Action.DONE, Phase.DONE, ReasonCode.COMPLETED)


def test_paused_work_is_not_resumed_after_restart() -> None:
    d = decide(every_problem(desired_state=DesiredState.PAUSED, reason_code=ReasonCode.USER_PAUSED))
    expect(d, Action.PAUSE, Phase.PAUSED, ReasonCode.USER_PAUSED)


def test_pause_beats_a_live_owner_and_a_runnable_state() -> None:
    for f in (
        facts(desired_state=DesiredState.PAUSED, reason_code="user_paused", owner=Owner.LIVE),
        facts(desired_state=DesiredState.PAUSED, reason_code="user_paused"),
    ):
        expect(decide(f), Action.PAUSE, Phase.PAUSED, ReasonCode.USER_PAUSED)


def test_work_paused_because_auto_recovery_was_off_keeps_that_reason() -> None:
    d = decide(facts(desired_state=DesiredState.PAUSED, reason_code="auto_recovery_disabled", auto_recover=True))
    expect(d, Action.PAUSE, Phase.PAUSED, ReasonCode.AUTO_RECOVERY_DISABLED)


def test_old_pause_of_unknown_cause_stays_paused_as_legacy_paused_unknown() -> None:
    for legacy_reason in ("", "paused_recoverable", "working", "something an old version wrote"):
        d = decide(facts(desired_state=DesiredState.PAUSED, reason_code=legacy_reason))
        expect(d, Action.PAUSE, Phase.PAUSED, ReasonCode.LEGACY_PAUSED_UNKNOWN)


# --------------------------------------------------------------------------- one test per rule


def test_live_owner_is_kept_and_only_reconnected() -> None:
    expect(decide(from_rule("live_owner")), Action.KEEP, Phase.WORKING, ReasonCode.OWNER_ALIVE)


def test_work_of_an_unreachable_host_waits_as_owner_host_unreachable() -> None:
    d = decide(from_rule("unreachable_owner"))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.OWNER_HOST_UNREACHABLE)


def test_interrupted_work_with_auto_recovery_disabled_is_paused() -> None:
    d = decide(from_rule("auto_recover_off"))
    expect(d, Action.PAUSE, Phase.PAUSED, ReasonCode.AUTO_RECOVERY_DISABLED)


def test_auto_recovery_disabled_does_not_hold_back_fresh_work() -> None:
    d = decide(facts(interrupted=False, auto_recover=False))
    expect(d, Action.ADMIT, Phase.QUEUED, ReasonCode.QUEUED)
    assert d.mode == "fresh"


def test_pending_approval_waits_for_the_user() -> None:
    d = decide(from_rule("pending_approval"))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.AWAITING_APPROVAL)


def test_a_steered_message_admits_work_waiting_on_a_subtask_and_nothing_else_does() -> None:
    """Input first (issue 32 item 6): the person's message is read while the subtask runs."""
    waiting = RecoveryFacts(desired_state=DesiredState.RUN, dependency_wait=ReasonCode.AWAITING_SUBTASK, has_open_turn=True)
    expect(decide(waiting), Action.WAIT, Phase.WAITING, ReasonCode.AWAITING_SUBTASK)
    steered = dataclasses.replace(waiting, steer_pending=True)
    assert decide(steered).action == Action.ADMIT
    # a stop, a pause, an approval and a Goal's own wait still come first
    for held in (dict(desired_state=DesiredState.PAUSED, reason_code="user_paused"), dict(pending_approval=True),
                 dict(goal_wait=ReasonCode.AWAITING_CLARIFICATION)):
        assert decide(dataclasses.replace(steered, **held)).action in (Action.PAUSE, Action.WAIT)


def test_revoked_permission_waits_as_permission_revoked() -> None:
    d = decide(from_rule("permission_revoked"))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.PERMISSION_REVOKED)


def test_budget_problem_waits_with_its_own_reason() -> None:
    expect(decide(from_rule("budget")), Action.WAIT, Phase.WAITING, ReasonCode.BUDGET_EXHAUSTED)
    d = decide(from_rule("budget", budget_problem=ReasonCode.BUDGET_UNVERIFIABLE))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.BUDGET_UNVERIFIABLE)


def test_missing_cwd_waits_as_resource_missing_cwd() -> None:
    expect(decide(from_rule("cwd")), Action.WAIT, Phase.WAITING, ReasonCode.RESOURCE_MISSING_CWD)


def test_missing_model_waits_as_resource_missing_model() -> None:
    expect(decide(from_rule("model")), Action.WAIT, Phase.WAITING, ReasonCode.RESOURCE_MISSING_MODEL)


def test_missing_credentials_wait_as_resource_missing_credentials() -> None:
    d = decide(from_rule("credentials"))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.RESOURCE_MISSING_CREDENTIALS)


def test_changed_tool_implementation_waits_as_tool_changed() -> None:
    expect(decide(from_rule("tool_changed")), Action.WAIT, Phase.WAITING, ReasonCode.TOOL_CHANGED)


def test_work_that_keeps_killing_executors_fails_as_recovery_attempts_exceeded() -> None:
    d = decide(from_rule("attempts_exceeded"))
    expect(d, Action.FAIL, Phase.FAILED, ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED)


def test_recovery_attempts_up_to_the_cap_still_admit() -> None:
    d = decide(facts(interrupted=True, recovery_attempts=5, max_recovery_attempts=5))
    assert d.action == Action.ADMIT


def test_retry_time_in_the_future_waits_as_provider_retrying() -> None:
    d = decide(from_rule("provider_retrying", interrupted=False))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.PROVIDER_RETRYING)


def test_retry_time_after_an_executor_death_waits_as_recovery_backoff() -> None:
    d = decide(from_rule("provider_retrying", interrupted=True, recovery_attempts=2))
    expect(d, Action.WAIT, Phase.WAITING, ReasonCode.RECOVERY_BACKOFF)


def test_retry_time_reached_admits() -> None:
    assert decide(facts(retry_at=NOW)).action == Action.ADMIT
    assert decide(facts(retry_at=NOW - 1)).action == Action.ADMIT


# --------------------------------------------------------------------------- admission modes


def test_fresh_work_is_admitted_fresh() -> None:
    d = decide(facts())
    expect(d, Action.ADMIT, Phase.QUEUED, ReasonCode.QUEUED)
    assert (d.mode, d.restricted) == ("fresh", False)


def test_interrupted_work_with_an_open_turn_resumes_from_the_checkpoint() -> None:
    d = decide(facts(interrupted=True, recovery_attempts=1, has_open_turn=True))
    expect(d, Action.ADMIT, Phase.QUEUED, ReasonCode.RECOVERED)
    assert d.mode == "resume_checkpoint"


def test_interrupted_work_whose_turn_ended_gets_a_new_turn() -> None:
    d = decide(facts(interrupted=True, recovery_attempts=1, has_open_turn=False))
    expect(d, Action.ADMIT, Phase.QUEUED, ReasonCode.RECOVERED)
    assert d.mode == "new_turn"


def test_unknown_effects_restrict_the_next_turn_but_do_not_block_it() -> None:
    d = decide(facts(interrupted=True, recovery_attempts=1, unknown_effects=("call_1", "call_2")))
    expect(d, Action.ADMIT, Phase.QUEUED, ReasonCode.RECOVERED)
    assert d.mode == "new_turn"
    assert d.restricted is True


# --------------------------------------------------------------------------- properties

reason_codes = st.sampled_from([r.value for r in ReasonCode] + ["paused_recoverable", "legacy-anything"])
call_ids = st.lists(st.text("abcdef0123456789_", min_size=1, max_size=8), max_size=3).map(tuple)
any_facts = st.builds(
    RecoveryFacts,
    desired_state=st.sampled_from(list(DesiredState)),
    reason_code=reason_codes,
    owner=st.sampled_from(list(Owner)),
    interrupted=st.booleans(),
    auto_recover=st.booleans(),
    pending_approval=st.booleans(),
    permission_revoked=st.booleans(),
    budget_problem=st.none() | st.sampled_from([ReasonCode.BUDGET_EXHAUSTED, ReasonCode.BUDGET_UNVERIFIABLE]),
    cwd_exists=st.booleans(),
    model_problem=st.none()
    | st.sampled_from([ReasonCode.RESOURCE_MISSING_MODEL, ReasonCode.RESOURCE_MISSING_CREDENTIALS]),
    changed_tools=call_ids,
    recovery_attempts=st.integers(0, 10),
    max_recovery_attempts=st.integers(0, 10),
    retry_at=st.floats(0, 2 * NOW, allow_nan=False),
    now=st.floats(0, 2 * NOW, allow_nan=False),
    has_open_turn=st.booleans(),
    unknown_effects=call_ids,
)


def test_facts_carry_no_age_or_last_touched_input() -> None:
    names = {f.name for f in dataclasses.fields(RecoveryFacts)}
    forbidden = ("age", "touched", "updated", "created", "last_seen", "since", "expires")
    assert not [n for n in names for word in forbidden if word in n], names


def test_run_intent_touched_three_hours_ago_still_admits() -> None:
    # the work was last touched (its provider backoff set) three hours before "now"
    stale = facts(interrupted=True, recovery_attempts=1, retry_at=NOW - 3 * HOUR, now=NOW)
    d = decide(stale)
    assert d.action == Action.ADMIT
    assert d.reason_code == ReasonCode.RECOVERED


@settings(max_examples=300, deadline=None)
@given(f=any_facts, shift=st.floats(0, 10 * 365 * 24 * HOUR, allow_nan=False))
def test_decision_is_a_function_of_the_facts_only(f: RecoveryFacts, shift: float) -> None:
    first = decide(f)
    # no hidden clock: whatever the wall clock says, the same facts give the same decision
    with mock.patch("time.time", return_value=f.now + 3 * HOUR), mock.patch(
        "time.monotonic", return_value=shift
    ):
        assert decide(f) == first
    # only the relation of now to retry_at matters, not how much time went by
    later = dataclasses.replace(f, now=f.now + shift, retry_at=f.retry_at + shift if f.retry_at else 0.0)
    if (later.retry_at > later.now) == (f.retry_at > f.now):
        assert decide(later) == first


@settings(max_examples=300, deadline=None)
@given(f=any_facts)
def test_stop_and_pause_win_whatever_the_other_facts(f: RecoveryFacts) -> None:
    stopped = decide(dataclasses.replace(f, desired_state=DesiredState.CANCELLED))
    expect(stopped, Action.CANCEL, Phase.CANCELLED, ReasonCode.USER_STOPPED)
    paused = decide(dataclasses.replace(f, desired_state=DesiredState.PAUSED))
    assert (paused.action, paused.phase) == (Action.PAUSE, Phase.PAUSED)
    if f.reason_code in (ReasonCode.USER_PAUSED, ReasonCode.AUTO_RECOVERY_DISABLED):
        assert paused.reason_code == f.reason_code
    else:
        assert paused.reason_code == ReasonCode.LEGACY_PAUSED_UNKNOWN


@settings(max_examples=300, deadline=None)
@given(f=any_facts, unknown=call_ids)
def test_unknown_effects_only_ever_change_the_restriction(f: RecoveryFacts, unknown: tuple[str, ...]) -> None:
    without = decide(dataclasses.replace(f, unknown_effects=()))
    with_unknown = decide(dataclasses.replace(f, unknown_effects=unknown))
    assert dataclasses.replace(with_unknown, restricted=False) == without
    assert without.restricted is False


runnable_facts = st.builds(
    RecoveryFacts,
    desired_state=st.just(DesiredState.RUN),
    reason_code=reason_codes,
    interrupted=st.booleans(),
    recovery_attempts=st.integers(0, 5),
    max_recovery_attempts=st.just(5),
    retry_at=st.floats(0, NOW, allow_nan=False),
    now=st.just(NOW),
    has_open_turn=st.booleans(),
    unknown_effects=call_ids,
)


@settings(max_examples=200, deadline=None)
@given(f=runnable_facts)
def test_runnable_work_is_admitted_restricted_exactly_when_effects_are_unknown(f: RecoveryFacts) -> None:
    d = decide(f)
    assert (d.action, d.phase) == (Action.ADMIT, Phase.QUEUED)
    assert d.restricted == bool(f.unknown_effects)
    assert d.reason_code == (ReasonCode.RECOVERED if f.interrupted else ReasonCode.QUEUED)
    expected_mode = "resume_checkpoint" if f.has_open_turn else ("new_turn" if f.interrupted else "fresh")
    assert d.mode == expected_mode


@settings(max_examples=300, deadline=None)
@given(f=any_facts)
def test_work_that_should_run_is_never_cancelled_or_marked_done(f: RecoveryFacts) -> None:
    d = decide(dataclasses.replace(f, desired_state=DesiredState.RUN))
    assert d.action not in (Action.CANCEL, Action.DONE)
    assert d.phase not in (Phase.CANCELLED, Phase.DONE)


def test_scope_lost_counts_only_a_narrowing_of_the_saved_permission_scope() -> None:
    """The Coordinator's ``permission_revoked`` fact: what a work item's saved scope lets run that the
    current permissions of its session (or its Job's caller, or its parent) no longer do."""
    from jupyter_goals.recovery.facts import scope_lost

    rule = {"tool": "write_file", "path": "notes/**"}
    assert scope_lost({"mode": "bypass"}, {"mode": "ask"}) == ["bypass mode"]
    assert scope_lost({"mode": "bypass"}, {"mode": "bypass"}) == []
    assert scope_lost({"mode": "ask", "allow": ["shell"]}, {"mode": "bypass"}) == []  # wider: nothing lost
    assert scope_lost({"mode": "ask", "allow": ["shell", rule]}, {"mode": "ask", "allow": [rule]}) == [
        'the allow rule "shell"']
    assert scope_lost({"mode": "ask", "allow": [rule]}, {"mode": "ask", "allow": ["shell"]}) == [
        'the allow rule {"path": "notes/**", "tool": "write_file"}']
    assert scope_lost({"mode": "bypass", "env_allow": ["HF_HOME"]}, {"mode": "bypass"}) == [
        "the environment variable HF_HOME"]
    assert scope_lost({"mode": "ask"}, {"mode": "ask", "allow": ["shell"], "env_allow": ["X"]}) == []
