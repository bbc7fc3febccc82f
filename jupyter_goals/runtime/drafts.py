"""Streamed assistant text for open views and for recovery (DESIGN §12: "streamed assistant text appears
as it arrives"; §7: an interrupted response keeps its partial text).

Drafts go to the event log, not the ledger: the text received so far is written as one
``assistant.draft`` event (the whole text each time) at most every ``interval_s``, sooner when
``max_pending_chars`` arrived unwritten, and at the latest ``interval_s`` after a chunk even when the
stream then falls silent. Events are durable rows, so after a kill -9 or a Stop the newest draft of the
interrupted request is its partial answer (``store/transcript.partial_answer``). The answer itself is
committed with its receipt. Writes run beside the stream, one at a time, never awaited by a chunk: the
stream is not slowed by them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database

MAX_PENDING_CHARS = 2048  # unwritten text that makes a write due at once (the durability bound: 2 KB)


class DraftStream:
    """An ``on_chunk`` callback that makes the streamed text durable at a bounded rate: at most one
    event per ``interval_s`` (none for an answer that arrives at once), and never more than
    ``interval_s`` or ``max_pending_chars`` of text unwritten while the stream runs."""

    def __init__(self, db: Database, session_id: str, work_id: str, request_id: str, interval_s: float = 0.1,
                 max_pending_chars: int = MAX_PENDING_CHARS) -> None:
        self.db, self.session_id, self.work_id, self.request_id = db, session_id, work_id, request_id
        self.interval_s, self.max_pending_chars = interval_s, max_pending_chars
        self.text = ""
        self._written = ""
        # counted from the request's start: an answer that arrives at once writes no draft at all
        self._last = time.monotonic()
        self._due = asyncio.Event()  # text arrived that the last write does not hold
        self._now = asyncio.Event()  # write without waiting out the interval (too much unwritten, or closing)
        self._closing = False
        self._writer: asyncio.Task[None] | None = None
        self._failed: Exception | None = None

    async def __call__(self, chunk: str) -> None:
        if self._failed is not None:  # a draft that cannot be written fails the step, as any commit does
            raise self._failed
        self.text += chunk
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        self._due.set()
        if len(self.text) - len(self._written) >= self.max_pending_chars:
            self._now.set()

    async def _write_loop(self) -> None:
        """Write the newest text whenever some is unwritten, after the rest of the interval unless the
        unwritten text reached ``max_pending_chars``. A write under way is never cancelled."""
        try:
            while True:
                await self._due.wait()
                self._due.clear()
                wait = self.interval_s - (time.monotonic() - self._last)
                if wait > 0 and not self._now.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._now.wait(), wait)
                if self._closing:
                    return
                self._now.clear()
                await self._write()
        except Exception as exc:  # kept, and raised where the stream (or close) awaits
            self._failed = exc

    async def _write(self) -> None:
        if self.text == self._written:
            return
        text, self._written, self._last = self.text, self.text, time.monotonic()
        await self.db.run(lambda tx: c.emit_draft(tx, self.session_id, self.work_id, self.request_id, text))

    async def close(self, *, flush: bool = False) -> None:
        """End the writer once the write under way (if any) is committed, so no draft follows the
        answer's commit; ``flush``: then write the text received so far (a stopped answer's partial
        text, which the stop's marker reads back)."""
        writer, self._writer = self._writer, None
        self._closing = True
        self._now.set()
        self._due.set()
        if writer is not None:
            await writer
        if self._failed is not None:
            raise self._failed
        if flush:
            await self._write()

    def abandon(self) -> None:
        """The step failed: stop writing at once (nothing waits for the writer)."""
        writer, self._writer = self._writer, None
        self._closing = True
        if writer is not None:
            writer.cancel()
