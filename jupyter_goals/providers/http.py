"""The HTTP part both streaming adapters share: one POST, an HTTP error read into a ProviderError
(with the provider's ``retry-after``), the rest of the body left to the adapter's event parser."""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
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


# one client per event loop (a worker runs one): see ``shared_client``
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def shared_client() -> httpx.AsyncClient:
    """The running loop's client for every provider request: its pool keeps a provider's connection open
    between the requests of a turn (one TCP and TLS handshake, not one per model call), and its SSL context
    is built once (a new ``httpx.AsyncClient`` costs about 16 ms of CPU, measured: a model request made
    one each)."""
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(loop)
    if client is None or client.is_closed:
        client = _CLIENTS[loop] = httpx.AsyncClient(timeout=None)
    return client


@asynccontextmanager
async def post_stream(url: str, body: dict[str, Any], headers: dict[str, str], *, limits: httpx.Timeout,
                      transport: httpx.AsyncBaseTransport | None,
                      detail_of: Callable[[Any], str]) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the streaming response; an HTTP error status raises ProviderError. A given
    ``transport`` (tests) gets a client of its own; else the loop's ``shared_client``."""
    async with contextlib.AsyncExitStack() as stack:
        client = (await stack.enter_async_context(httpx.AsyncClient(timeout=limits, transport=transport))
                  if transport is not None else shared_client())
        async with client.stream("POST", url, json=body, headers=headers, timeout=limits) as response:
            if response.status_code >= 400:
                raise await read_error(response, detail_of)
            yield response


async def drain(events: AsyncIterator[Any], within_s: float = 1.0) -> None:
    """Read what follows a stream's end marker (``[DONE]``, ``message_stop``: the closing chunk) for up to
    ``within_s``, so its connection goes back to the pool for the next request; a server that keeps the
    stream open past it only costs that connection (closed, as before), never the answer."""
    try:
        async with asyncio.timeout(within_s):
            async for _ in events:
                pass
    except (TimeoutError, httpx.TransportError, httpx.StreamError):
        pass


def not_event_stream(url: str, response: httpx.Response) -> ProviderError:
    """E.g. an HTML page: the base URL does not point at the provider's API (not retryable)."""
    return ProviderError(f"{url} answered with content type {content_type(response)!r}, not an event stream",
                         status=response.status_code, retryable=False)


def content_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").partition(";")[0].strip()
