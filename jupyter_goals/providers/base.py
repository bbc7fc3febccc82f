"""The provider interface and the model-string resolver (``scripted:`` / ``openai:`` / ``anthropic:``)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Protocol

from jupyter_goals.models import ProviderRequest, ProviderResponse, ReasonCode, Usage

ChunkCallback = Callable[[str], Awaitable[None] | None]
UsageCallback = Callable[[Usage], Awaitable[None] | None]


class ProviderError(Exception):
    """A provider fault. ``retryable`` faults (429, 5xx, lost connection) get durable backoff."""

    def __init__(self, message: str, status: int | None = None, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        if retryable is None:
            retryable = status is None or status == 429 or status >= 500
        self.retryable = retryable


class ProviderUnavailable(Exception):
    """The model string cannot be served here (missing script, missing credentials)."""

    def __init__(self, reason_code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class Provider(Protocol):
    name: str

    async def complete(
        self,
        request: ProviderRequest,
        on_chunk: ChunkCallback | None = None,
        on_usage: UsageCallback | None = None,
    ) -> ProviderResponse:
        """Run one request. Streaming providers report text chunks and cumulative usage snapshots."""
        ...


def check_model(model: str) -> ReasonCode | None:
    """Resource check used by recovery: None when the model can be served, else the waiting reason."""
    try:
        resolve_provider(model)
    except ProviderUnavailable as exc:
        return exc.reason_code
    return None


def resolve_provider(model: str) -> Provider:
    kind, _, rest = model.partition(":")
    if kind == "scripted":
        from jupyter_goals.providers.scripted import ScriptedProvider

        if not rest or not os.path.isfile(rest):
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, f"script file not found: {rest!r}")
        return ScriptedProvider(rest)
    if kind == "openai":
        from jupyter_goals.providers.openai_compat import OpenAICompatProvider

        return OpenAICompatProvider.from_env(rest)
    if kind == "anthropic":
        if not os.environ.get("ANTHROPIC_API_KEY"):
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_CREDENTIALS, "ANTHROPIC_API_KEY is not set")
        raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, "the anthropic adapter is not built yet")
    raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, f"unknown model kind in {model!r}")
