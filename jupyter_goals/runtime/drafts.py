"""Streamed assistant text for open views (DESIGN §12: "streamed assistant text appears as it arrives").

Drafts go to the event stream, not the ledger: every ``interval_s`` at most, the text received so far is
written as one ``assistant.draft`` event; the answer itself is committed with its receipt. A view shows
the draft until the committed assistant item arrives; a crash loses only drafts.
"""

from __future__ import annotations

import time

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database


class DraftStream:
    """An ``on_chunk`` callback that coalesces chunks into at most one event per ``interval_s``."""

    def __init__(self, db: Database, session_id: str, work_id: str, request_id: str, interval_s: float = 0.1) -> None:
        self.db, self.session_id, self.work_id, self.request_id = db, session_id, work_id, request_id
        self.interval_s = interval_s
        self.text = ""
        self._written = ""
        # counted from the request's start: an answer that arrives at once writes no draft at all
        self._last = time.monotonic()

    async def __call__(self, chunk: str) -> None:
        self.text += chunk
        if time.monotonic() - self._last >= self.interval_s:
            await self.flush()

    async def flush(self) -> None:
        if self.text == self._written:
            return
        text, self._written, self._last = self.text, self.text, time.monotonic()
        await self.db.run(lambda tx: c.emit_draft(tx, self.session_id, self.work_id, self.request_id, text))
