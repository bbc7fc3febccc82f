"""Ground-layer models: enums, reason codes and the pydantic shapes used at every boundary.

Nothing here does I/O. Everything above (stores, providers, recovery, runtime, server) imports
from this module and never the reverse.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator


class Strict(BaseModel):
    """Request bodies: unknown fields are rejected (the REST contract answers 400)."""

    model_config = ConfigDict(extra="forbid")


def _json_number(value: Any) -> Any:
    """Lax pydantic reads ``false`` as 0 and ``"5"`` as 5, which the schema (and the OpenAPI document)
    does not allow; ``5.0`` is an integer for JSON Schema, and stays one here."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number")
    return value


# after the field's constraints in an ``Annotated`` (pydantic then writes them as JSON Schema keywords)
NUMBER_ONLY = BeforeValidator(_json_number)
JsonInt = Annotated[int, NUMBER_ONLY]


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


class ReasonCode(StrEnum):
    NONE = ""
    QUEUED = "queued"
    WORKING = "working"
    COMPLETED = "completed"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_CLARIFICATION = "awaiting_clarification"
    USER_PAUSED = "user_paused"
    USER_STOPPED = "user_stopped"
    AUTO_RECOVERY_DISABLED = "auto_recovery_disabled"
    LEGACY_PAUSED_UNKNOWN = "legacy_paused_unknown"
    PERMISSION_REVOKED = "permission_revoked"
    BUDGET_EXHAUSTED = "budget_exhausted"
    BUDGET_UNVERIFIABLE = "budget_unverifiable"
    RESOURCE_MISSING_CWD = "resource_missing.cwd"
    RESOURCE_MISSING_MODEL = "resource_missing.model"
    RESOURCE_MISSING_CREDENTIALS = "resource_missing.credentials"
    TOOL_CHANGED = "tool_changed"
    UNKNOWN_EFFECTS_NEED_REVIEW = "unknown_effects_need_review"
    OWNER_HOST_UNREACHABLE = "owner_host_unreachable"
    OWNER_ALIVE = "owner_alive"
    PROVIDER_RETRYING = "provider_retrying"
    PROVIDER_FAILED = "provider_failed"
    RECOVERY_ATTEMPTS_EXCEEDED = "recovery_attempts_exceeded"
    RECOVERY_BACKOFF = "recovery_backoff"
    RECOVERED = "recovered"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    STORAGE_FULL = "storage_full"
    STORAGE_LOCKED = "storage_locked"
    MIGRATION_FAILED = "migration_failed"
    CONTROL_DB_MISSING = "control_db_missing"
    STARTING = "starting"
    WAITING_FOR_TURN = "waiting_for_turn"
    TOOL_PROCESS_RUNNING = "tool_process_running"
    RECOVERY_STATE_UNREADABLE = "recovery_state_unreadable"
    GOAL_BLOCKED = "goal_blocked"
    GOAL_VERIFYING = "goal_verifying"
    GOAL_ACHIEVED = "goal_achieved"
    GOAL_REVISED = "goal_revised"
    AWAITING_SUBTASK = "awaiting_subtask"


REASON_TEXT: dict[ReasonCode, str] = {
    ReasonCode.NONE: "",
    ReasonCode.QUEUED: "Waiting for a free execution slot.",
    ReasonCode.WORKING: "The agent is working.",
    ReasonCode.COMPLETED: "The request finished.",
    ReasonCode.AWAITING_APPROVAL: "A tool call is waiting for your approval.",
    ReasonCode.AWAITING_CLARIFICATION: "The agent needs an answer from you before it can go on.",
    ReasonCode.USER_PAUSED: "You paused this work.",
    ReasonCode.USER_STOPPED: "You stopped this work.",
    ReasonCode.AUTO_RECOVERY_DISABLED: "Automatic recovery is disabled; press Resume to continue.",
    ReasonCode.LEGACY_PAUSED_UNKNOWN: "This work was paused by an older version for an unknown reason; it stays paused until you resume it.",
    ReasonCode.PERMISSION_REVOKED: "The permissions this work ran under were revoked.",
    ReasonCode.BUDGET_EXHAUSTED: "The budget is used up.",
    ReasonCode.BUDGET_UNVERIFIABLE: "Spending cannot be verified against the hard budget, so no new paid request is admitted.",
    ReasonCode.RESOURCE_MISSING_CWD: "The working directory no longer exists; recreate it and the work continues by itself, or End it.",
    ReasonCode.RESOURCE_MISSING_MODEL: "The model is not available.",
    ReasonCode.RESOURCE_MISSING_CREDENTIALS: "Credentials for the model provider are missing.",
    ReasonCode.TOOL_CHANGED: "A tool's implementation changed since the call was planned; Retry runs the planned call with the new implementation, End drops it.",
    ReasonCode.UNKNOWN_EFFECTS_NEED_REVIEW: "An earlier write has an unknown outcome; writes need your approval until it is reviewed.",
    ReasonCode.OWNER_HOST_UNREACHABLE: "The host that owns this work is unreachable; it is not taken over automatically.",
    ReasonCode.OWNER_ALIVE: "The executor that owns this work is still alive; reconnecting.",
    ReasonCode.PROVIDER_RETRYING: "The model provider had a temporary fault; retrying after a backoff.",
    ReasonCode.PROVIDER_FAILED: "The model provider failed.",
    ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED: "This work crashed its executor too many times; Retry, Pause or End it.",
    ReasonCode.RECOVERY_BACKOFF: "The executor died while this work ran; the next attempt waits a growing backoff.",
    ReasonCode.RECOVERED: "Recovered after an interruption; continuing.",
    ReasonCode.STORAGE_UNAVAILABLE: "State temporarily unavailable: the database cannot be read.",
    ReasonCode.STORAGE_FULL: "The disk that holds the database is full: nothing new can be recorded until space is freed.",
    ReasonCode.STORAGE_LOCKED: "Another process holds the database's write lock: changes wait until it is released.",
    ReasonCode.MIGRATION_FAILED: "The database schema could not be migrated; old records are kept untouched.",
    ReasonCode.CONTROL_DB_MISSING: "The control database this server used is gone or replaced: nothing is created in"
                                   " its place; put it back, or choose to start over with `jupyter goals doctor --start-over`.",
    ReasonCode.STARTING: "jupyter_goals is starting (checking its databases and recovering work); try again in a moment.",
    ReasonCode.WAITING_FOR_TURN: "Waiting for the session's current request to finish.",
    ReasonCode.TOOL_PROCESS_RUNNING: "Waiting for a running tool process.",
    ReasonCode.GOAL_BLOCKED: "The Goal made no progress: the same blocker came back turn after turn; Resume, Edit or End it.",
    ReasonCode.GOAL_VERIFYING: "Checking the Goal's requirements against the evidence.",
    ReasonCode.GOAL_ACHIEVED: "Every requirement of the Goal was met when it was verified.",
    ReasonCode.GOAL_REVISED: "The Goal was edited; earlier acceptance and continuations no longer apply.",
    ReasonCode.AWAITING_SUBTASK: "Waiting for a subtask to finish; its result is delivered here once, then the work goes on.",
    ReasonCode.RECOVERY_STATE_UNREADABLE: (
        "The record of earlier unknown outcomes could not be read, so the tool call was rejected; Retry, Pause or End it."
    ),
}


def reason_text(code: str) -> str:
    try:
        return REASON_TEXT[ReasonCode(code)]
    except ValueError:
        return code


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


class TranscriptItem(BaseModel):
    """One durable transcript record. Stored history is never rewritten.

    - ``assistant`` items carry ``response_id``; the ``tool_call`` items of the same provider
      response share it. ``meta.interrupted`` marks a response cut short (partial text kept);
      ``meta.reasoning_signature`` is provider reasoning state, dropped when interrupted.
    - ``tool_result`` items carry ``call_id`` and the effect ``state`` (committed / unknown ...).
    - ``reconciliation`` items carry ``call_id`` and a late, verifiable real result.
    """

    item_id: str
    seq: int
    kind: ItemKind
    role: str
    content: str = ""
    call_id: str | None = None
    provider_call_id: str | None = None
    response_id: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    state: str | None = None
    turn_id: str | None = None
    work_id: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- provider protocol


class ToolCallSpec(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ProviderMessage(BaseModel):
    """A message of the provider request projection (OpenAI chat shape, provider-neutral)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    tool_call_id: str | None = None
    # true for a deterministic placeholder standing in for a missing tool result
    unknown_outcome: bool = False


class Usage(BaseModel):
    """One provider request's usage. ``input_tokens`` counts every prompt token, so it includes
    ``cached_tokens`` (cache reads) and ``cache_write_tokens`` (Anthropic cache creation), each priced
    at its own rate; ``output_tokens`` includes ``reasoning_tokens``. ``service_tier`` is the tier the
    provider says served the request (priced when the price table has it)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    service_tier: str | None = None


class Purpose(StrEnum):
    WORK = "work"
    ACCEPTANCE = "acceptance"
    REQUIREMENTS = "requirements"
    COMPACTION = "compaction"


class ProviderRequest(BaseModel):
    request_id: str
    purpose: Purpose = Purpose.WORK
    messages: list[ProviderMessage]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    goal_objective: str | None = None
    max_output_tokens: int | None = None  # a hard budget's audited per-request output limit


class ProviderResponse(BaseModel):
    text: str = ""
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    usage: Usage | None = None
    verdicts: list[dict[str, Any]] = Field(default_factory=list)
    provider_response_id: str | None = None
    stop_reason: str | None = None  # as the provider said it (end_turn, tool_use, max_tokens, stop, ...)


# --------------------------------------------------------------------------- REST bodies


class PathRule(Strict):
    """Allow ``tool`` without approval when its ``path`` argument resolves inside ``path`` (a glob
    relative to the session's cwd, e.g. ``notes/*.md``)."""

    tool: str = Field(min_length=1)
    path: str = Field(min_length=1)


class Permissions(Strict):
    """``ask`` (default): trusted read-only tools run, others need approval unless an ``allow`` rule
    (a tool name, or a :class:`PathRule`) matches; ``bypass``: no approvals. Neither waives the
    one-time approval that follows unknown effects. In ``ask`` a built-in read outside the chat's folder
    and ``folders``, or where credentials are kept, asks (runtime/permissions.py rule 2)."""

    mode: Literal["ask", "bypass"] = "ask"
    allow: list[str | PathRule] = Field(default_factory=list)
    # folders the person added to the chat: built-in reads there run without asking in ask mode (absolute,
    # ~/…, or relative to the chat's folder; resolved, symlinks followed, at each check)
    folders: list[Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^[^\x00]+$")]] = Field(
        default_factory=list, max_length=64
    )
    # environment variables this session's tool processes may see beyond the base allow-list and
    # GoalsApp.tool_env_allow (names or globs; a secret-looking name only when named exactly)
    env_allow: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_*?][A-Za-z0-9_*?]*$", max_length=200)]] = Field(
        default_factory=list
    )


class UpdateSession(Strict):
    """``PATCH /sessions/{id}``: change the permission scope of the session and its unfinished work."""

    permissions: Permissions
    expected_control_version: JsonInt | None = None


class CreateSession(Strict):
    title: str | None = None
    cwd: str | None = None
    model: str | None = None
    permissions: Permissions | None = None


class NotebookSession(Strict):
    """``PUT /notebook-session``: the session bound to a notebook path, created on first use.
    ``session_id`` rebinds the path to that existing session; ``title``/``model``/``permissions`` apply
    only when a new session is created. A ``path`` ending in ``/`` names a folder (``./`` the root): the
    session of the kernels working there that cannot know their notebook (nbconvert, papermill)."""

    path: str = Field(min_length=1, max_length=4096)
    session_id: str | None = None
    title: str | None = None
    model: str | None = None
    permissions: Permissions | None = None


class PostMessage(Strict):
    text: str = Field(min_length=1)
    client_request_id: str = Field(min_length=1, max_length=200)
    delivery: Literal["queue", "steer"] = "queue"


class CreateJob(Strict):
    """``POST /jobs``: background work on the chat execution layer, under the caller session's
    permissions and the shared quota, attributed to the caller's Goal (``goal_id``, else the caller
    session's active Goal) at this admission boundary."""

    session_id: str = Field(min_length=1)
    input: str = Field(min_length=1)
    goal_id: str | None = Field(default=None, min_length=1)
    client_request_id: str | None = Field(default=None, min_length=1, max_length=200)


CONTROL_ACTIONS = ("pause", "resume", "stop", "retry")


class SessionAction(Strict):
    """``cancel_tool`` cancels one running call (``effect_id``); the turn goes on with that result. The
    schema states the coupling too (``oneOf``), so the OpenAPI document allows only what is accepted."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"properties": {"action": {"enum": list(CONTROL_ACTIONS)}, "effect_id": {"type": "null"}}},
        {"properties": {"action": {"const": "cancel_tool"}, "effect_id": {"type": "string", "minLength": 1}},
         "required": ["action", "effect_id"]},
    ]})

    action: Literal["pause", "resume", "stop", "retry", "cancel_tool"]
    expected_control_version: JsonInt | None = None
    effect_id: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _effect_only_for_cancel_tool(self) -> SessionAction:
        if (self.action == "cancel_tool") != (self.effect_id is not None):
            raise ValueError("effect_id is required by cancel_tool and only by it")
        return self


class GlobalAction(Strict):
    action: Literal["stop_all"]


class ApprovalDecision(Strict):
    decision: Literal["approve", "deny"]


class WorkView(BaseModel):
    work_id: str
    kind: str
    desired_state: str
    phase: str
    reason_code: str
    reason: str
    control_version: int


class Actions(BaseModel):
    """What a person may do now, computed by the server (clients never infer it). One name per action:
    a session's ``stop`` is offered by ``can_stop`` (the button "Stop"; ``can_end`` is its older name there,
    kept equal for older clients); a Goal's ``end`` by ``can_end`` (the button "End")."""

    can_pause: bool = False
    can_resume: bool = False
    can_stop: bool = False
    can_end: bool = False
    can_retry: bool = False
    can_verify: bool = False
    reason_code: str = ""


# --------------------------------------------------------------------------- goals


class GoalState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    BLOCKED = "blocked"
    ACHIEVED = "achieved"
    CANCELLED = "cancelled"
    BUDGET_EXHAUSTED = "budget_exhausted"


LEGACY_GOAL_STATES = {"paused_recoverable": GoalState.PAUSED}  # read for compatibility, never written
TERMINAL_GOAL_STATES = frozenset({GoalState.ACHIEVED, GoalState.CANCELLED})


class GoalPhase(StrEnum):
    WORKING = "working"
    WAITING = "waiting"
    VERIFYING = "verifying"


class Verdict(StrEnum):
    MET = "met"
    UNMET = "unmet"
    UNKNOWN = "unknown"


class Requirement(Strict):
    """A verifiable condition of a Goal. ``command``: a shell run exiting 0 after the last write to
    ``path`` (when given); ``file_exists``: ``path`` exists; ``file_digest``: ``path`` has ``sha256``;
    ``semantic``: judged by the independent acceptance review. What each kind needs is in the schema
    too (``allOf`` of ``if``/``then``), as ``goals/rules.normalize_requirements`` checks it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"allOf": [
        {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
         "then": {"properties": {f: {"type": "string", "minLength": 1} for f in needs}, "required": list(needs)}}
        for kind, needs in (("command", ("command",)), ("file_exists", ("path",)), ("file_digest", ("path", "sha256")))
    ]})

    id: str | None = Field(default=None, min_length=1, max_length=100)
    text: str = Field(min_length=1)
    kind: Literal["semantic", "command", "file_exists", "file_digest"] = "semantic"
    command: str | None = None
    path: str | None = None
    sha256: str | None = None


class Budget(Strict):
    """Hard limits, unlimited unless set; enforced by ``jupyter_goals.usage.budget`` before every paid request."""

    max_cost_usd: Annotated[float, Field(ge=0), NUMBER_ONLY] | None = None
    max_tokens: Annotated[int, Field(ge=0), NUMBER_ONLY] | None = None
    max_active_seconds: Annotated[float, Field(ge=0), NUMBER_ONLY] | None = None
    # audited per-request limits: with a known price they make a request's maximum cost computable,
    # so it can be reserved before dispatch (output is also sent to the provider as its limit)
    max_input_tokens_per_request: Annotated[int, Field(ge=1), NUMBER_ONLY] | None = None
    max_output_tokens_per_request: Annotated[int, Field(ge=1), NUMBER_ONLY] | None = None


# JSON Schema has no "unique by property": the rule lives in the description (400 when broken)
REQUIREMENT_IDS = "each requirement `id` at most once (unnamed ones get r1, r2, …)"


class CreateGoal(Strict):
    session_id: str = Field(min_length=1)
    objective: str = Field(min_length=1)
    requirements: list[Requirement] | None = Field(default=None, description=REQUIREMENT_IDS)
    budget: Budget | None = None


class UpdateGoal(Strict):
    expected_revision: JsonInt
    objective: str | None = Field(default=None, min_length=1)
    requirements: list[Requirement] | None = Field(default=None, description=REQUIREMENT_IDS)
    budget: Budget | None = None
    reason: str | None = Field(default=None, min_length=1)


class GoalAction(Strict):
    action: Literal["pause", "resume", "verify", "end"]
    expected_revision: JsonInt


# --------------------------------------------------------------------------- the front door (issue 12)


class ModelSpec(Strict):
    """One named model of ``GoalsApp.models`` (DESIGN §14): ``{name: {provider, model, base_url?,
    api_key_env?, api_key_file?, service_tier?, context_window?, max_output_tokens?}}``; ``model`` is
    the script path for ``scripted``."""

    provider: Literal["scripted", "openai", "anthropic"]
    model: str = Field(min_length=1)
    base_url: str | None = Field(default=None, min_length=1)
    api_key_env: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    context_window: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    description: str = ""
    # a file holding the key, read at request time (so a key added later reaches running workers)
    api_key_file: str | None = Field(default=None, min_length=1)
    service_tier: str | None = Field(default=None, min_length=1)  # sent with each request (e.g. "flex")


class ModelInfo(BaseModel):
    """An entry of ``GET /models``."""

    name: str
    provider: str
    model: str
    credentials_present: bool
    priced: bool
    default: bool
    description: str = ""
    context_window: int | None = None
    max_output_tokens: int | None = None
    # USD per million tokens from the price table (input, output, cached input, cache write,
    # service tiers); None when the price is unknown
    price: dict[str, Any] | None = None


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
