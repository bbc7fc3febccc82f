"""The event hub: one reader of the event log for every open event stream of this server (``GET /events``).

A committed write wakes it at once: one made in this process through ``WatchedDatabase.after_commit``
(:meth:`EventHub.committed`, on the database's thread), a worker's through the ``events`` wake-up
channel (``host/wake.py``: a datagram on this host; on a PostgreSQL store also ``NOTIFY``, which brings
other hosts' commits too). It then reads the new events once, keeps the newest ``KEEP`` as ready SSE
frames and nudges every stream; each stream writes the frames after its own cursor. A stream behind
that window (a reconnect with an old ``Last-Event-ID``, or the hub's first read still under way) reads
its own pages from the log until it reaches the window, so no event is skipped and none is sent twice.

A wake-up is a hint and the log the truth: while a stream is open the hub also reads every
``safety_tick_s`` (a lost wake-up costs at most that, never an event). With no stream open nothing
reads and nothing listens. Seqs are commit-ordered (docs/architecture.md), so reading after the last
seq seen never passes over an event committed later.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import os

from jupyter_goals.config import GoalsConfig
from jupyter_goals.events import Event
from jupyter_goals.host.wake import EVENTS, Listener, Notifier
from jupyter_goals.server.queries import Queries
from jupyter_goals.store.db import dialect_of
from jupyter_goals.store.events import EventTail

log = logging.getLogger(__name__)

KEEP = 2048  # frames kept for the streams; one further behind reads its own pages
PAGE = 500  # events per read of the log


def sse_frame(ev: Event) -> str:
    """One event as its Server-Sent Events frame (``id:`` = seq, ``event:`` = kind)."""
    return f"id: {ev.seq}\nevent: {ev.kind}\ndata: {json.dumps(ev.model_dump(mode='json'))}\n\n"


class EventHub:
    def __init__(self, config: GoalsConfig, queries: Queries, tail: EventTail) -> None:
        self.config = config
        self._queries = queries  # its ``events`` read at call time (one code path with the JSON page)
        self._tail = tail
        self._name = f"server-{os.getpid()}"
        # a shared PostgreSQL store: this server's commits also wake the other hosts' streams
        shared = dialect_of(config.control_db_url) == "postgresql"
        self._notifier = Notifier(config.state_dir, url=config.control_db_url) if shared else None
        self._streams: set[asyncio.Event] = set()  # one nudge per open stream
        self._seqs: list[int] = []
        self._frames: list[str] = []
        self.ready = False  # the window below is known: it holds every event with floor < seq <= last
        self.floor = 0
        self.last = 0
        self.reads = 0  # reads of the log for new events (one per wake-up, whatever the number of streams)
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Listener | None = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ streams
    def join(self) -> asyncio.Event:
        """A stream opens: its nudge, set whenever new frames are ready (or the hub closes)."""
        nudge = asyncio.Event()
        self._streams.add(nudge)
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._follow(), name="jupyter-goals-event-hub")
        return nudge

    def leave(self, nudge: asyncio.Event) -> None:
        self._streams.discard(nudge)
        if not self._streams and self._listener is not None:
            self._listener.wake()  # the follower sees no stream and stops reading

    def frames_after(self, after: int, limit: int) -> list[tuple[int, str]] | None:
        """At most ``limit`` frames with ``seq > after``, oldest first; None when ``after`` is below the
        window (the stream reads its own page from the log)."""
        if not self.ready or after < self.floor:
            return None
        i = bisect.bisect_right(self._seqs, after)
        return list(zip(self._seqs[i:i + limit], self._frames[i:i + limit], strict=True))

    # ------------------------------------------------------------------ wake-ups
    def committed(self) -> None:
        """After a write transaction committed in this process (any thread; never blocks)."""
        if self._notifier is not None:
            self._notifier.notify(EVENTS, exclude=self._name)
        loop, listener = self._loop, self._listener
        if loop is not None and listener is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(listener.wake)

    async def _follow(self) -> None:
        """While a stream is open: read what is new after each wake-up (or the safety tick)."""
        listener = Listener(self.config.state_dir, EVENTS, self._name, url=self.config.control_db_url)
        listener.start()  # bound before the first read, so no commit after it goes unnoticed
        self._listener = listener
        try:
            while self._streams and not self.closed:
                try:
                    await self._read()
                except Exception as exc:  # a store that cannot be read now: the next wake-up or tick tries again
                    log.debug("event hub: %s", exc)
                await listener.wait(self.config.safety_tick_s)
        finally:
            self._listener = None
            listener.close()
            self.ready = False  # nothing is read while no stream is open: the window is stale
            self._seqs.clear()
            self._frames.clear()

    async def _read(self) -> None:
        if not self.ready:
            last = await self._tail.last_seq()
            self.floor = self.last = last
            self.ready = True
            self._nudge()  # streams that read their own pages meanwhile look at the window now
        added = False
        while self._streams:  # checked before every read: a closed stream's hub reads nothing more
            page = await self._queries.events(self.last, PAGE)
            self.reads += 1
            if page.last_seq < self.last:  # the log went backwards (another control store): start again
                self.ready = False
                self._seqs.clear()
                self._frames.clear()
                return
            for ev in page.events:
                self._seqs.append(ev.seq)
                self._frames.append(sse_frame(ev))
                self.last = ev.seq
            added = added or bool(page.events)
            if len(page.events) < PAGE:
                break
        if len(self._seqs) > KEEP:
            cut = len(self._seqs) - KEEP
            self.floor = self._seqs[cut - 1]
            del self._seqs[:cut]
            del self._frames[:cut]
        if added:
            self._nudge()

    def _nudge(self) -> None:
        for nudge in self._streams:
            nudge.set()

    async def close(self) -> None:
        """At shutdown: streams end, the follower stops listening."""
        self.closed = True
        self._nudge()
        if self._listener is not None:
            self._listener.wake()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 2)
        if self._notifier is not None:
            await asyncio.to_thread(self._notifier.close, 0.5)  # a NOTIFY still pending is sent first
