"""The durable transcript record and the provider protocol shapes: the provider-neutral request
projection (``recovery/repair.py`` builds it from the transcript), the response and its usage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from jupyter_goals.models.states import ItemKind, Purpose


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
