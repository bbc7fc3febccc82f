"""The event log's kinds and payloads (ground layer): every kind the package emits is an ``EventKind``,
and each has a payload model here, the schema ``GET /openapi.json`` states for it (``Event``, a union
on ``kind``). Declarations only, no I/O; ``tests/test_events.py`` checks that every kind emitted in the
package is listed and that the events representative flows write match their payload models.

Events are wake-ups: a view re-reads the REST answer an event concerns, so a payload says what changed,
never the whole state. A payload may gain keys in a later version (readers ignore the ones they do not
know); the log is history, so ``GET /events`` passes an older event on as it was stored.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from jupyter_goals.models import (
    Capability,
    DesiredState,
    EffectState,
    GoalPhase,
    GoalState,
    ItemKind,
    Permissions,
    Phase,
    RecoveryMode,
    TurnState,
    Verdict,
    WorkKind,
)


class EventKind(StrEnum):
    SESSION_CREATED = "session.created"
    SESSION_PERMISSIONS = "session.permissions"
    SESSION_UPDATED = "session.updated"
    MESSAGE_ACCEPTED = "message.accepted"
    WORK_CREATED = "work.created"
    WORK_PHASE = "work.phase"
    WORK_CONTROL = "work.control"
    ATTEMPT_ADMITTED = "attempt.admitted"
    TURN_STARTED = "turn.started"
    TURN_ENDED = "turn.ended"
    TRANSCRIPT_ITEM = "transcript.item"
    ASSISTANT_DRAFT = "assistant.draft"
    EFFECT_STATE = "effect.state"
    EFFECT_CANCEL_REQUESTED = "effect.cancel_requested"
    EFFECT_REBOUND = "effect.rebound"
    EFFECT_REJECTED = "effect.rejected"
    EFFECT_SETTLED = "effect.settled"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    APPROVAL_INVALIDATED = "approval.invalidated"
    GOAL_CREATED = "goal.created"
    GOAL_UPDATED = "goal.updated"
    GOAL_ACCEPTANCE = "goal.acceptance"
    GOAL_HISTORY = "goal.history"
    TODO_UPDATED = "todo.updated"
    JOB_CREATED = "job.created"
    WAIT_OPENED = "wait.opened"
    WAIT_NOTIFIED = "wait.notified"
    USAGE_UPDATED = "usage.updated"
    RECOVERY_SUMMARY = "recovery.summary"
    RECOVERY_CHARGED = "recovery.charged"
    RECOVERY_DECIDED = "recovery.decided"
    WORKER_REGISTERED = "worker.registered"
    WORKER_DEAD = "worker.dead"
    WORK_TAKEN_OVER = "work.taken_over"
    NOTEBOOK_BOUND = "notebook.bound"
    NOTEBOOK_RENAMED = "notebook.renamed"


# --------------------------------------------------------------------------- shapes payloads share


class TodoItem(BaseModel):
    """One item of a session's plan (``todo_write``): also in the snapshot's and the Goal's ``todo``."""

    id: str
    text: str
    status: Literal["pending", "in_progress", "completed"]
    required: bool


class UnknownEffect(BaseModel):
    """A call whose outcome is unknown, as an approval is bound to it (``approval.requested``, approvals)."""

    call_id: str
    tool: str
    arguments: dict[str, Any]


# --------------------------------------------------------------------------- payloads, one per kind


class SessionCreatedPayload(BaseModel):
    """A session was created (its id is the event's ``session_id``)."""

    title: str


class SessionPermissionsPayload(BaseModel):
    """The session's permission scope changed (``PATCH /sessions/{id}``, or carried to a subtask's session)."""

    permissions: Permissions


class SessionUpdatedPayload(BaseModel):
    """The session's title or model changed (``PATCH /sessions/{id}``): both as they are now. A new model
    applies from the session's next turn; a running turn keeps the one it began with."""

    session_id: str
    title: str
    model: str


class MessageAcceptedPayload(BaseModel):
    """A message was committed (before the 202); ``work_id`` is the work item it starts or joins."""

    message_id: str
    delivery: Literal["queue", "steer"]


class WorkCreatedPayload(BaseModel):
    """A work item was created (a message, a Goal, a Job, a subtask)."""

    kind: WorkKind
    phase: Phase


class WorkPhasePayload(BaseModel):
    """A work item's phase or reason changed."""

    phase: Phase
    reason_code: str
    reason: str
    desired_state: DesiredState
    #: the work now waits for a person (failed, or a reason only a person lifts): ``GET /attention`` lists it
    needs_person: bool = False


class WorkControlPayload(BaseModel):
    """A person's control (pause, resume, stop, retry, a Goal's revision, a permission change) bumped
    the work item's ``control_version``."""

    action: str
    desired_state: DesiredState
    control_version: int


class AttemptAdmittedPayload(BaseModel):
    """An attempt of a turn was admitted (fresh, or continuing after a recovery)."""

    attempt_id: str
    turn_id: str
    mode: RecoveryMode


class TurnStartedPayload(BaseModel):
    """A turn started; ``restricted``: unknown effects restrict it (writes need an approval)."""

    turn_id: str
    restricted: bool


class TurnEndedPayload(BaseModel):
    """A turn ended (committed, or interrupted)."""

    turn_id: str
    state: TurnState
    reason: str


class TranscriptItemPayload(BaseModel):
    """An item was appended to the transcript (re-read it with ``GET /sessions/{id}?after=``)."""

    item_id: str
    seq: int
    kind: ItemKind
    call_id: str | None
    state: str | None


class AssistantDraftPayload(BaseModel):
    """The text a model request streamed so far (the whole text each time; at most one per 100 ms, sooner
    when 2 KB arrived unwritten); never the ledger, the answer itself is a transcript item. After a kill -9
    or a Stop the newest one is the partial answer the transcript keeps (``meta.interrupted``)."""

    request_id: str
    text: str
    full: bool


class EffectStatePayload(BaseModel):
    """A tool call's effect moved (planned → dispatched → committed / unknown → reconciled, …)."""

    call_id: str
    tool: str
    state: EffectState


class EffectCancelRequestedPayload(BaseModel):
    """A person asked to cancel one running call."""

    effect_id: str
    call_id: str
    tool: str


class EffectReboundPayload(BaseModel):
    """A Retry after ``tool_changed`` bound the planned calls to the tools' new implementations."""

    work_id: str
    calls: int


class EffectRejectedPayload(BaseModel):
    """A call was rejected because the record of earlier unknown outcomes could not be read."""

    call_id: str
    tool: str
    reason_code: str
    error: str


class EffectSettledPayload(BaseModel):
    """A person said whether a call whose outcome was unknown ran (``check``: its evidence was read again);
    ``withdrawn``: the approvals asked only because of unknown outcomes, withdrawn by it."""

    effect_id: str
    call_id: str
    tool: str
    outcome: Literal["ran", "did_not_run", "check"]
    by: str
    withdrawn: list[str]


class ApprovalRequestedPayload(BaseModel):
    """A call waits for a person's approval."""

    approval_id: str
    call_id: str
    tool: str
    capability: Capability
    reason: str
    unknown_effects: list[UnknownEffect]


class ApprovalDecidedPayload(BaseModel):
    """A person approved or denied a call."""

    approval_id: str
    decision: Literal["approved", "denied"]
    call_id: str
    tool: str
    control_version: int


class ApprovalInvalidatedPayload(BaseModel):
    """A pending (or approved, unused) approval was withdrawn, with the reason."""

    approval_id: str
    call_id: str
    tool: str
    reason_code: str
    reason: str


class GoalCreatedPayload(BaseModel):
    """A Goal was set."""

    goal_id: str
    objective: str
    revision: int


class GoalUpdatedPayload(BaseModel):
    """A Goal changed; ``changed`` names its fields that did."""

    goal_id: str
    state: GoalState
    phase: GoalPhase
    revision: int
    reason_code: str
    changed: list[str]


class GoalAcceptancePayload(BaseModel):
    """An acceptance check of a Goal's revision was recorded."""

    goal_id: str
    result_version: int
    revision: int
    outcome: Verdict


class GoalHistoryPayload(BaseModel):
    """A Goal ended and its terminal record was written (``GET /history/{record_id}``)."""

    record_id: str
    goal_id: str
    state: GoalState
    anchor_seq: int


class TodoUpdatedPayload(BaseModel):
    """The session's plan was replaced (``goal_id``: the Goal it was written for, if any)."""

    goal_id: str | None
    version: int
    items: list[TodoItem]


class JobCreatedPayload(BaseModel):
    """A Job was created in its own session (the event's ``session_id``)."""

    job_id: str
    caller_session_id: str
    goal_id: str | None
    goal_revision: int | None


class WaitOpenedPayload(BaseModel):
    """A work item waits for another (a subtask): ``handle`` is what it waits on."""

    wait_id: str
    kind: str
    handle: str
    call_id: str | None


class WaitNotifiedPayload(BaseModel):
    """What a work item waited on finished; ``woke``: it continues now, else ``refused`` says why not."""

    wait_id: str
    handle: str
    outcome: str
    woke: bool
    refused: str


class UsageUpdatedPayload(BaseModel):
    """A receipt (or a lost request) reached the usage ledger: totals changed."""

    op_key: str
    request_id: str | None


class RecoverySummaryPayload(BaseModel):
    """A recovery pass at a server start was recorded (``GET /recovery``); ``counts`` per outcome."""

    pass_id: str
    counts: dict[str, int]


class RecoveryChargedPayload(BaseModel):
    """An executor's death was charged to the work item it ran (the next attempt waits ``delay_s``)."""

    attempt_id: str
    worker_id: str
    recovery_attempts: int
    delay_s: float


class RecoveryDecidedPayload(BaseModel):
    """The Coordinator decided how an interrupted attempt's work continues."""

    attempt_id: str
    mode: str


class WorkerRegisteredPayload(BaseModel):
    """A worker process registered (its fencing ``generation``)."""

    worker_id: str
    generation: int
    pid: int


class WorkerDeadPayload(BaseModel):
    """A worker was found dead; its attempts are recovered."""

    worker_id: str
    generation: int
    reason: str


class WorkTakenOverPayload(BaseModel):
    """A lost host's work item was taken over (DESIGN §3): who took it, from which host to which;
    ``unknown_calls``: the calls it had dispatched there, unknown outcomes from now on."""

    work_id: str
    from_host: str
    to_host: str
    by: str
    unknown_calls: list[str]


class NotebookBoundPayload(BaseModel):
    """A notebook path was bound to a session (``PUT /notebook-session``)."""

    path: str


class NotebookRenamedPayload(BaseModel):
    """A notebook (or a folder holding one) was renamed in Jupyter: its session follows it."""

    path: str
    source_path: str


PAYLOADS: dict[EventKind, type[BaseModel]] = {
    EventKind.SESSION_CREATED: SessionCreatedPayload,
    EventKind.SESSION_PERMISSIONS: SessionPermissionsPayload,
    EventKind.SESSION_UPDATED: SessionUpdatedPayload,
    EventKind.MESSAGE_ACCEPTED: MessageAcceptedPayload,
    EventKind.WORK_CREATED: WorkCreatedPayload,
    EventKind.WORK_PHASE: WorkPhasePayload,
    EventKind.WORK_CONTROL: WorkControlPayload,
    EventKind.ATTEMPT_ADMITTED: AttemptAdmittedPayload,
    EventKind.TURN_STARTED: TurnStartedPayload,
    EventKind.TURN_ENDED: TurnEndedPayload,
    EventKind.TRANSCRIPT_ITEM: TranscriptItemPayload,
    EventKind.ASSISTANT_DRAFT: AssistantDraftPayload,
    EventKind.EFFECT_STATE: EffectStatePayload,
    EventKind.EFFECT_CANCEL_REQUESTED: EffectCancelRequestedPayload,
    EventKind.EFFECT_REBOUND: EffectReboundPayload,
    EventKind.EFFECT_REJECTED: EffectRejectedPayload,
    EventKind.EFFECT_SETTLED: EffectSettledPayload,
    EventKind.APPROVAL_REQUESTED: ApprovalRequestedPayload,
    EventKind.APPROVAL_DECIDED: ApprovalDecidedPayload,
    EventKind.APPROVAL_INVALIDATED: ApprovalInvalidatedPayload,
    EventKind.GOAL_CREATED: GoalCreatedPayload,
    EventKind.GOAL_UPDATED: GoalUpdatedPayload,
    EventKind.GOAL_ACCEPTANCE: GoalAcceptancePayload,
    EventKind.GOAL_HISTORY: GoalHistoryPayload,
    EventKind.TODO_UPDATED: TodoUpdatedPayload,
    EventKind.JOB_CREATED: JobCreatedPayload,
    EventKind.WAIT_OPENED: WaitOpenedPayload,
    EventKind.WAIT_NOTIFIED: WaitNotifiedPayload,
    EventKind.USAGE_UPDATED: UsageUpdatedPayload,
    EventKind.RECOVERY_SUMMARY: RecoverySummaryPayload,
    EventKind.RECOVERY_CHARGED: RecoveryChargedPayload,
    EventKind.RECOVERY_DECIDED: RecoveryDecidedPayload,
    EventKind.WORKER_REGISTERED: WorkerRegisteredPayload,
    EventKind.WORKER_DEAD: WorkerDeadPayload,
    EventKind.WORK_TAKEN_OVER: WorkTakenOverPayload,
    EventKind.NOTEBOOK_BOUND: NotebookBoundPayload,
    EventKind.NOTEBOOK_RENAMED: NotebookRenamedPayload,
}


class Event(BaseModel):
    """One event of the log as ``GET /events`` answers it: ``seq`` (monotonic, written in the transaction
    of the change), ``ts`` (seconds since the epoch), the session and work item it concerns, ``kind`` (an
    ``EventKind``) and its payload (``PAYLOADS[kind]``). Read as stored: the document states each kind's
    payload, this model does not refuse an older one."""

    seq: int
    ts: float
    session_id: str | None
    work_id: str | None
    kind: str = Field(description="an EventKind")
    payload: dict[str, Any]


def payload_of(kind: str, payload: dict[str, Any]) -> BaseModel:
    """``payload`` validated as ``kind``'s model (ValueError for a kind that is not an ``EventKind``;
    pydantic's ValidationError for a payload that does not match)."""
    return PAYLOADS[EventKind(kind)].model_validate(payload)
