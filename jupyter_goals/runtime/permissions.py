"""Whether one planned tool call may run now or needs a one-time approval (DESIGN §6, §10).

Pure apart from resolving paths (symlinks and ``..`` followed, as the tool itself would): facts in,
verdict out. The order of the rules is the contract:
1. Unknown effects in scope (a restricted turn): only trusted built-in read-only / state-probe
   implementations (by identity saved on the effect) run, a built-in read only where rule 2 lets it;
   every other call needs an approval bound to this call and to the digest of the unknown-effect set.
   Bypass and allow rules do not waive it. A read that rule 2 stops asks one approval, bound to the same
   digest, whose reason names its path and the unknown calls. A call leaves the set once its outcome is
   reconciled (a person's ``settle`` or a late receipt, ``store/effects.py``): with none left, the rules
   below apply again.
2. In ``ask`` mode a built-in read (``read_file``, ``grep``, ``glob``, ``list_dir``, by implementation
   identity: ``CallFacts.reader``) needs an approval that names the resolved path when that path lies
   outside the chat's folders (its cwd and ``permissions.folders``), or in a place that holds
   credentials (``secret``: ``~/.ssh``, cloud credentials, Jupyter's runtime, data and config dirs,
   the state dir…; for ``read_file`` and ``grep`` also any file named ``.env`` or ``.env.*``), even
   inside the folders. An ``allow`` rule ``{tool, path}`` whose glob holds the path is the person's
   choice for it and opens both; the bare tool name in ``allow`` opens paths outside the folders but
   never a place that holds credentials.
3. A read_only / state_probe capability from the trusted registry entry runs.
4. ``bypass`` runs everything.
5. An ``allow`` rule matches: a tool name, or ``{tool, path}`` where the call's ``path`` argument
   resolves inside the glob (relative to the session's cwd).
6. Otherwise the call needs an approval.

``ReadFence`` carries rule 2 into a built-in read's walk (grep's files, glob's directories): a walk
never reads through a symlink out of its root and the folders, nor into a place that holds credentials.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir, jupyter_runtime_dir

from jupyter_goals.models import Capability

#: the built-in reads checked against the chat's folders, with the argument naming where each reads and
#: the default the tool uses when it is missing (runtime/tools.py)
READ_ARGUMENTS: dict[str, tuple[str, str]] = {
    "read_file": ("path", ""), "list_dir": ("path", "."), "grep": ("path", "."), "glob": ("pattern", "*"),
}
#: the reads that return what a file holds (a ``.env`` file asks for these; listing its name does not)
CONTENT_READERS = frozenset({"read_file", "grep"})
#: places under the home directory that hold credentials (besides Jupyter's dirs and the state dir)
HOME_SECRETS = (".ssh", ".aws", ".config/gcloud", ".azure", ".kube", ".docker", ".gnupg", ".netrc",
                ".git-credentials", ".pypirc")
_WILDCARD = re.compile(r"[*?[]")


@dataclass(frozen=True)
class CallFacts:
    tool: str
    arguments: dict[str, Any]
    capability: Capability  # from the trusted registry entry, saved on the effect
    trusted_probe: bool  # the saved implementation identity is a built-in read-only/probe function
    # the built-in read function the saved identity runs (a READ_ARGUMENTS key), None for any other call
    reader: str | None = None


@dataclass(frozen=True)
class PermissionVerdict:
    run: bool
    reason: str = ""
    restricted: bool = False  # the unknown-effect restriction decided it


def _resolve(path: str, cwd: str) -> str:
    return os.path.realpath(os.path.join(cwd, os.path.expanduser(path)))


def _match_parts(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match_parts(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match_parts(pattern[1:], parts[1:])


def _glob_holds(glob: str, resolved: str, cwd: str) -> bool:
    pattern = os.path.normpath(os.path.join(os.path.realpath(cwd), glob))
    return _match_parts(pattern.split(os.sep), resolved.split(os.sep))


def path_rule_matches(rule: dict[str, Any], tool: str, arguments: dict[str, Any], cwd: str) -> bool:
    """``{tool, path}``: the call's ``path`` argument, resolved (symlinks too), lies inside the glob.

    ``*`` never crosses a ``/``; ``**`` matches any number of directories. No path argument, no match.
    """
    if rule.get("tool") != tool:
        return False
    target = arguments.get("path")
    if not isinstance(target, str) or not target:
        return False
    return _glob_holds(str(rule.get("path", "")), _resolve(target, cwd), cwd)


def allowed_by_rule(permissions: dict[str, Any], tool: str, arguments: dict[str, Any], cwd: str) -> bool:
    for rule in permissions.get("allow") or []:
        if isinstance(rule, str) and rule == tool:
            return True
        if isinstance(rule, dict) and path_rule_matches(rule, tool, arguments, cwd):
            return True
    return False


# --------------------------------------------------------------------------- where built-in reads look


def inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies under it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def is_env_file(path: str) -> bool:
    """A file named ``.env`` or ``.env.*``: where projects keep their credentials, wherever it is."""
    name = os.path.basename(path)
    return name == ".env" or name.startswith(".env.")


def glob_base(pattern: str) -> str:
    """The directory a glob pattern lists from: its components before the first one with a wildcard (the
    whole pattern when it has none, which glob looks up as it is)."""
    parts = pattern.split("/")
    fixed: list[str] = []
    for part in parts:
        if _WILDCARD.search(part):
            break
        fixed.append(part)
    return "/".join(fixed) or ("/" if pattern.startswith("/") else ".")


def read_target(reader: str, arguments: dict[str, Any], cwd: str) -> tuple[str, str]:
    """Where a built-in read looks, as ``(resolved, as named)``: its argument joined to ``cwd`` exactly
    as the tool joins it (no ``~`` expansion), resolved with symlinks and ``..``; for ``glob`` the
    directory its pattern lists from."""
    name, default = READ_ARGUMENTS[reader]
    given = str(arguments.get(name, default))  # as the tool reads it
    if reader == "glob":
        given = glob_base(given)
    joined = os.path.join(cwd, given)
    return os.path.realpath(joined), os.path.normpath(joined)


def chat_folders(permissions: dict[str, Any], cwd: str) -> list[str]:
    """The chat's folder, then the folders the person added (``permissions.folders``: absolute, ``~``,
    or relative to the chat's folder), resolved."""
    return [os.path.realpath(cwd)] + [_resolve(str(f), cwd) for f in permissions.get("folders") or []]


def secret_place(resolved: str, named: str, secret: Sequence[str], content: bool = True) -> str | None:
    """The place holding credentials that a read is in: one of ``secret`` (resolved) or, for a read of
    what a ``.env`` file holds (by the name it was given or the file it resolves to), "a .env file".
    None: no such place."""
    if content and (is_env_file(resolved) or is_env_file(named)):
        return "a .env file"
    return next((place for place in secret if inside(resolved, place)), None)


def _opened_by_path_rule(permissions: dict[str, Any], tool: str, resolved: str, cwd: str) -> bool:
    return any(isinstance(rule, dict) and rule.get("tool") == tool and _glob_holds(str(rule.get("path", "")), resolved, cwd)
               for rule in permissions.get("allow") or [])


def read_problem(call: CallFacts, permissions: dict[str, Any], cwd: str, secret: Sequence[str]) -> str:
    """Rule 2: why this built-in read needs an approval in ``ask`` mode, naming the resolved path
    ('' when it reads only where it may, in bypass mode, and for every other call)."""
    if call.reader is None or permissions.get("mode") == "bypass":
        return ""
    resolved, named = read_target(call.reader, call.arguments, cwd)
    if _opened_by_path_rule(permissions, call.tool, resolved, cwd):
        return ""
    place = secret_place(resolved, named, secret, content=call.reader in CONTENT_READERS)
    if place is not None:
        return (f"{call.tool} would read {resolved}, in {place}, which holds credentials: it needs your one-time "
                f"approval even inside the chat's folder or when {call.tool} is allowed (an allow rule "
                f"{{tool: {call.tool}, path: <glob>}} holding it opens it).")
    folders = chat_folders(permissions, cwd)
    if call.tool in (permissions.get("allow") or []) or any(inside(resolved, folder) for folder in folders):
        return ""
    added = f" or the folders added to it ({', '.join(folders[1:])})" if folders[1:] else ""
    return (f"{call.tool} would read {resolved}, outside this chat's folder {folders[0]}{added}: it needs your "
            "one-time approval in ask mode.")


def unknown_reason(unknown: Sequence[dict[str, Any]]) -> str:
    names = ", ".join(f"{u['tool']} ({u['call_id']})" for u in unknown)
    return (f"Earlier calls have an unknown outcome: {names}. Until you say whether they ran (or a check finds "
            "their result), this call needs your one-time approval; bypass mode and allow rules do not apply.")


def check_call(call: CallFacts, permissions: dict[str, Any], cwd: str,
               unknown: Sequence[dict[str, Any]], secret: Sequence[str] = ()) -> PermissionVerdict:
    """The rules of the module docstring, in order. ``secret``: the resolved places holding credentials
    (``secret_places``), ``.env`` files aside."""
    problem = read_problem(call, permissions, cwd, secret)
    if unknown:
        if call.trusted_probe and not problem:
            return PermissionVerdict(True)
        if call.trusted_probe:
            names = ", ".join(f"{u['tool']} ({u['call_id']})" for u in unknown)
            return PermissionVerdict(False, f"{problem} Earlier calls have an unknown outcome ({names}): the approval "
                                     "holds only while that set is unchanged.")
        return PermissionVerdict(False, unknown_reason(unknown), restricted=True)
    if problem:
        return PermissionVerdict(False, problem)
    if call.capability in (Capability.READ_ONLY, Capability.STATE_PROBE):
        return PermissionVerdict(True)
    if permissions.get("mode") == "bypass":
        return PermissionVerdict(True)
    if allowed_by_rule(permissions, call.tool, call.arguments, cwd):
        return PermissionVerdict(True)
    return PermissionVerdict(False, f"{call.tool} ({call.capability}) needs your approval in ask mode: no allow rule matches.")


# --------------------------------------------------------------------------- a read's walk


@dataclass(frozen=True)
class ReadFence:
    """Rule 2 inside a built-in read's walk (``ask`` mode): ``grep`` opens a file and ``glob`` lists a
    directory only inside ``roots`` (the chat's folders and the call's own checked or approved root),
    never through a symlink out of them, never in a ``secret`` place (those holding the root itself
    excepted) and, for ``grep``, never a ``.env`` file: a walk never reads what naming the path would
    have asked for."""

    roots: tuple[str, ...]
    secret: tuple[str, ...]

    def may_list(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(inside(real, r) for r in self.roots) and not any(inside(real, s) for s in self.secret)

    def may_read(self, path: str) -> bool:
        return not is_env_file(path) and not is_env_file(os.path.realpath(path)) and self.may_list(path)


def read_fence(call: CallFacts, permissions: dict[str, Any], cwd: str, secret: Sequence[str]) -> ReadFence | None:
    """The fence of a built-in read's walk in ``ask`` mode (None: bypass mode, or not a built-in read)."""
    if call.reader is None or permissions.get("mode") == "bypass":
        return None
    root, _ = read_target(call.reader, call.arguments, cwd)
    kept = tuple(s for s in secret if not inside(root, s))
    return ReadFence((*chat_folders(permissions, cwd), root), kept)


def secret_places(state_dir: Path | str, home: str | None = None) -> tuple[str, ...]:
    """The shell's fact: where credentials live on this machine, resolved — the home directory's
    ``HOME_SECRETS``, Jupyter's runtime, data and config dirs (``jupyter_core.paths``, from this
    process's environment, which workers inherit from the server) and this extension's state dir."""
    home = home or os.path.expanduser("~")
    places = [os.path.join(home, p) for p in HOME_SECRETS]
    places += [jupyter_runtime_dir(), jupyter_data_dir(), jupyter_config_dir(), str(state_dir)]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in places))
