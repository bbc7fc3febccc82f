"""The turn loop's next step is a pure function of loaded facts (issue 13): its rules in priority
order, checked over every combination of facts hypothesis draws, without a database."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_goals.models import ItemKind, StepKind
from jupyter_goals.runtime.steps import StepFacts, next_step

CALL: dict[str, Any] = {"call_id": "c1", "tool": "shell"}
OTHER: dict[str, Any] = {"call_id": "c2", "tool": "write_file"}

facts = st.builds(
    StepFacts,
    runnable=st.booleans(),
    dispatched=st.none() | st.just(CALL),
    planned=st.none() | st.just(OTHER),
    planned_runs_freely=st.booleans(),
    open_waits=st.booleans(),
    ready_waits=st.booleans(),
    steer=st.sampled_from([(), ({"message_id": "m1", "text": "also this"},)]),
    goal_step=st.sampled_from([None, StepKind.REQUIREMENTS, StepKind.VERIFY, StepKind.WAIT]),
    last_kind=st.sampled_from([None, ItemKind.USER, ItemKind.ASSISTANT, ItemKind.TOOL_RESULT]),
    last_has_calls=st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(facts)
def test_the_rules_hold_for_every_combination_of_facts(f: StepFacts) -> None:
    d = next_step(f)
    if not f.runnable:  # a control change ends the attempt whatever else is pending; nothing is consumed
        assert (d.kind, d.consume_steer, d.wait_for_subtasks, d.wait_for_clarification) == (StepKind.STOP, False, False, False)
        return
    if f.dispatched is not None:  # a running command is reattached before anything else happens
        assert (d.kind, d.effect) == (StepKind.REATTACH, CALL)
        return
    if f.planned is not None:  # a planned call runs (or is checked) before the model is asked again
        assert (d.kind, d.effect, d.check_permission) == (StepKind.DISPATCH, OTHER, not f.planned_runs_freely)
        return
    assert d.kind != StepKind.REATTACH and d.effect is None
    if f.open_waits and not f.steer:  # a durable wait: no idle model turns
        assert (d.kind, d.wait_for_subtasks, d.consume_steer) == (StepKind.STOP, True, False)
        return
    if f.ready_waits:
        assert d.kind == StepKind.DELIVER and not d.consume_steer
        return
    if f.open_waits:  # input first: a steered message is read at once, the wait stays open
        assert (d.kind, d.consume_steer, d.wait_for_subtasks) == (StepKind.PROVIDER, True, False)
        return
    assert d.consume_steer == bool(f.steer)  # from here on, a steer message always joins the turn first
    if f.goal_step is not None:
        expected = StepKind.STOP if f.goal_step == StepKind.WAIT else f.goal_step
        assert (d.kind, d.wait_for_clarification) == (expected, f.goal_step == StepKind.WAIT)
        return
    finished = not f.steer and f.last_kind == ItemKind.ASSISTANT and not f.last_has_calls
    assert d.kind == (StepKind.FINISH if finished else StepKind.PROVIDER)


def test_a_steer_message_after_the_final_answer_asks_the_model_again() -> None:
    done = StepFacts(runnable=True, last_kind=ItemKind.ASSISTANT)
    assert next_step(done).kind == StepKind.FINISH
    steered = StepFacts(runnable=True, last_kind=ItemKind.ASSISTANT, steer=({"message_id": "m", "text": "t"},))
    assert (next_step(steered).kind, next_step(steered).consume_steer) == (StepKind.PROVIDER, True)


def test_an_answer_that_asked_for_tools_does_not_finish_the_turn() -> None:
    assert next_step(StepFacts(runnable=True, last_kind=ItemKind.ASSISTANT, last_has_calls=True)).kind == StepKind.PROVIDER


def test_a_message_steered_while_a_subtask_runs_is_read_at_once_and_the_wait_goes_on() -> None:
    steer = ({"message_id": "m", "text": "also this"},)
    waiting = StepFacts(runnable=True, open_waits=True, last_kind=ItemKind.TOOL_RESULT)
    assert (next_step(waiting).kind, next_step(waiting).wait_for_subtasks) == (StepKind.STOP, True)
    steered = StepFacts(runnable=True, open_waits=True, steer=steer, last_kind=ItemKind.TOOL_RESULT)
    assert (next_step(steered).kind, next_step(steered).consume_steer) == (StepKind.PROVIDER, True)
    answered = StepFacts(runnable=True, open_waits=True, last_kind=ItemKind.ASSISTANT)  # the model answered it
    assert (next_step(answered).kind, next_step(answered).wait_for_subtasks) == (StepKind.STOP, True)
