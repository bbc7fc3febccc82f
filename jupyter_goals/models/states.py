"""Run intent and execution states: what a work item, turn, attempt, effect and transcript item can be,
and what a recovery pass did with a work item. Pure enums (states are enums, never strings)."""

from __future__ import annotations

from enum import StrEnum

# --------------------------------------------------------------------------- run intent


class DesiredState(StrEnum):
    RUN = "run"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


class Phase(StrEnum):
    QUEUED = "queued"
    WORKING = "working"
    WAITING = "waiting"
    RECOVERING = "recovering"
    FAILED = "failed"
    PAUSED = "paused"
    INTERRUPTED = "interrupted"
    DONE = "done"
    CANCELLED = "cancelled"


TERMINAL_PHASES = frozenset({Phase.DONE, Phase.CANCELLED})


class WorkKind(StrEnum):
    CHAT = "chat"
    GOAL = "goal"
    JOB = "job"
    SUBTASK = "subtask"


# --------------------------------------------------------------------------- execution


class TurnState(StrEnum):
    RUNNING = "running"
    COMMITTED = "committed"
    INTERRUPTED = "interrupted"


class AttemptState(StrEnum):
    ADMITTED = "admitted"
    RUNNING = "running"
    ENDED = "ended"
    DEAD = "dead"


class RecoveryMode(StrEnum):
    """How work continues: an attempt's ``mode`` (fresh, resume_checkpoint, new_turn) and a recovery
    claim's decided mode (resume_checkpoint, new_turn, or none when no turn was running)."""

    NONE = "none"
    FRESH = "fresh"
    RECONNECT = "reconnect"
    RESUME_CHECKPOINT = "resume_checkpoint"
    NEW_TURN = "new_turn"


class StepKind(StrEnum):
    """The turn loop's next step, derived from durable facts (``TurnRunner._next_step``)."""

    STOP = "stop"
    REATTACH = "reattach"
    DISPATCH = "dispatch"
    APPROVAL = "approval"
    DELIVER = "deliver"
    PROVIDER = "provider"
    FINISH = "finish"
    REQUIREMENTS = "requirements"  # a Goal's requirements extraction
    VERIFY = "verify"  # a Goal's acceptance check
    WAIT = "wait"  # a Goal waits (the attempt ended): the loop stops


class Capability(StrEnum):
    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    STATE_PROBE = "state_probe"
    STATE_TOOL = "state_tool"
    UNKNOWN = "unknown"


class EffectState(StrEnum):
    PLANNED = "planned"
    DISPATCHED = "dispatched"
    COMMITTED = "committed"
    UNKNOWN = "unknown"
    RECONCILED = "reconciled"
    NEVER_STARTED = "never_started"
    DENIED = "denied"
    CANCELLED = "cancelled"  # a person stopped it while it ran: killed, its real exit status and output kept


class ItemKind(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    INTERRUPTION = "interruption"
    RECONCILIATION = "reconciliation"
    NOTICE = "notice"
    # internal Goal records, identified by kind (never by parsing text): a continuation prompt the
    # model reads as a user-role message but the chat does not show, and a terminal Goal record
    GOAL_PROMPT = "goal_prompt"
    GOAL_RECORD = "goal_record"
    # a finished subtask's result delivered to its parent once (user-role for the model)
    SUBTASK_RESULT = "subtask_result"
    # a durable summary of everything up to ``meta.up_to_seq``: requests send it instead of those items
    # (the stored transcript is never shortened; the UI marks where it happened)
    COMPACTION = "compaction"


# what a paid request is for (each is attributed and priced apart)
class Purpose(StrEnum):
    WORK = "work"
    ACCEPTANCE = "acceptance"
    REQUIREMENTS = "requirements"
    COMPACTION = "compaction"


# --------------------------------------------------------------------------- recovery summary


class RecoveryOutcome(StrEnum):
    CONTINUED = "continued"
    WAITING = "waiting"
    PAUSED = "paused"
    STOPPED = "stopped"
    FAILED = "failed"


def recovery_outcome(desired_state: str, phase: str) -> RecoveryOutcome:
    """What a recovery pass did with a work item, in the words of the recovery summary: the person's
    stop or pause first, then a fault, a wait, else it continued (queued, admitted, or already done)."""
    if desired_state == DesiredState.CANCELLED or phase == Phase.CANCELLED:
        return RecoveryOutcome.STOPPED
    if desired_state == DesiredState.PAUSED or phase == Phase.PAUSED:
        return RecoveryOutcome.PAUSED
    if phase == Phase.FAILED:
        return RecoveryOutcome.FAILED
    if phase == Phase.WAITING:
        return RecoveryOutcome.WAITING
    return RecoveryOutcome.CONTINUED
