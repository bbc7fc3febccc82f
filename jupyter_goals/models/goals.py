"""Goals: their states and verdicts, verifiable requirements, hard budgets, and the Goal REST bodies."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from jupyter_goals.models.rest import NUMBER_ONLY, JsonInt, Strict


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
    """``POST /goals``. A ``client_request_id`` (as a message's) makes the create safe to retry: the same
    id in the same session answers the Goal it created, whatever its state now, and creates nothing."""

    session_id: str = Field(min_length=1)
    objective: str = Field(min_length=1)
    requirements: list[Requirement] | None = Field(default=None, description=REQUIREMENT_IDS)
    budget: Budget | None = None
    client_request_id: str | None = Field(default=None, min_length=1, max_length=200)


class UpdateGoal(Strict):
    expected_revision: JsonInt
    objective: str | None = Field(default=None, min_length=1)
    requirements: list[Requirement] | None = Field(default=None, description=REQUIREMENT_IDS)
    budget: Budget | None = None
    reason: str | None = Field(default=None, min_length=1)


class GoalAction(Strict):
    action: Literal["pause", "resume", "verify", "end"]
    expected_revision: JsonInt

