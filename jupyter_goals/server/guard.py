"""Jupyter's own process-starting routes, refused to our tool processes.

Our state-changing routes refuse a request whose TCP peer is a tool process (``callers``, checked in
``handlers.api``). Jupyter's own routes would otherwise be a way around that: a tool that found the
server's token could create a terminal, a kernel or a notebook session and run a command there; that
process is a child of the server, not of the tool, so it would not be recognised and could approve
the tool's own calls. ``GuardAuthorizer`` wraps the server's configured authorizer and answers
"no" (403) to a tool process for creating, changing or restarting terminals, kernels and sessions and
for connecting to a terminal's or kernel's websocket (Jupyter's ``write`` and ``execute`` actions on
those resources). Every other decision, and every request not made from a tool process, is left to the
configured authorizer unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.authorizer import AllowAllAuthorizer, Authorizer

from jupyter_goals.server import callers

log = logging.getLogger(__name__)

# Jupyter resources whose write / execute actions start or drive a process of the server
GUARDED: dict[str, frozenset[str]] = {
    "terminals": frozenset({"write", "execute"}),
    "kernels": frozenset({"write", "execute"}),
    "sessions": frozenset({"write", "execute"}),
}


def guarded(action: str, resource: str) -> bool:
    return action in GUARDED.get(resource, frozenset())


async def handler_from_tool(handler: Any) -> bool:
    """Whether the request ``handler`` serves comes from one of our tool processes (its TCP peer)."""
    try:
        sock = handler.request.connection.stream.socket
        peer, server_port = sock.getpeername(), sock.getsockname()[1]
    except (AttributeError, OSError, TypeError, IndexError):
        return False
    return await asyncio.to_thread(callers.request_from_tool, (str(peer[0]), int(peer[1])), int(server_port))


class GuardAuthorizer(Authorizer):
    """The configured authorizer, plus: a tool process may not start or drive a terminal, kernel or
    session. Attributes it does not have are read from the wrapped authorizer."""

    def __init__(self, inner: Authorizer, **kwargs: Any) -> None:
        self.__dict__["_inner"] = inner
        super().__init__(**kwargs)

    @property
    def inner(self) -> Authorizer:
        return self.__dict__["_inner"]  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    async def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        if not await ensure_async(self.inner.is_authorized(handler, user, action, resource)):
            return False
        if guarded(action, resource) and await handler_from_tool(handler):
            request = getattr(handler, "request", None)
            log.warning("jupyter_goals: refused %s %s (%s on %s) from a tool process of an agent",
                        getattr(request, "method", "?"), getattr(request, "path", "?"), action, resource)
            return False
        return True


def install(settings: MutableMapping[str, Any]) -> GuardAuthorizer:
    """Wrap the authorizer of a Tornado settings mapping (once; idempotent)."""
    current = settings.get("authorizer")
    if isinstance(current, GuardAuthorizer):
        return current
    if current is None:  # what Jupyter's handlers fall back to
        kwargs = {"identity_provider": settings["identity_provider"]} if settings.get("identity_provider") else {}
        current = AllowAllAuthorizer(**kwargs)
    extra: dict[str, Any] = {}
    identity = getattr(current, "identity_provider", None)
    if identity is not None:
        extra["identity_provider"] = identity
    if getattr(current, "parent", None) is not None:
        extra["parent"] = current.parent
    wrapped = GuardAuthorizer(current, **extra)
    settings["authorizer"] = wrapped
    return wrapped
