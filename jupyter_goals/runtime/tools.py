"""Built-in tools and the trusted registry (DESIGN §6).

Capability comes only from the registry entry bound to an implementation identity
(``module:qualname`` + a digest of its source), which is saved on every effect at dispatch. A tool's
name, a model's claim or a plugin declaration never grants a capability.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import glob as globlib
import hashlib
import inspect
import json
import os
import re
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_goals.goals import tools as state_tools
from jupyter_goals.goals.tools import StateImpl
from jupyter_goals.host.effect_files import (
    clip,
    shell_result_text,
)
from jupyter_goals.host.secrecy import tool_environment
from jupyter_goals.identity import boot_id, process_start_time
from jupyter_goals.models import Capability
from jupyter_goals.runtime import subtasks
from jupyter_goals.runtime.permissions import READ_ARGUMENTS, ReadFence


@dataclass
class ToolContext:
    cwd: str
    effects_root: Path
    effect_id: str
    # what a tool process may see beyond the base allow-list (the server's and the session's names or globs)
    env_allow: tuple[str, ...] = ()
    # ask mode: where a built-in read's walk may look (permissions.ReadFence); None: anywhere (bypass)
    fence: ReadFence | None = None

    @functools.cached_property
    def env(self) -> dict[str, str]:
        """The tool process's whole environment (``secrecy.tool_environment``), built when a tool starts a
        process (reading the worker's whole environment per call costs more than a read-only tool)."""
        return tool_environment(os.environ, self.env_allow, self.cwd)

    @property
    def effect_dir(self) -> Path:
        """Where this call keeps its process files (built on demand: most tools never need it)."""
        return self.effects_root / self.effect_id


@dataclass
class ToolResult:
    content: str
    ok: bool = True


ToolImpl = Callable[[ToolContext, dict[str, Any]], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    capability: Capability
    impl: ToolImpl
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    # a state tool's real implementation: it runs inside the turn's transaction (goals/tools.py)
    state_impl: StateImpl | None = None

    @property
    def identity(self) -> str:
        target: Any = self.state_impl or self.impl
        return f"{target.__module__}:{target.__qualname__}"

    @functools.cached_property
    def digest(self) -> str:
        """The implementation's source hash, once per process (the code that runs is the code that
        was imported; ``inspect.getsource`` per call was a tenth of a busy worker's time)."""
        try:
            source = inspect.getsource(self.state_impl or self.impl)
        except (OSError, TypeError):
            source = self.identity
        return hashlib.sha256(source.encode()).hexdigest()[:16]

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": self.parameters},
            },
        }


def _path(ctx: ToolContext, p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else Path(ctx.cwd) / path


async def read_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    try:
        text = await asyncio.to_thread(_path(ctx, str(args.get("path", ""))).read_text, encoding="utf-8", errors="replace")
    except OSError as exc:
        return ToolResult(f"error: {exc}", ok=False)
    return ToolResult(clip(text))


async def list_dir(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    try:
        names = sorted(os.listdir(_path(ctx, str(args.get("path", ".")))))
    except OSError as exc:
        return ToolResult(f"error: {exc}", ok=False)
    return ToolResult("\n".join(names))


def _skipped(n: int, what: str) -> str:
    return (f"\n[{n} {what} skipped: outside the folders this chat may read, or where credentials are kept; "
            "name one as the path to ask for it]") if n else ""


async def glob(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    pattern = str(args.get("pattern", "*"))
    found = sorted(globlib.glob(pattern, root_dir=ctx.cwd, recursive=True))
    fence = ctx.fence
    if fence is None:
        return ToolResult(clip("\n".join(found)))
    # a match names what its directory holds: listed only where a walk may look (not through a symlink out)
    shown = [m for m in found if fence.may_list(os.path.dirname(os.path.join(ctx.cwd, m)))]
    return ToolResult(clip("\n".join(shown) + _skipped(len(found) - len(shown), "matches")))


async def grep(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    try:
        rx = re.compile(str(args.get("pattern", "")))
    except re.error as exc:
        return ToolResult(f"error: bad pattern: {exc}", ok=False)
    include = str(args.get("include", "*"))

    def scan() -> tuple[list[str], int]:
        out: list[str] = []
        skipped = 0
        root = _path(ctx, str(args.get("path", ".")))
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in sorted(files):
            if not fnmatch.fnmatch(p.name, include):
                continue
            # the root itself was checked (or approved) by its path; the files a walk finds are fenced
            if ctx.fence is not None and p != root and not ctx.fence.may_read(str(p)):
                skipped += 1
                continue
            try:
                for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                    if rx.search(line):
                        out.append(f"{p}:{n}:{line}")
            except OSError:
                continue
        return out, skipped

    out, skipped = await asyncio.to_thread(scan)
    return ToolResult(clip("\n".join(out) + _skipped(skipped, "files")))


async def file_digest(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    try:
        data = await asyncio.to_thread(_path(ctx, str(args.get("path", ""))).read_bytes)
    except OSError as exc:
        return ToolResult(f"error: {exc}", ok=False)
    return ToolResult(f"sha256:{hashlib.sha256(data).hexdigest()}")


async def process_status(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    pid = int(args.get("pid", 0))
    return ToolResult(json.dumps({"pid": pid, "alive": process_start_time(pid) is not None}))


async def write_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    path = _path(ctx, str(args.get("path", "")))
    content = str(args.get("content", ""))

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".jg-tmp")
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, path)

    try:
        await asyncio.to_thread(write)
    except OSError as exc:
        return ToolResult(f"error: {exc}", ok=False)
    return ToolResult(f"wrote {len(content)} characters to {path}")


async def edit_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    path = _path(ctx, str(args.get("path", "")))
    old, new = str(args.get("old", "")), str(args.get("new", ""))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return ToolResult(f"error: {exc}", ok=False)
    if old not in text:
        return ToolResult("error: text to replace not found", ok=False)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return ToolResult(f"edited {path}")


# --------------------------------------------------------------------------- shell (detached)


async def shell(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """Run ``command`` detached (own session); output and exit status go to files in the effect dir."""
    d = ctx.effect_dir
    d.mkdir(parents=True, exist_ok=True)
    # the command starts only once its identity is on disk: the read returns when we close its stdin (after
    # writing proc.json) or when we die; a worker killed before proc.json was written leaves no command
    # running that nothing could reconnect, stop or wait for (its call's outcome stays unknown, never rerun),
    # and a command that kills its worker at once still leaves a reconnectable process
    wrapper = (
        'read -r _; [ -e "$JG_DIR/proc.json" ] || exit 0; '
        '( eval "$JG_COMMAND" ) > "$JG_DIR/stdout" 2> "$JG_DIR/stderr" < /dev/null; '
        'echo $? > "$JG_DIR/exit.tmp"; mv "$JG_DIR/exit.tmp" "$JG_DIR/exit"'
    )
    base = ctx.env
    # JG_TOOL_EFFECT marks the process tree as a tool's: the REST layer refuses approvals and permission
    # changes from it (server/callers.py)
    env = {**base, "JG_COMMAND": str(args.get("command", "")), "JG_DIR": str(d), "JG_TOOL_EFFECT": ctx.effect_id}
    # Popen, not asyncio's subprocess transport: closing that transport kills a still-running child,
    # and this process must outlive a graceful worker exit to be reconnected. Spawning does not block.
    proc = subprocess.Popen(  # noqa: ASYNC220
        ["/bin/sh", "-c", wrapper], cwd=ctx.cwd, env=env, start_new_session=True,
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    (d / "proc.json.tmp").write_text(json.dumps({"pid": proc.pid, "start_time": process_start_time(proc.pid), "boot_id": boot_id()}))
    os.replace(d / "proc.json.tmp", d / "proc.json")
    assert proc.stdin is not None
    proc.stdin.close()  # release the command
    from jupyter_goals.faults import crash_point

    crash_point("tool.after_dispatch")
    while proc.poll() is None:  # noqa: ASYNC110 - a child's exit has no awaitable without a transport
        await asyncio.sleep(0.02)
    text = shell_result_text(d)
    if text is None:
        return ToolResult(f"exit status: unknown (process ended with {proc.returncode} before writing its status)", ok=False)
    return ToolResult(text)


#: the tools whose running call ``cancel_tool`` (and Stop) can cancel: a detached shell command has a process
#: group to signal; every other call runs inside its worker and ends by itself (tools_to_cancel in store/control.py)
CANCELLABLE_TOOLS = frozenset({"shell"})


def cancellable(tool: str) -> bool:
    """Whether a running call of ``tool`` can be cancelled on its own (``cancel_tool``)."""
    return tool in CANCELLABLE_TOOLS


_P = {"type": "string"}
BUILTINS: list[ToolSpec] = [
    ToolSpec("read_file", Capability.READ_ONLY, read_file, "Read a text file.", {"path": _P}),
    ToolSpec("grep", Capability.READ_ONLY, grep, "Search files for a regular expression.",
             {"pattern": _P, "path": _P, "include": _P}),
    ToolSpec("glob", Capability.READ_ONLY, glob, "List files matching a glob pattern.", {"pattern": _P}),
    ToolSpec("list_dir", Capability.READ_ONLY, list_dir, "List a directory.", {"path": _P}),
    ToolSpec("file_digest", Capability.STATE_PROBE, file_digest, "SHA-256 of a file.", {"path": _P}),
    ToolSpec("process_status", Capability.STATE_PROBE, process_status, "Whether a process is alive.",
             {"pid": {"type": "integer"}}),
    ToolSpec("write_file", Capability.IDEMPOTENT, write_file, "Write a whole file.", {"path": _P, "content": _P}),
    ToolSpec("edit_file", Capability.UNKNOWN, edit_file, "Replace text in a file.", {"path": _P, "old": _P, "new": _P}),
    ToolSpec("shell", Capability.UNKNOWN, shell, "Run a shell command.", {"command": _P}),
]


async def in_transaction_only(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """State tools never run here: the turn commits them with their effect record (``state_impl``)."""
    return ToolResult("error: state tools run inside the turn's transaction", ok=False)


BUILTINS += [
    ToolSpec(name, Capability.STATE_TOOL, in_transaction_only, state_tools.SCHEMAS[name][0],
             state_tools.SCHEMAS[name][1], state_impl=impl)
    for name, impl in state_tools.IMPLS.items()
]
# creates work: committed like a state tool, but permission-checked (runtime/subtasks.py)
BUILTINS.append(ToolSpec("spawn_subtask", Capability.STATE_TOOL, in_transaction_only, subtasks.SCHEMA[0],
                         subtasks.SCHEMA[1], state_impl=subtasks.spawn_subtask))


@functools.cache
def _builtin_probes() -> frozenset[tuple[str, str]]:
    return frozenset((t.identity, t.digest) for t in BUILTINS if t.capability in (Capability.READ_ONLY, Capability.STATE_PROBE))


@functools.cache
def _builtin_readers() -> dict[tuple[str, str], str]:
    return {(t.identity, t.digest): t.name for t in BUILTINS if t.name in READ_ARGUMENTS}


def path_reader(identity: str, digest: str) -> str | None:
    """The built-in read (``read_file``, ``grep``, ``glob``, ``list_dir``) that the implementation identity
    and source digest saved on an effect run, whatever the call's tool is named: its path is checked
    against the chat's folders (permissions.py rule 2). None for every other implementation."""
    return _builtin_readers().get((identity, digest))


@functools.cache
def _builtin_state_tools() -> frozenset[tuple[str, str, str]]:
    return frozenset((t.name, t.identity, t.digest) for t in BUILTINS if t.state_impl is not None)


def trusted_state_tool(spec: ToolSpec | None, eff: dict[str, Any]) -> bool:
    """A built-in state tool, by the name, implementation identity and digest saved on the effect."""
    return (spec is not None and spec.state_impl is not None
            and (eff["tool"], eff["impl_identity"], eff["impl_digest"]) in _builtin_state_tools()
            and (spec.identity, spec.digest) == (eff["impl_identity"], eff["impl_digest"]))


def trusted_probe(identity: str, digest: str) -> bool:
    """True only for the built-in read / grep / glob / list / probe functions, by the implementation
    identity and source digest saved on the effect: never by a tool's name or a configured claim."""
    return (identity, digest) in _builtin_probes()


class ToolRegistry:
    """Name → ToolSpec. Extra tools come from configuration by implementation identity."""

    def __init__(self, extra: dict[str, dict[str, str]] | None = None) -> None:
        self.tools: dict[str, ToolSpec] = {t.name: t for t in BUILTINS}
        for name, entry in (extra or {}).items():
            self.tools[name] = self.load_entry(name, entry)

    @staticmethod
    def load_entry(name: str, entry: dict[str, str]) -> ToolSpec:
        import importlib

        module, _, qualname = entry["impl"].partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        capability = Capability(entry.get("capability", "unknown"))
        return ToolSpec(name, capability, obj, entry.get("description", name), {})

    def get(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]
