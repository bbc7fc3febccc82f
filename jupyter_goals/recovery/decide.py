"""``decide()``: what to do with a work item that has no live attempt. Pure: facts in, decision out.

Priority (spec "Decide"): user stop/pause > live or unreachable owner > auto-recovery disabled >
pending approval > Goal and dependency waits (a person's steered message is not held back by a dependency
wait: input first) > permissions > budget > resources (cwd, model, credentials, tool version) >
crash-loop cap > durable retry time > admit. Unknown effects restrict the next turn; they do not
block it. There is no expiry by age: how long ago the work was last touched is not a fact here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from jupyter_goals.models import DesiredState, Phase, ReasonCode, RecoveryMode


class Owner(StrEnum):
    NONE = "none"  # no attempt is running (fresh work, or the owner's death was confirmed)
    LIVE = "live"  # the executor is alive: reconnect only
    UNREACHABLE = "unreachable"  # another host's executor, lease expired, takeover not allowed


class Action(StrEnum):
    KEEP = "keep"
    ADMIT = "admit"
    WAIT = "wait"
    PAUSE = "pause"
    CANCEL = "cancel"
    DONE = "done"
    FAIL = "fail"


@dataclass(frozen=True)
class RecoveryFacts:
    desired_state: DesiredState
    reason_code: str = ""
    owner: Owner = Owner.NONE
    # the latest attempt of this work died under the current control version: a recovery, not a
    # first admission (a user Resume or Retry since then is an explicit admission)
    interrupted: bool = False
    auto_recover: bool = True
    pending_approval: bool = False
    # the item's Goal holds it back (blocked, budget_exhausted, awaiting_clarification): a durable wait
    goal_wait: ReasonCode | None = None
    # a durable wait still open (a subtask not finished): waiting, no model turns until it is notified
    dependency_wait: ReasonCode | None = None
    # a message the person sent to steer this work is not read yet: user input outranks the dependency
    # wait, so the work is admitted to read it (the wait stays open; its result is delivered later)
    steer_pending: bool = False
    permission_revoked: bool = False
    budget_problem: ReasonCode | None = None
    cwd_exists: bool = True
    model_problem: ReasonCode | None = None
    changed_tools: tuple[str, ...] = ()
    recovery_attempts: int = 0  # consecutive executor deaths attributed to this work
    max_recovery_attempts: int = 5  # recoveries allowed; the death after the last one fails the work
    retry_at: float = 0.0
    now: float = 0.0
    has_open_turn: bool = False
    unknown_effects: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecoveryDecision:
    action: Action
    phase: Phase
    reason_code: ReasonCode
    mode: RecoveryMode | None = None  # fresh | resume_checkpoint | new_turn, for ADMIT
    restricted: bool = False


PAUSE_REASONS = {ReasonCode.USER_PAUSED, ReasonCode.AUTO_RECOVERY_DISABLED}


def decide(f: RecoveryFacts) -> RecoveryDecision:
    if f.desired_state == DesiredState.CANCELLED:
        return RecoveryDecision(Action.CANCEL, Phase.CANCELLED, ReasonCode.USER_STOPPED)
    if f.desired_state == DesiredState.DONE:
        return RecoveryDecision(Action.DONE, Phase.DONE, ReasonCode.COMPLETED)
    if f.desired_state == DesiredState.PAUSED:
        known = f.reason_code in {r.value for r in PAUSE_REASONS}
        return RecoveryDecision(
            Action.PAUSE, Phase.PAUSED, ReasonCode(f.reason_code) if known else ReasonCode.LEGACY_PAUSED_UNKNOWN
        )
    if f.owner == Owner.LIVE:
        return RecoveryDecision(Action.KEEP, Phase.WORKING, ReasonCode.OWNER_ALIVE)
    if f.owner == Owner.UNREACHABLE:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, ReasonCode.OWNER_HOST_UNREACHABLE)
    if f.interrupted and not f.auto_recover:
        return RecoveryDecision(Action.PAUSE, Phase.PAUSED, ReasonCode.AUTO_RECOVERY_DISABLED)
    if f.pending_approval:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, ReasonCode.AWAITING_APPROVAL)
    if f.goal_wait is not None:  # waiting without idle model turns
        return RecoveryDecision(Action.WAIT, Phase.WAITING, f.goal_wait)
    if f.dependency_wait is not None and not f.steer_pending:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, f.dependency_wait)
    if f.permission_revoked:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, ReasonCode.PERMISSION_REVOKED)
    if f.budget_problem is not None:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, f.budget_problem)
    if not f.cwd_exists:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, ReasonCode.RESOURCE_MISSING_CWD)
    if f.model_problem is not None:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, f.model_problem)
    if f.changed_tools:
        return RecoveryDecision(Action.WAIT, Phase.WAITING, ReasonCode.TOOL_CHANGED)
    if f.recovery_attempts > f.max_recovery_attempts:
        return RecoveryDecision(Action.FAIL, Phase.FAILED, ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED)
    if f.retry_at > f.now:  # a durable retry time: after an executor death, or after a provider fault
        code = ReasonCode.RECOVERY_BACKOFF if f.interrupted else ReasonCode.PROVIDER_RETRYING
        return RecoveryDecision(Action.WAIT, Phase.WAITING, code)
    return RecoveryDecision(
        Action.ADMIT,
        Phase.QUEUED,
        ReasonCode.RECOVERED if f.interrupted else ReasonCode.QUEUED,
        mode=admission_mode(has_open_turn=f.has_open_turn, interrupted=f.interrupted),
        restricted=bool(f.unknown_effects),
    )


def admission_mode(*, has_open_turn: bool, interrupted: bool) -> RecoveryMode:
    """How admitted work continues: its open turn from the last safe checkpoint, else a new turn
    (after an interruption) or a fresh one."""
    if has_open_turn:
        return RecoveryMode.RESUME_CHECKPOINT
    return RecoveryMode.NEW_TURN if interrupted else RecoveryMode.FRESH


def repair_mode(*, turn_running: bool, unknown_outcomes: bool) -> RecoveryMode:
    """The one recovery mode of a dead attempt: none without a running turn; a new turn when some
    call's outcome is unknown (the turn ends ``interrupted``); else resume from the checkpoint."""
    if not turn_running:
        return RecoveryMode.NONE
    return RecoveryMode.NEW_TURN if unknown_outcomes else RecoveryMode.RESUME_CHECKPOINT
