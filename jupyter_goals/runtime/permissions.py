"""Whether one planned tool call may run now or needs a one-time approval (DESIGN §6, §10).

Pure apart from resolving paths: facts in, verdict out. The order of the rules is the contract:
1. Unknown effects in scope (a restricted turn): only trusted built-in read-only / state-probe
   implementations (by identity saved on the effect) run; every other call needs an approval bound
   to this call and to the digest of the unknown-effect set. Bypass and allow rules do not waive it.
2. A read_only / state_probe capability from the trusted registry entry runs.
3. ``bypass`` runs everything.
4. An ``allow`` rule matches: a tool name, or ``{tool, path}`` where the call's ``path`` argument
   resolves inside the glob (relative to the session's cwd).
5. Otherwise the call needs an approval.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_goals.models import Capability


@dataclass(frozen=True)
class CallFacts:
    tool: str
    arguments: dict[str, Any]
    capability: Capability  # from the trusted registry entry, saved on the effect
    trusted_probe: bool  # the saved implementation identity is a built-in read-only/probe function


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


def path_rule_matches(rule: dict[str, Any], tool: str, arguments: dict[str, Any], cwd: str) -> bool:
    """``{tool, path}``: the call's ``path`` argument, resolved (symlinks too), lies inside the glob.

    ``*`` never crosses a ``/``; ``**`` matches any number of directories. No path argument, no match.
    """
    if rule.get("tool") != tool:
        return False
    target = arguments.get("path")
    if not isinstance(target, str) or not target:
        return False
    pattern = os.path.normpath(os.path.join(os.path.realpath(cwd), str(rule.get("path", ""))))
    return _match_parts(pattern.split(os.sep), _resolve(target, cwd).split(os.sep))


def allowed_by_rule(permissions: dict[str, Any], tool: str, arguments: dict[str, Any], cwd: str) -> bool:
    for rule in permissions.get("allow") or []:
        if isinstance(rule, str) and rule == tool:
            return True
        if isinstance(rule, dict) and path_rule_matches(rule, tool, arguments, cwd):
            return True
    return False


def unknown_reason(unknown: Sequence[dict[str, Any]]) -> str:
    names = ", ".join(f"{u['tool']} ({u['call_id']})" for u in unknown)
    return (f"Earlier calls have an unknown outcome: {names}. Until they are reviewed, this call needs your "
            "one-time approval; bypass mode and allow rules do not apply.")


def check_call(call: CallFacts, permissions: dict[str, Any], cwd: str,
               unknown: Sequence[dict[str, Any]]) -> PermissionVerdict:
    if unknown:
        if call.trusted_probe:
            return PermissionVerdict(True)
        return PermissionVerdict(False, unknown_reason(unknown), restricted=True)
    if call.capability in (Capability.READ_ONLY, Capability.STATE_PROBE):
        return PermissionVerdict(True)
    if permissions.get("mode") == "bypass":
        return PermissionVerdict(True)
    if allowed_by_rule(permissions, call.tool, call.arguments, cwd):
        return PermissionVerdict(True)
    return PermissionVerdict(False, f"{call.tool} ({call.capability}) needs your approval in ask mode: no allow rule matches.")
