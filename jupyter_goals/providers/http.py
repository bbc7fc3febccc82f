"""The HTTP part both streaming adapters share: one POST, an HTTP error read into a ProviderError
(with the provider's ``retry-after``), the rest of the body left to the adapter's event parser."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from jupyter_goals.providers.base import ProviderError, retry_after

ERROR_BODY_LIMIT = 2000


async def read_error(response: httpx.Response, detail_of: Callable[[Any], str]) -> ProviderError:
    """A >= 400 answer as a ProviderError; ``detail_of`` picks the message out of the JSON body."""
    status = response.status_code
    try:
        raw = (await response.aread()).decode("utf-8", "replace")
    except (httpx.TransportError, httpx.StreamError):
        raw = ""
    detail = ""
    try:
        detail = detail_of(json.loads(raw))
    except ValueError:
        pass
    detail = (detail or raw.strip())[:ERROR_BODY_LIMIT]
    return ProviderError(f"provider HTTP {status}: {detail}".rstrip(": "), status=status,
                         retry_after_s=retry_after(response.headers))


@asynccontextmanager
async def post_stream(url: str, body: dict[str, Any], headers: dict[str, str], *, limits: httpx.Timeout,
                      transport: httpx.AsyncBaseTransport | None,
                      detail_of: Callable[[Any], str]) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the streaming response; an HTTP error status raises ProviderError."""
    async with httpx.AsyncClient(timeout=limits, transport=transport) as client:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code >= 400:
                raise await read_error(response, detail_of)
            yield response


def not_event_stream(url: str, response: httpx.Response) -> ProviderError:
    """E.g. an HTML page: the base URL does not point at the provider's API (not retryable)."""
    return ProviderError(f"{url} answered with content type {content_type(response)!r}, not an event stream",
                         status=response.status_code, retryable=False)


def content_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").partition(";")[0].strip()
