"""The provider interface and the model-string resolver (``scripted:`` / ``openai:`` / ``anthropic:``
and named models of ``GoalsApp.models``).

Credentials are read when a provider is resolved, i.e. at request time in the worker and at every
Coordinator pass for the resource check: the key's environment variable (as the process started),
else the model's ``api_key_file``. A key file that appears later is seen by running processes, so
work waiting with ``resource_missing.credentials`` continues by itself. Keys are never stored.
"""

from __future__ import annotations

import email.utils
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from jupyter_goals.models import ModelSpec, ProviderRequest, ProviderResponse, ReasonCode, Usage
from jupyter_goals.providers.named import named_from_env

ChunkCallback = Callable[[str], Awaitable[None] | None]
UsageCallback = Callable[[Usage], Awaitable[None] | None]
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
MAX_RETRY_AFTER_S = 3600.0


class ProviderError(Exception):
    """A provider fault. ``retryable`` faults (429, 5xx incl. Anthropic's 529, lost connection) get
    durable backoff; ``retry_after_s`` is the provider's own ``retry-after`` when it sent one."""

    def __init__(self, message: str, status: int | None = None, retryable: bool | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        if retryable is None:
            retryable = status is None or status == 429 or status >= 500
        self.retryable = retryable
        self.retry_after_s = retry_after_s


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


async def notify(cb: Callable[[Any], Awaitable[None] | None] | None, arg: Any) -> None:
    """Call a sync or async callback (``on_chunk`` / ``on_usage``)."""
    if cb is None:
        return
    result = cb(arg)
    if inspect.isawaitable(result):
        await result


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds from ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date), bounded; None if absent."""
    raw_ms = headers.get("retry-after-ms")
    try:
        if raw_ms is not None:
            return min(max(float(raw_ms) / 1000, 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return min(max(float(raw), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None
    return min(max(when - (time.time() if now is None else now), 0.0), MAX_RETRY_AFTER_S)


def read_key(env: str | None, key_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key: the environment variable ``env``, else the first line of ``key_file`` (read now)."""
    value = (os.environ if environ is None else environ).get(env) if env else None
    if value:
        return value
    if key_file:
        try:
            with open(os.path.expanduser(key_file), encoding="utf-8") as f:
                return f.readline().strip() or None
        except (OSError, UnicodeDecodeError):
            return None
    return None


def requested_service_tier(model: str) -> str | None:
    """The service tier a named model asks for (recorded on the request before it is sent)."""
    if ":" in model:
        return None
    spec = named_from_env().get(model)
    return spec.service_tier if spec is not None else None


def key_file_secrets() -> dict[str, str]:
    """The keys the named models' ``api_key_file`` hold now ({``api_key_file:<name>``: key}), for the
    worker's redactor: a tool that prints a key file never puts the key in a transcript or request."""
    found = {f"api_key_file:{name}": read_key(None, spec.api_key_file)
             for name, spec in named_from_env().items() if spec.api_key_file}
    return {name: key for name, key in found.items() if key}


def key_required(spec: ModelSpec, base_url: str | None, default_base_url: str) -> bool:
    """A hosted endpoint always needs a key; a local one only when the spec names a key."""
    named = spec.api_key_file is not None or (spec.api_key_env is not None
                                              and spec.api_key_env != DEFAULT_KEY_ENV.get(spec.provider))
    return named or base_url is None or base_url.rstrip("/") == default_base_url


def endpoint(spec: ModelSpec, default_base_url: str, base_url_env: str) -> tuple[str, str | None]:
    """A spec's base URL (``base_url_env`` when the spec has none, else the default) and its key, read
    now (env variable, else ``api_key_file``); a hosted endpoint without a key is unavailable."""
    env = spec.api_key_env or DEFAULT_KEY_ENV[spec.provider]
    api_key = read_key(env, spec.api_key_file)
    base_url = spec.base_url or os.environ.get(base_url_env) or None
    if api_key is None and key_required(spec, base_url, default_base_url):
        raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_CREDENTIALS, missing_key(env, spec))
    return base_url or default_base_url, api_key


def missing_key(env: str, spec: ModelSpec) -> str:
    where = f"{env} is not set" + (f" and {spec.api_key_file} has no key" if spec.api_key_file else "")
    return f"no API key for {spec.provider}:{spec.model}: {where}"
