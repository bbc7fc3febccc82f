"""The scripted provider (DESIGN §11, contract): deterministic and offline.

Script: ``{"rules": [{"when": {...}, "respond": {...}}], "default": {...}}``; first matching rule wins.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jupyter_goals.models import (
    ProviderMessage,
    ProviderRequest,
    ProviderResponse,
    ToolCallSpec,
    Usage,
)
from jupyter_goals.providers.base import ChunkCallback, ProviderError, UsageCallback


class When(BaseModel):
    model_config = ConfigDict(extra="forbid")
    purpose: str | None = None
    last_user_contains: str | None = None
    last_tool_result_contains: str | None = None
    tool_result_unknown: bool | None = None
    any_text_contains: str | None = None
    goal_objective_contains: str | None = None


class ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Respond(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = ""
    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    usage: Usage | None = None
    stream_chunks: list[str] | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0  # a pause before each streamed chunk after the first (shows streaming live)
    error: dict[str, Any] | None = None
    verdicts: list[dict[str, Any]] = Field(default_factory=list)
    stop_reason: str | None = None  # as a provider says it (end_turn, max_tokens, length, ...)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    when: When = Field(default_factory=When)
    respond: Respond


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[Rule] = Field(default_factory=list)
    default: Respond = Field(default_factory=lambda: Respond(text="(scripted model: no rule matched)"))


def _last_user_index(messages: list[ProviderMessage]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    return None


def _last_tool_result_after_user(messages: list[ProviderMessage]) -> ProviderMessage | None:
    start = _last_user_index(messages)
    start = -1 if start is None else start
    for m in reversed(messages[start + 1 :]):
        if m.role == "tool":
            return m
    return None


def matches(when: When, request: ProviderRequest) -> bool:
    """All present keys must hold. Matching is case-sensitive substring."""
    msgs = request.messages
    if when.purpose is not None and when.purpose != request.purpose.value:
        return False
    if when.last_user_contains is not None:
        i = _last_user_index(msgs)
        if i is None or when.last_user_contains not in msgs[i].content:
            return False
    if when.last_tool_result_contains is not None or when.tool_result_unknown is not None:
        result = _last_tool_result_after_user(msgs)
        if result is None:
            return False
        if when.last_tool_result_contains is not None and when.last_tool_result_contains not in result.content:
            return False
        if when.tool_result_unknown is not None and result.unknown_outcome != when.tool_result_unknown:
            return False
    if when.any_text_contains is not None:
        if not any(when.any_text_contains in m.content for m in msgs):
            return False
    if when.goal_objective_contains is not None:
        if request.goal_objective is None or when.goal_objective_contains not in request.goal_objective:
            return False
    return True


def load_script(path: str) -> Script:
    with open(path, encoding="utf-8") as f:
        return Script.model_validate(json.load(f))


async def _call(cb: Any, arg: Any) -> None:
    if cb is None:
        return
    result = cb(arg)
    if inspect.isawaitable(result):
        await result


class ScriptedProvider:
    name = "scripted"

    def __init__(self, path: str) -> None:
        self.path = path
        self.script = load_script(path)

    def choose(self, request: ProviderRequest) -> Respond:
        for rule in self.script.rules:
            if matches(rule.when, request):
                return rule.respond
        return self.script.default

    async def complete(
        self,
        request: ProviderRequest,
        on_chunk: ChunkCallback | None = None,
        on_usage: UsageCallback | None = None,
    ) -> ProviderResponse:
        respond = self.choose(request)
        if respond.delay_s:
            await asyncio.sleep(respond.delay_s)
        if respond.error is not None:
            status = int(respond.error.get("status", 500))
            message = respond.error.get("message")  # what the provider said (it may echo a key it refused)
            raise ProviderError(f"scripted provider error {status}" + (f": {message}" if message else ""), status=status)
        chunks = respond.stream_chunks if respond.stream_chunks is not None else ([respond.text] if respond.text else [])
        for i, chunk in enumerate(chunks):
            if i and respond.chunk_delay_s:
                await asyncio.sleep(respond.chunk_delay_s)
            await _call(on_chunk, chunk)
        text = "".join(chunks) if respond.stream_chunks is not None else respond.text
        if respond.usage is not None:
            await _call(on_usage, respond.usage)
        calls = [
            ToolCallSpec(id=f"{request.request_id}-c{i}", name=c.name, arguments=c.arguments)
            for i, c in enumerate(respond.tool_calls)
        ]
        return ProviderResponse(
            text=text,
            tool_calls=calls,
            usage=respond.usage,
            verdicts=respond.verdicts,
            provider_response_id=f"scripted-{request.request_id}",
            stop_reason=respond.stop_reason,
        )
