"""Wake-ups after commits that give someone work, so nobody polls the database while idle.

Two channels: ``admission`` (the server's admission loop: a message accepted, a control, an approval
decided, a Goal created or changed, an attempt ended, which also covers a child delivering to its
parent) and ``attempts`` (workers: an attempt admitted). The committer calls ``notify(channel)``
after its commit; a listener waits on its channel with a timeout. A wake-up is a hint and the
database the truth: the listener then reads what is due, so a lost or repeated wake-up costs at
most one safety tick or one read, never correctness.

One host: each listener binds a UNIX datagram socket ``<state_dir>/wake/<channel>.<id>``; ``notify``
sends one byte to every socket of the channel, without blocking (a full queue already holds a
wake-up; a refused one belongs to a dead process and is removed). No polling, no shared state
beyond the directory, nothing to clean up after a kill -9 that the next sender does not remove.
The PostgreSQL shared store would implement the same two calls with ``NOTIFY jupyter_goals_<channel>``
after the commit and ``LISTEN`` on a connection of its own, so listeners on other hosts wake too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

ADMISSION = "admission"
ATTEMPTS = "attempts"

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


class Notifier:
    """Sends a wake-up to every listener of a channel on this host (after the commit)."""

    def __init__(self, state_dir: Path | str) -> None:
        self._dir = _WakeDir(state_dir)
        self._sock: socket.socket | None = None

    def notify(self, channel: str, *, exclude: str = "") -> int:
        """Wake the channel's listeners (but ``exclude``); returns how many were reached. Never raises."""
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

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._dir.close()


class Listener:
    """Waits for wake-ups of one channel (and for :meth:`wake` from this process).

    Bind before the first read of what is due (``start``), then loop: read, ``await wait(tick)``.
    A wake-up sent while the read runs is queued in the socket, so none is missed. When the socket
    cannot be bound (no AF_UNIX, a read-only state dir) the listener still works: it wakes on
    :meth:`wake` and on its timeout (the safety tick)."""

    def __init__(self, state_dir: Path | str, channel: str, ident: str) -> None:
        self.name = f"{channel}.{ident}"
        self._dir = _WakeDir(state_dir)
        self._sock: socket.socket | None = None
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Bind the socket and read it on the running loop."""
        self._loop = asyncio.get_running_loop()
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
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            with contextlib.suppress(OSError):
                os.unlink(self._dir.path / self.name)
        self._dir.close()
