"""What a tool process may see, and the secrets that never reach a transcript or a provider.

Tool processes start from a small allow-list of the worker's environment plus the names a person
configured (``GoalsApp.tool_env_allow`` and a session's ``permissions.env_allow``). A name that looks
like a secret (``*TOKEN*``, ``*KEY*``, ``*SECRET*``, ``*PASSWORD*``, the Jupyter variables …) passes
only when it is named exactly, never through a glob. Independently, the values of the server's token
and of every credential the worker holds are replaced by ``[redacted: NAME]`` in whatever a tool
returns before it is committed, so a secret that reaches a tool by another way (a file, ``/proc``)
still never reaches control.db or the model.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# passed to every tool process when the worker has them (PWD is set to the session's folder)
BASE_ALLOW: tuple[str, ...] = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ", "TMPDIR",
)
# values of these names are credentials: hidden from tools and redacted from their output
CREDENTIAL_PATTERNS: tuple[str, ...] = ("*TOKEN*", "*KEY*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*")
# never passed to a tool unless named exactly (credentials, auth sockets, the Jupyter variables)
SECRET_PATTERNS: tuple[str, ...] = (*CREDENTIAL_PATTERNS, "*AUTH*", "*COOKIE*", "*SESSION*", "JUPYTER*", "JPY_*")
# a value this short is no credential worth hiding, and redacting it would garble ordinary output
MIN_SECRET_LEN = 8


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_PATTERNS)


def is_credential_name(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in CREDENTIAL_PATTERNS)


def allow_entry_problem(entry: str) -> str | None:
    """Why ``entry`` of an allow-list cannot be an environment variable name or glob, or None. Glob
    characters (``*?[]``) are fine; quotes, commas, whitespace and ``=`` mean a mistyped list (say a
    whole JSON list given as one command-line value)."""
    if not entry:
        return "it is empty"
    bad = sorted({ch for ch in entry if ch in "'\",=\0" or ch.isspace()})
    if bad:
        return "it contains " + " ".join(repr(ch) for ch in bad)
    return None


def tool_environment(source: Mapping[str, str], allow: Iterable[str], cwd: str) -> dict[str, str]:
    """The environment of one tool process: ``BASE_ALLOW`` plus ``allow`` (exact names or globs), from
    ``source``. Globs never match a secret-looking name; an exact name always passes."""
    exact, globs = _allow_rules((*BASE_ALLOW, *allow))
    env: dict[str, str] = {}
    for name, value in source.items():
        if name in exact:
            env[name] = value
        elif globs is not None and not is_secret_name(name) and globs.match(name):
            env[name] = value
    env["PWD"] = cwd
    return env


@functools.lru_cache(maxsize=256)
def _allow_rules(patterns: tuple[str, ...]) -> tuple[frozenset[str], re.Pattern[str] | None]:
    """Exact names, and one compiled matcher for the globs (built once per allow-list: a busy
    worker builds a tool environment per call)."""
    exact = frozenset(p for p in patterns if not any(ch in p for ch in "*?["))
    globs = [fnmatch.translate(p) for p in patterns if p not in exact]
    return exact, re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None


@dataclass(frozen=True)
class Redacted:
    text: str
    names: tuple[str, ...] = ()


@dataclass
class Redactor:
    """Replaces known secret values by ``[redacted: NAME]``. Longer values first, so a secret that
    contains another is hidden whole."""

    secrets: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        values = {v: n for n, v in sorted(self.secrets.items()) if len(v) >= MIN_SECRET_LEN}
        self._names = values
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))) if values else None
        )

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None) -> Redactor:
        """Every credential-looking variable of ``env`` (default: this process) plus ``extra`` (the
        server's token, handed to the worker on its stdin, never in its environment)."""
        source = os.environ if env is None else env
        found = {name: value for name, value in source.items() if is_credential_name(name) and value}
        found.update({k: v for k, v in (extra or {}).items() if v})
        return cls(found)

    def with_secrets(self, more: Mapping[str, str]) -> Redactor:
        """This redactor plus ``more`` ({NAME: value}), e.g. model keys read from key files now."""
        return self if not more else Redactor({**self.secrets, **{k: v for k, v in more.items() if v}})

    def redact(self, text: str) -> Redacted:
        if self._pattern is None or not text:
            return Redacted(text)
        names: set[str] = set()

        def replace(m: re.Match[str]) -> str:
            names.add(self._names[m.group(0)])
            return f"[redacted: {self._names[m.group(0)]}]"

        out = self._pattern.sub(replace, text)
        return Redacted(out, tuple(sorted(names)))

    def __call__(self, text: str) -> str:
        return self.redact(text).text
