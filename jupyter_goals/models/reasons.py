"""Reason codes and the sentence beside each: why work waits, stopped or failed, as every client shows it."""

from __future__ import annotations

from enum import StrEnum


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


# reasons a work item waits on until a person acts (``GET /attention`` lists it; an approval is listed as
# the approval itself)
NEEDS_PERSON: tuple[str, ...] = tuple(str(code) for code in (
    ReasonCode.AWAITING_CLARIFICATION, ReasonCode.PERMISSION_REVOKED, ReasonCode.BUDGET_EXHAUSTED,
    ReasonCode.BUDGET_UNVERIFIABLE, ReasonCode.RESOURCE_MISSING_CWD, ReasonCode.RESOURCE_MISSING_MODEL,
    ReasonCode.RESOURCE_MISSING_CREDENTIALS, ReasonCode.TOOL_CHANGED, ReasonCode.UNKNOWN_EFFECTS_NEED_REVIEW,
    ReasonCode.OWNER_HOST_UNREACHABLE, ReasonCode.PROVIDER_FAILED, ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED,
    ReasonCode.GOAL_BLOCKED, ReasonCode.AUTO_RECOVERY_DISABLED, ReasonCode.LEGACY_PAUSED_UNKNOWN,
))
