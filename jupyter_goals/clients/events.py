"""Following the server's event stream from a client: ``GET /events?after=<seq>`` as Server-Sent Events,
reconnected after any loss from the last seq the caller has handled (so nothing is skipped and a repeat is
dropped by the caller's seq check). The one event-following loop of the Python clients: the ACP agent's
session feeds and the terminal UI both use it.

Events are wake-ups: a caller re-reads the REST answer an event concerns, so a missed or repeated event
cannot leave it wrong. Layer: a client (imports ``clients.rest`` only).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from jupyter_goals.clients.rest import GoalsError

log = logging.getLogger("jupyter_goals.events")

FIRST_DELAY_S = 0.1  # the first reconnect; it doubles up to MAX_DELAY_S while the server stays away
MAX_DELAY_S = 2.0


async def follow_events(
    stream: Callable[[], Awaitable[httpx.AsyncClient]],
    after: Callable[[], int],
    on_event: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    name: str = "",
    on_connection: Callable[[bool, str], Awaitable[None]] | None = None,
) -> None:
    """Read the stream until cancelled. ``stream`` gives the async client (base URL ``…/api/goals``, auth
    headers); each (re)connect asks for the events after ``after()``; ``on_event`` gets each event as the
    server sent it. ``on_connection(True, "")`` is called when a stream opens, ``(False, why)`` when it is
    lost or cannot be opened (a server that died or is starting), before the backoff."""
    delay = FIRST_DELAY_S
    while True:
        try:
            http = await stream()
            async with aconnect_sse(http, "GET", "/events", params={"after": after()}) as source:
                source.response.raise_for_status()
                delay = FIRST_DELAY_S
                if on_connection is not None:
                    await on_connection(True, "")
                async for sse in source.aiter_sse():
                    if sse.data:
                        await on_event(json.loads(sse.data))
            why = "the event stream ended"
        except asyncio.CancelledError:
            raise
        except (httpx.HTTPError, GoalsError, ValueError) as exc:  # server restarting: resume from after()
            log.info("event stream of %s lost (%s); reconnecting", name, exc)
            why = str(exc) or type(exc).__name__
        except Exception as exc:
            log.exception("event stream of %s failed; reconnecting", name)
            why = str(exc) or type(exc).__name__
        if on_connection is not None:
            await on_connection(False, why)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)
