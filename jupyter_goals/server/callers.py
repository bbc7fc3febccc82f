"""Which local process made a request, and whether it runs inside a tool process of ours.

A tool process never receives the server's token (secrecy.tool_environment), but it runs as the same
user as the server, so it could find the token elsewhere (a runtime file, ``/proc``). The REST layer
therefore refuses state changes (approvals, permissions, new work) whose TCP peer on this machine is a
tool process or one of its descendants: the shell wrapper of every tool call carries
``JG_TOOL_EFFECT`` in its environment, and the caller's parent chain, session leader and process-group
leader are checked for it. Jupyter's own routes that start or drive a process of the server
(creating a terminal, kernel or session, connecting to a terminal's or kernel's websocket) are refused
to a tool process too (``server/guard.py`` wraps the server's authorizer): otherwise the tool could run
a command there, as a child of the server that is no descendant of the tool. A process that
deliberately detaches itself (``setsid`` plus a double fork, so that neither its ancestry nor its
session leads back to the tool), or code a tool gets into a kernel that is already running by another
way (its connection file), is not recognised: run untrusted agents in a sandbox (a container or
another user) for a hard boundary.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = b"JG_TOOL_EFFECT="
PROC = Path("/proc")


def _socket_inode(client_port: int, server_port: int) -> str | None:
    """The inode of the client-side socket of a loopback TCP connection (``/proc/net/tcp{,6}``)."""
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if local_port == client_port and remote_port == server_port:
                return fields[9]
    return None


def _holds(pid: int, target: str) -> bool:
    try:
        for fd in (PROC / str(pid) / "fd").iterdir():
            try:
                if os.readlink(fd) == target:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, process group, session) of ``pid``."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


def _marked(pid: int) -> bool:
    try:
        env = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return any(var.startswith(MARKER) for var in env.split(b"\0"))


def tool_processes() -> set[int]:
    """Every live process that is a tool process, descends from one, or shares a tool's session or
    process group."""
    stats = {int(e.name): st for e in PROC.iterdir() if e.name.isdigit() and (st := _stat(int(e.name))) is not None}
    marked = {pid for pid in stats if _marked(pid)}
    tainted: set[int] = set()
    for pid in stats:
        seen: set[int] = set()
        current = pid
        while current > 1 and current in stats and current not in seen:
            seen.add(current)
            _, pgid, sid = stats[current]
            if current in marked or pgid in marked or sid in marked:
                tainted.add(pid)
                break
            current = stats[current][0]
    return tainted


def request_from_tool(peer: tuple[str, int] | None, server_port: int) -> bool:
    """Whether a request whose TCP peer is ``peer`` (host, port) comes from a tool process on this
    machine. Blocking (reads /proc): call it in a thread."""
    host = peer[0].removeprefix("::ffff:") if peer else ""
    if peer is None or not (host.startswith("127.") or host == "::1") or not PROC.is_dir():
        return False
    tools = tool_processes()
    if not tools:  # the common case: no tool runs, nothing more to read
        return False
    inode = _socket_inode(peer[1], server_port)
    if inode is None:
        return False
    # only the (few) tool processes' descriptors are read: listing every process's costs ~15 ms
    target = f"socket:[{inode}]"
    return any(_holds(pid, target) for pid in tools)
