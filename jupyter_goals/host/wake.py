"""Wake-ups after commits that give someone work, so nobody polls the database while idle.

Four channels: ``admission`` (the server's admission loop: a message accepted, a control, an approval
decided, a Goal created or changed, an attempt ended, which also covers a child delivering to its
parent), ``attempts`` (workers: an attempt admitted), ``controls`` (workers' running tool calls: a Stop,
a Pause or a cancel committed, on this host or, through ``NOTIFY``, on another; :class:`Broadcast` fans a
worker's one listener out to all its calls) and ``events`` (the server's event streams, ``GET /events``:
any committed write of a worker, through :class:`WakingDatabase`). The committer calls ``notify(channel)``
after its commit; a listener waits on its channel with a timeout. A wake-up is a hint and the
database the truth: the listener then reads what is due, so a lost or repeated wake-up costs at
most one safety tick or one read, never correctness.

One host: each listener binds a UNIX datagram socket ``<state_dir>/wake/<channel>.<id>``; ``notify``
sends one byte to every socket of the channel, without blocking (a full queue already holds a
wake-up; a refused one belongs to a dead process and is removed). No polling, no shared state
beyond the directory, nothing to clean up after a kill -9 that the next sender does not remove.

Several hosts (the control store is PostgreSQL, ``url=`` a ``postgresql://`` URL): ``notify`` also
sends ``NOTIFY jupyter_goals_<channel>`` (``pg_notify``) from a thread of its own on one connection
kept between sends, so the caller never waits for the network; the listener also ``LISTEN``s on a
connection of its own (``psycopg.AsyncConnection.notifies`` on its loop), so listeners on every host
sharing the database wake. A lost connection is opened again (backoff 0.5 s to 30 s) and the
listener wakes once after each ``LISTEN``, as whatever was notified while it did not listen is read
then; a send that fails twice is dropped (a safety tick on the other hosts). The local socket stays:
it wakes this host's listeners even while PostgreSQL is unreachable.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jupyter_goals.store import channels as channels_pg
from jupyter_goals.store.db import Database, Tx, dialect_of
from jupyter_goals.store.pgconn import pg_connect, pg_connect_async

T = TypeVar("T")

log = logging.getLogger(__name__)

ADMISSION = "admission"
ATTEMPTS = "attempts"
CONTROLS = "controls"
EVENTS = "events"

_MAX_PATH = 100  # sun_path holds 108 bytes; a longer state dir is reached through /proc/self/fd


class _WakeDir:
    """``<state_dir>/wake`` and short socket addresses inside it."""

    def __init__(self, state_dir: Path | str) -> None:
        self.path = Path(state_dir) / "wake"
        self._fd: int | None = None

    def address(self, name: str) -> str:
        full = str(self.path / name)
        if len(full.encode()) <= _MAX_PATH:
            return full
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._fd}/{name}"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _PgSender:
    """``NOTIFY`` from a thread of its own: ``send`` only records the channel (repeated sends before the
    thread runs are one), the thread sends on one connection, opened again once when it fails (an idle
    connection the server dropped) and let go after a minute without sends. After a send it gathers for
    ``GAP_S`` before the next: a busy worker commits hundreds of times a second, and a ``NOTIFY`` per commit
    was six round trips per tool call (other hosts' listeners hear of a change at most 5 ms later)."""

    IDLE_S = 60.0
    GAP_S = 0.005

    def __init__(self, url: str) -> None:
        self._url = url
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._closed = False
        self._thread: threading.Thread | None = None

    def send(self, channel: str) -> None:
        with self._cond:
            if self._closed:
                return
            self._pending.add(channel)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jupyter-goals-notify", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        conn: Any = None
        try:
            while True:
                with self._cond:
                    if not self._pending and not self._closed:
                        self._cond.wait(self.IDLE_S)
                    batch, self._pending = self._pending, set()
                    closed = self._closed
                if batch:
                    conn = self._send(conn, sorted(batch))
                    if not closed:
                        time.sleep(self.GAP_S)
                elif closed:
                    return
                elif conn is not None:  # idle for a minute: let the connection go
                    _close_quietly(conn)
                    conn = None
        finally:
            _close_quietly(conn)

    def _send(self, conn: Any, channels: list[str]) -> Any:
        for attempt in range(2):
            try:
                if conn is None:
                    conn = pg_connect(self._url, application_name=f"jupyter_goals-notify-{os.getpid()}")
                channels_pg.notify(conn, channels)
                return conn
            except Exception as exc:
                _close_quietly(conn)
                conn = None
                if attempt:
                    log.warning("wake-up of %s over PostgreSQL lost (%s); listeners on other hosts wake on their "
                                "safety tick", ", ".join(channels), exc)
        return conn

    def close(self, flush_s: float) -> None:
        """Send what is pending (waiting at most ``flush_s``), then end the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(flush_s)


def _close_quietly(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


class Notifier:
    """Sends a wake-up to every listener of a channel on this host (after the commit), and with a
    PostgreSQL ``url`` (the control store's) to the listeners of every host through ``NOTIFY``."""

    def __init__(self, state_dir: Path | str, *, url: str = "") -> None:
        self._dir = _WakeDir(state_dir)
        self._sock: socket.socket | None = None
        self._pg = _PgSender(url) if url and dialect_of(url) == "postgresql" else None

    def notify(self, channel: str, *, exclude: str = "") -> int:
        """Wake the channel's listeners (but ``exclude``); returns how many on this host were reached.
        Never raises, never waits for the network. ``NOTIFY`` reaches every listener of the channel,
        ``exclude`` too (one read more)."""
        if self._pg is not None:
            self._pg.send(channel)
        try:
            names = [n for n in os.listdir(self._dir.path) if n.startswith(channel + ".") and n != exclude]
        except OSError:
            return 0
        if not names:
            return 0
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        sent = 0
        for name in names:
            try:
                self._sock.sendto(b"w", self._dir.address(name))
                sent += 1
            except ConnectionRefusedError:  # its process is gone (names are unique per process)
                with contextlib.suppress(OSError):
                    os.unlink(self._dir.path / name)
            except BlockingIOError:
                sent += 1  # its queue is full: a wake-up is already waiting
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTSOCK, errno.EACCES, errno.EPERM):
                    log.debug("wake-up of %s failed: %s", name, exc)
        return sent

    def close(self, flush_s: float = 2.0) -> None:
        """Close the socket; a ``NOTIFY`` still pending is sent first (waiting at most ``flush_s``)."""
        if self._pg is not None:
            self._pg.close(flush_s)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._dir.close()


class Listener:
    """Waits for wake-ups of one channel (and for :meth:`wake` from this process).

    Bind before the first read of what is due (``start``), then loop: read, ``await wait(tick)``.
    A wake-up sent while the read runs is queued in the socket, so none is missed. When the socket
    cannot be bound (no AF_UNIX, a read-only state dir) the listener still works: it wakes on
    :meth:`wake` and on its timeout (the safety tick).

    With a PostgreSQL ``url`` it also ``LISTEN``s on ``jupyter_goals_<channel>`` on a connection of its
    own (application name ``jupyter_goals-listen-<name>``), opened again after a loss; it wakes once
    after each ``LISTEN`` (``pg_listens`` counts them), since a ``NOTIFY`` sent before it is missed."""

    def __init__(self, state_dir: Path | str, channel: str, ident: str, *, url: str = "") -> None:
        self.name = f"{channel}.{ident}"
        self.channel = channel
        self._dir = _WakeDir(state_dir)
        self._sock: socket.socket | None = None
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._url = url if url and dialect_of(url) == "postgresql" else ""
        self._pg_task: asyncio.Task[None] | None = None
        self.pg_listens = 0

    def start(self) -> None:
        """Bind the socket and read it on the running loop; with PostgreSQL, start listening there too."""
        self._loop = asyncio.get_running_loop()
        if self._url and self._pg_task is None:
            self._pg_task = self._loop.create_task(self._listen_pg(), name=f"jupyter-goals-listen-{self.name}")
        try:
            self._dir.path.mkdir(parents=True, exist_ok=True)
            addr = self._dir.address(self.name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._dir.path / self.name)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.bind(addr)
        except (OSError, AttributeError) as exc:  # AttributeError: no AF_UNIX on this platform
            log.warning("no wake-up socket (%s); waking on the safety tick only", exc)
            return
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._drain)

    async def _listen_pg(self) -> None:
        """``LISTEN`` on a connection of its own until closed; a lost connection is opened again."""
        delay, failing = 0.5, False
        while True:
            conn: Any = None
            try:
                conn = await pg_connect_async(self._url, application_name=f"jupyter_goals-listen-{self.name}")
                await channels_pg.listen(conn, self.channel)
                self.pg_listens += 1
                if failing:
                    log.info("wake-ups of %s over PostgreSQL listening again", self.name)
                delay, failing = 0.5, False
                self._event.set()  # what was notified while nothing listened is read now
                async for _ in conn.notifies():
                    self._event.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection was lost or refused: a wake-up may be late, never wrong
                if not failing:
                    log.warning("wake-ups of %s over PostgreSQL interrupted (%s); listening again in %.1f s, the "
                                "safety tick meanwhile", self.name, exc, delay)
                failing = True
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    def _drain(self) -> None:
        assert self._sock is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._sock.recv(64):
                pass
        self._event.set()

    def wake(self) -> None:
        """A wake-up from this process (a commit made here); safe from the loop's thread only."""
        self._event.set()

    async def wait(self, at_most_s: float) -> bool:
        """Until a wake-up or ``at_most_s`` seconds; True when woken. The wake-up is consumed."""
        if not self._event.is_set() and at_most_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), at_most_s)
        woken = self._event.is_set()
        self._event.clear()
        return woken

    def close(self) -> None:
        if self._pg_task is not None:
            self._pg_task.cancel()  # its connection is closed as the task ends
            self._pg_task = None
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            with contextlib.suppress(OSError):
                os.unlink(self._dir.path / self.name)
        self._dir.close()


class Broadcast:
    """One listener's wake-ups for many waiters on one loop (a worker's running tool calls, each watching for
    a Stop of its work): take a ``mark()`` before reading, then ``wait(mark, tick)``; a wake-up after the mark
    ends the wait of everyone who holds it, so one that arrives during the read is not missed."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self._next = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.listener.start()
        self._task = asyncio.get_running_loop().create_task(self._pump(), name=f"jupyter-goals-{self.listener.name}")

    async def _pump(self) -> None:
        while True:
            if await self.listener.wait(3600.0):
                woken, self._next = self._next, asyncio.Event()
                woken.set()

    def mark(self) -> asyncio.Event:
        return self._next

    @staticmethod
    async def wait(mark: asyncio.Event, at_most_s: float) -> None:
        """Until a wake-up after ``mark`` was taken, or ``at_most_s`` seconds (the safety tick)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(mark.wait(), at_most_s)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.listener.close()


class Coalesced:
    """``fn`` for a burst of calls: at once when the last call of ``fn`` is ``gap_s`` old, else once at the end
    of that gap for every call within it (on the running event loop; off a loop, at once). A busy worker
    commits hundreds of times a second; each commit asked for a wake-up of the server's event streams,
    a directory listing and a datagram (a tenth of the worker's CPU, bench/throughput.py), and woke the
    server as often. Now at most one per ``gap_s``, each event still reaching a stream within it."""

    def __init__(self, fn: Callable[[], object], gap_s: float = 0.002) -> None:
        self.fn = fn
        self.gap_s = gap_s
        self._last = float("-inf")
        self._pending = False

    def __call__(self) -> None:
        now = time.monotonic()
        if self._pending:
            return
        wait = self._last + self.gap_s - now
        if wait > 0:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                wait = 0  # no loop on this thread to call back later: now
            else:
                self._pending = True
                loop.call_later(wait, self._fire)
                return
        self._last = now
        self.fn()

    def _fire(self) -> None:
        self._pending = False
        self._last = time.monotonic()
        self.fn()


class WakingDatabase(Database):
    """A database that calls ``after_commit()`` after each write transaction it commits, on the thread
    that committed (so it must not block): a worker's wakes its server's event streams (``EVENTS``), the
    server's its own event hub. After the commit, so whoever is woken reads the change; a transaction
    that rolled back wakes nobody."""

    def __init__(self, url: str, *, after_commit: Callable[[], object] | None = None, inline: bool = False) -> None:
        super().__init__(url, inline=inline)
        self.after_commit = after_commit

    def transact(self, fn: Callable[[Tx], T], *, write: bool = True, probe: bool = False,
                 lock_wait_ms: int | None = None, durable: bool = True) -> T:
        result = super().transact(fn, write=write, probe=probe, lock_wait_ms=lock_wait_ms, durable=durable)
        if write and not probe and self.after_commit is not None:
            self.after_commit()
        return result
