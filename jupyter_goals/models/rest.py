"""REST request bodies (``extra="forbid"``: an unknown field is a 400) and the shapes the server answers
with: sessions, messages, controls, approvals, Jobs, named models. The Goal bodies are in ``goals``."""

from __future__ import annotations

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
    """``PATCH /sessions/{id}``: rename the session, change its model (from its next turn: a running turn
    keeps its own), or change the permission scope of the session and its unfinished work
    (``expected_control_version`` is checked with ``permissions``). A field left out stays as it is."""

    # at least one change: the schema says so too, so the OpenAPI document allows only what is accepted
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in ("title", "model", "permissions")]})

    title: str | None = Field(default=None, min_length=1)
    model: str | None = None
    permissions: Permissions | None = None
    expected_control_version: JsonInt | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> UpdateSession:
        if self.title is None and self.model is None and self.permissions is None:
            raise ValueError("give at least one of title, model and permissions")
        return self


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


#: what a person may say of a call whose outcome is unknown (``settle``); ``check`` reads the evidence again
SETTLE_OUTCOMES = ("ran", "did_not_run", "check")
SettleOutcome = Literal["ran", "did_not_run", "check"]


class SessionAction(Strict):
    """``cancel_tool`` cancels one running call (``effect_id``); the turn goes on with that result.
    ``takeover``: this server's host takes over the session's work from its lost host (``can_takeover``).
    ``settle``: a person says whether a call whose outcome is unknown (``effect_id``: its effect or call id)
    ran (``outcome``: ``ran``, ``did_not_run``, or ``check``: read its evidence again, a shell command's exit
    file on this host). The schema states the coupling too (``oneOf``), so the OpenAPI document allows only
    what is accepted."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"properties": {"action": {"enum": [*CONTROL_ACTIONS, "takeover"]}, "effect_id": {"type": "null"},
                        "outcome": {"type": "null"}}},
        {"properties": {"action": {"const": "cancel_tool"}, "effect_id": {"type": "string", "minLength": 1},
                        "outcome": {"type": "null"}},
         "required": ["action", "effect_id"]},
        {"properties": {"action": {"const": "settle"}, "effect_id": {"type": "string", "minLength": 1},
                        "outcome": {"enum": list(SETTLE_OUTCOMES)}},
         "required": ["action", "effect_id", "outcome"]},
    ]})

    action: Literal["pause", "resume", "stop", "retry", "cancel_tool", "takeover", "settle"]
    expected_control_version: JsonInt | None = None
    effect_id: str | None = Field(default=None, min_length=1)
    outcome: SettleOutcome | None = None

    @model_validator(mode="after")
    def _effect_only_for_cancel_tool_and_settle(self) -> SessionAction:
        if (self.action in ("cancel_tool", "settle")) != (self.effect_id is not None):
            raise ValueError("effect_id is required by cancel_tool and settle, and only by them")
        if (self.action == "settle") != (self.outcome is not None):
            raise ValueError("outcome is required by settle and only by it")
        return self


class EffectSettled(BaseModel):
    """``settle``: the call's effect is ``reconciled`` with the person's answer (``outcome``; ``check``: the
    evidence found), who gave it and when; ``withdrawn``: the pending approvals that were asked only because
    of unknown outcomes, withdrawn so that their calls are checked again under the chat's permissions (a
    call that still needs an approval then asks a fresh one)."""

    model_config = ConfigDict(extra="forbid")

    effect_id: str
    call_id: str
    tool: str
    state: Literal["reconciled"]
    outcome: SettleOutcome
    settled_by: str
    settled_at: float
    withdrawn: list[str]


class GlobalAction(Strict):
    """``stop_all``: quit and stop all tasks. ``takeover``: this server's host takes over every unfinished
    work item of the lost host ``host`` (DESIGN §3). The schema states the coupling (``oneOf``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"properties": {"action": {"const": "stop_all"}, "host": {"type": "null"}}},
        {"properties": {"action": {"const": "takeover"}, "host": {"type": "string", "minLength": 1}},
         "required": ["action", "host"]},
    ]})

    action: Literal["stop_all", "takeover"]
    host: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _host_only_for_takeover(self) -> GlobalAction:
        if (self.action == "takeover") != (self.host is not None):
            raise ValueError("host is required by takeover and only by it")
        return self


class ApprovalDecision(Strict):
    """``always``: approve and always allow the tool in this session (an ``allow`` rule recorded with who
    added it and when, in the same transaction); only with ``approve``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"not": {
        "properties": {"decision": {"const": "deny"}, "always": {"const": True}}, "required": ["decision", "always"]}})

    decision: Literal["approve", "deny"]
    always: bool = False

    @model_validator(mode="after")
    def _always_only_with_approve(self) -> ApprovalDecision:
        if self.always and self.decision != "approve":
            raise ValueError("always is only given with approve")
        return self


#: how an allow rule was added: with the session, in its permissions (PATCH), or approving a call "always"
RuleSource = Literal["created", "permissions", "approval", "inherited"]


class AllowRule(BaseModel):
    """One ``allow`` rule of a session's permissions with its provenance: who added it (the Jupyter user),
    when, and how (``via``); all three null for a rule added before provenance was kept (shown "unknown")."""

    model_config = ConfigDict(extra="forbid")

    rule: str | PathRule
    added_by: str | None
    added_at: float | None
    via: RuleSource | None


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
    can_takeover: bool = False  # the owner host's leases expired: this server's host may take the work over
    reason_code: str = ""


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

