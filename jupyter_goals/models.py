"""Ground-layer models: enums, reason codes and the pydantic shapes used at every boundary.

Nothing here does I/O. Everything above (stores, providers, recovery, runtime, server) imports
from this module and never the reverse.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Request bodies: unknown fields are rejected (the REST contract answers 400)."""

    model_config = ConfigDict(extra="forbid")


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
    RECOVERED = "recovered"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    MIGRATION_FAILED = "migration_failed"
    WAITING_FOR_TURN = "waiting_for_turn"
    TOOL_PROCESS_RUNNING = "tool_process_running"


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
    ReasonCode.RESOURCE_MISSING_CWD: "The working directory no longer exists.",
    ReasonCode.RESOURCE_MISSING_MODEL: "The model is not available.",
    ReasonCode.RESOURCE_MISSING_CREDENTIALS: "Credentials for the model provider are missing.",
    ReasonCode.TOOL_CHANGED: "A tool's implementation changed since the call was planned.",
    ReasonCode.UNKNOWN_EFFECTS_NEED_REVIEW: "An earlier write has an unknown outcome; writes need your approval until it is reviewed.",
    ReasonCode.OWNER_HOST_UNREACHABLE: "The host that owns this work is unreachable; it is not taken over automatically.",
    ReasonCode.OWNER_ALIVE: "The executor that owns this work is still alive; reconnecting.",
    ReasonCode.PROVIDER_RETRYING: "The model provider had a temporary fault; retrying after a backoff.",
    ReasonCode.PROVIDER_FAILED: "The model provider failed.",
    ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED: "This work crashed its executor too many times; Retry, Pause or End it.",
    ReasonCode.RECOVERED: "Recovered after an interruption; continuing.",
    ReasonCode.STORAGE_UNAVAILABLE: "State temporarily unavailable: the database cannot be read.",
    ReasonCode.MIGRATION_FAILED: "The database schema could not be migrated; old records are kept untouched.",
    ReasonCode.WAITING_FOR_TURN: "Waiting for the session's current request to finish.",
    ReasonCode.TOOL_PROCESS_RUNNING: "Waiting for a running tool process.",
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
    RECONNECT = "reconnect"
    RESUME_CHECKPOINT = "resume_checkpoint"
    NEW_TURN = "new_turn"


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


class ItemKind(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    INTERRUPTION = "interruption"
    RECONCILIATION = "reconciliation"
    NOTICE = "notice"


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
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0


class Purpose(StrEnum):
    WORK = "work"
    ACCEPTANCE = "acceptance"
    REQUIREMENTS = "requirements"


class ProviderRequest(BaseModel):
    request_id: str
    purpose: Purpose = Purpose.WORK
    messages: list[ProviderMessage]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    goal_objective: str | None = None


class ProviderResponse(BaseModel):
    text: str = ""
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    usage: Usage | None = None
    verdicts: list[dict[str, Any]] = Field(default_factory=list)
    provider_response_id: str | None = None


# --------------------------------------------------------------------------- REST bodies


class Permissions(Strict):
    mode: Literal["ask", "bypass"] = "ask"
    allow: list[str] = Field(default_factory=list)


class CreateSession(Strict):
    title: str | None = None
    cwd: str | None = None
    model: str | None = None
    permissions: Permissions | None = None


class PostMessage(Strict):
    text: str = Field(min_length=1)
    client_request_id: str = Field(min_length=1, max_length=200)
    delivery: Literal["queue", "steer"] = "queue"


class SessionAction(Strict):
    action: Literal["pause", "resume", "stop", "retry"]
    expected_control_version: int | None = None


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
    can_pause: bool = False
    can_resume: bool = False
    can_end: bool = False
    can_retry: bool = False
    can_verify: bool = False
    reason_code: str = ""
