"""The REST answers as pydantic models: every route builds its answer through one of these (validated,
then serialized with ``dump``), and ``server/openapi.py`` takes each response schema from them.

An answer has exactly its keys (``extra="forbid"``: a key a lower layer adds without the model is a
bug found by the first test that reads the route, not data passed on unseen). A key is always present
(null where it has no value) unless it is declared with ``omitted()``: such a key is left out when it
has nothing to say, as the answers always did (``config_error``, ``budget_status``, a database's ``error``).
``GET /health``'s models are in ``server/health.py``, the OpenAPI document's in ``server/openapi.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema

from jupyter_goals import models
from jupyter_goals.events import Event, TodoItem, UnknownEffect
from jupyter_goals.models import (
    DesiredState,
    GoalPhase,
    GoalState,
    Permissions,
    Phase,
    RecoveryOutcome,
    Requirement,
    Verdict,
    WorkKind,
)

SCHEMAS = "#/components/schemas/"


def _is_none(value: Any) -> bool:
    return value is None


def omitted(description: str = "") -> Any:
    """A key left out of the answer when it has no value (never ``null``); its schema says so."""
    return Field(default=None, exclude_if=_is_none, description=description or None,
                 json_schema_extra=_absent_not_null)


def _absent_not_null(schema: dict[str, Any]) -> None:
    """An ``omitted()`` key is absent or a value: its schema drops the ``null`` branch and the default."""
    schema.pop("default", None)
    branches = [s for s in schema.pop("anyOf", []) if s != {"type": "null"}]
    if len(branches) == 1:
        schema.update(branches[0])
    elif branches:
        schema["anyOf"] = branches


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dump(self) -> dict[str, Any]:
        """The JSON answer (``omitted()`` keys left out when they have no value)."""
        return self.model_dump(mode="json")


# --------------------------------------------------------------------------- shared parts


class Error(Answer):
    """Every error answer: a code (``bad_request``, ``not_found``, ``conflict``, ``starting``, …), a sentence."""

    error: str
    message: str


class Actions(models.Actions):
    """What a person may do now, computed by the server (clients never infer it from states)."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class ModelInfo(models.ModelInfo):
    """An entry of ``GET /models``; ``price``: the table's USD per million tokens, or null."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class TranscriptItem(models.TranscriptItem):
    """One durable transcript record (see ``models.TranscriptItem``)."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class Work(Answer):
    """A work item as views show it; ``retry_at``: while waiting, the durable retry time (a provider or
    recovery backoff) holding it back."""

    work_id: str
    kind: WorkKind
    desired_state: DesiredState
    phase: Phase
    reason_code: str
    reason: str
    control_version: int
    retry_at: float | None
    owner_host: str | None = omitted("the host that runs this work, when it is not this server's host")
    unreachable_since: float | None = omitted("when the owner host was last heard from, while it is unreachable")


class KnownTokens(Answer):
    input: int
    output: int
    cached: int


class UnknownInterval(Answer):
    """From the last heartbeat of an attempt whose executor died to when the death was found."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, serialize_by_alias=True)

    attempt_id: str
    from_: float = Field(alias="from")
    to: float | None


class UsageSummary(Answer):
    """Known values, estimates and unknowns kept apart (never an invented zero), and active time. While
    usage.db cannot be read the ledger's numbers are null, ``error`` says so and the per-kind counts
    are left out; the receipts wait in the outbox (``ledger_writes_pending``)."""

    known_tokens: KnownTokens | None
    known_cost_usd: float | None
    estimated_cost_usd: float | None
    receipts: int | None = omitted()
    unknown_usage_requests: int | None
    unpriced_requests: int | None = omitted()
    lower_bound_requests: int | None = omitted()
    in_flight_requests: int | None = omitted()
    display: str
    error: str | None = omitted("storage_unavailable while usage.db cannot be read")
    active_seconds: float
    running: bool
    unknown_intervals: list[UnknownInterval]
    ledger_writes_pending: int
    price_version: str


class Approval(Answer):
    approval_id: str
    session_id: str
    work_id: str
    call_id: str
    tool: str
    arguments: Any
    arguments_digest: str
    capability: str
    reason: str
    state: Literal["pending", "approved", "denied", "consumed", "invalidated"]
    unknown_effects: list[UnknownEffect]
    unknown_set_digest: str
    control_version: int
    created_at: float
    decided_at: float | None
    consumed_by_attempt: str | None


# --------------------------------------------------------------------------- Goals


class BudgetLimits(Answer):
    """The hard limits set (a limit not set is left out: unlimited)."""

    max_cost_usd: float | None = omitted()
    max_tokens: int | None = omitted()
    max_active_seconds: float | None = omitted()
    max_input_tokens_per_request: int | None = omitted()
    max_output_tokens_per_request: int | None = omitted()


class BudgetStatus(Answer):
    """With a hard budget: what is spent, reserved and unknown now."""

    known_cost_usd: float
    known_tokens: int
    uncertain_requests: int
    reserved_usd: float | None = Field(description="null: a reserved request has no cost bound")
    reserved_tokens: int | None = Field(description="null: a reserved request has no token bound")
    unpriced_requests: int
    active_seconds: float
    unknown_active_seconds: float
    ledger_error: str | None


class Acceptance(Answer):
    """The newest acceptance check (of any revision); ``verdicts`` as it recorded them."""

    result_version: int
    revision: int
    outcome: Verdict
    verdicts: list[dict[str, Any]]
    created_at: float


class CurrentVerdict(Answer):
    """The verdict that counts now for one requirement: the acceptance of the current revision's, with
    ``checked`` true; ``unknown`` and ``checked`` false where none checked it."""

    requirement_id: str | None
    verdict: Verdict
    evidence: list[Any]
    checked: bool


class Goal(Answer):
    """A Goal (``GET /goals/{id}``, and a session snapshot's current Goal), with its usage."""

    goal_id: str
    session_id: str
    work_id: str
    objective: str
    original_objective: str
    requirements: list[Requirement]
    requirements_state: str
    state: GoalState
    phase: GoalPhase
    reason_code: str
    reason: str
    revision: int
    budget: BudgetLimits
    usage: UsageSummary | None
    actions: Actions
    acceptance: Acceptance | None
    verdicts: list[CurrentVerdict]
    verified_result_version: int
    todo: list[TodoItem]
    todo_version: int
    turns: int
    created_by: str
    created_at: float
    updated_at: float
    ended_at: float | None
    budget_status: BudgetStatus | None = omitted("only with a hard budget")


class GoalList(Answer):
    goals: list[Goal]


class Anchor(Answer):
    """Where in the transcript a Goal ended."""

    seq: int
    item_id: str


class HistoryRecord(Answer):
    """A terminal Goal record: a read-only snapshot of the Goal as it ended (records saved by an older
    version may lack keys the Goal answer has now)."""

    record_id: str
    goal_id: str
    session_id: str
    state: str
    snapshot: Annotated[dict[str, Any], WithJsonSchema({"allOf": [{"$ref": SCHEMAS + "GoalSnapshot"}]})]
    anchor: Anchor
    created_at: float
    read_only: bool


class HistoryList(Answer):
    records: list[HistoryRecord]


# --------------------------------------------------------------------------- sessions


class Session(Answer):
    session_id: str
    title: str
    cwd: str
    model: str
    permissions: Permissions
    created_at: float
    updated_at: float


class GoalBrief(Answer):
    goal_id: str
    objective: str
    state: GoalState
    revision: int


class SessionSummary(Session):
    """A session of ``GET /sessions``: its shown work item, actions, ``state`` (that work's phase, or
    ``idle``), when it was last active and its current Goal."""

    work: Work | None
    actions: Actions
    state: str
    activity_at: float
    goal: GoalBrief | None


class SessionList(Answer):
    sessions: list[SessionSummary]
    next_cursor: str | None


class TranscriptPage(Answer):
    """Items in seq order; ``next_cursor`` (pass as ``after``) / ``prev_cursor`` (as ``before``) while
    newer / older items exist."""

    items: list[TranscriptItem]
    next_cursor: int | None
    prev_cursor: int | None


class AllowRule(Answer, models.AllowRule):
    """An allow rule of the session's permissions with who added it, when and how (null: unknown)."""


class Snapshot(Answer):
    """A session: its work item, Goal (and budget burn), plan, pending approvals, a transcript page, usage,
    actions, allow rules (with who added them) and the event seq it was read at."""

    session: Session
    work: Work | None
    goal: Goal | None
    todo: list[TodoItem]
    approvals: list[Approval]
    transcript: TranscriptPage
    actions: Actions
    event_seq: int
    usage: UsageSummary
    allow_rules: list[AllowRule]


class SessionCreated(Snapshot):
    """``POST /sessions``: the snapshot of the new session, its id also at the top."""

    session_id: str


class MessageAccepted(Answer):
    """Committed before the 202; ``delivery`` as it was taken (a message to recovering work joins it)."""

    message_id: str
    work_id: str
    delivery: Literal["queue", "steer"]


class ControlApplied(Answer):
    """``pause``, ``resume``, ``stop`` or ``retry``: the work item after it."""

    work_id: str
    control_version: int
    desired_state: DesiredState
    phase: Phase


class ToolCancelRequested(Answer):
    """``cancel_tool``: the request is recorded; the call ends ``cancelled`` and the turn goes on."""

    effect_id: str
    call_id: str
    cancel_requested: Literal[True]


class TakeoverAnswer(Answer):
    """The work items this server's host took over from a lost host (DESIGN §3)."""

    taken: list[str]


class EffectSettled(Answer, models.EffectSettled):
    """``settle``: the call is ``reconciled`` with the person's answer (``check``: the evidence found), who and
    when; ``withdrawn``: the approvals asked only because of unknown outcomes (their calls are checked again)."""


class SessionActionAnswer(RootModel[ControlApplied | ToolCancelRequested | TakeoverAnswer | EffectSettled]):
    def dump(self) -> dict[str, Any]:
        return self.root.dump()


class StopAllAnswer(Answer):
    stopped: list[str]


class GlobalActionAnswer(RootModel[StopAllAnswer | TakeoverAnswer]):
    """``stop_all`` → ``{stopped}``; ``takeover`` → ``{taken}``."""

    def dump(self) -> dict[str, Any]:
        return self.root.dump()


class NotebookBinding(Answer):
    """The session kept for a notebook path (or a folder's, ending in ``/``)."""

    path: str
    session_id: str
    created_at: float
    updated_at: float


# --------------------------------------------------------------------------- approvals, events, Jobs


class ApprovalList(Answer):
    approvals: list[Approval]


class ApprovalDecided(Answer):
    approval_id: str
    state: Literal["approved", "denied"]


class EventPage(Answer):
    """One page of events (oldest first) and the newest seq of the log."""

    events: list[Event]
    last_seq: int


class JobAccepted(Answer):
    job_id: str
    work_id: str
    session_id: str


class Subtask(Answer):
    work_id: str
    session_id: str
    phase: Phase


class JobResult(Answer):
    outcome: str
    text: str
    created_at: float


class Job(Answer):
    """A Job: its work state, the Goal identity it was admitted under, its subtasks and result."""

    job_id: str
    work_id: str
    session_id: str
    caller_session_id: str
    caller_work_id: str | None
    client_request_id: str | None
    goal_id: str | None
    goal_revision: int | None
    input: str
    work: Work
    subtasks: list[Subtask]
    result: JobResult | None
    created_at: float
    actions: Actions


# --------------------------------------------------------------------------- server


class ModelList(Answer):
    models: list[ModelInfo]
    default_model: str
    config_error: str | None = omitted("an invalid GoalsApp.models entry")


class UnknownOutcome(Answer):
    call_id: str
    tool: str


class RecoveredItem(Answer):
    """One work item of the last recovery pass: the outcome then, and the actions allowed now."""

    work_id: str
    session_id: str
    session_title: str
    kind: WorkKind
    outcome: RecoveryOutcome
    reason_code: str
    reason: str
    decided_at: float
    phase: str | None
    current_phase: Phase
    actions: Actions
    control_version: int  # the version ``actions`` were computed from: an action taken on them sends it
    mode: Literal["resume_checkpoint", "new_turn"] | None  # from its last safe checkpoint, or a new turn after repair
    unknown_outcomes: list[UnknownOutcome]


class RecoverySummary(Answer):
    """The last recovery pass after a server start (``recovered_at`` null: none did); ``?session_id=``: its items."""

    recovered_at: float | None
    host_name: str
    boot_id: str
    server_started_at: float
    counts: dict[str, int]
    items: list[RecoveredItem]

