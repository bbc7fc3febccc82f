"""Named models as workers see them: ``JUPYTER_GOALS_MODELS`` (JSON ``{name: spec}``), exported by the
server before it starts them. Ground level (depends on ``models`` only): prices, the adapters and the
catalog all read it, and none of them imports another for it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from jupyter_goals.models import ModelSpec

NAMED_ENV = "JUPYTER_GOALS_MODELS"  # named models a worker must resolve by name (JSON: {name: spec})
_SPECS = TypeAdapter(dict[str, ModelSpec])


def parse_specs(raw: Mapping[str, Any]) -> dict[str, ModelSpec]:
    """Validate ``GoalsApp.models``; ValueError with every problem in one message."""
    try:
        specs = _SPECS.validate_python(dict(raw))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"GoalsApp.models is not valid: {problems}") from exc
    for name in specs:
        if not name or ":" in name:
            raise ValueError(f"GoalsApp.models: name {name!r} must be non-empty and contain no ':'")
    return specs


def model_string(spec: ModelSpec) -> str:
    return f"{spec.provider}:{spec.model}"


def named_from_env(environ: Mapping[str, str] | None = None) -> dict[str, ModelSpec]:
    """The named models exported by the server (empty when unset or unreadable)."""
    raw = (os.environ if environ is None else environ).get(NAMED_ENV)
    if not raw:
        return {}
    try:
        return parse_specs(json.loads(raw))
    except ValueError:
        return {}
