"""The labextension's TypeScript types are generated from ``labextension/openapi.json`` at every build
(``jlpm build:types``: openapi-typescript → ``src/openapi.ts``), a snapshot of the document the server
serves, committed so that an offline ``pip install .`` builds them without importing this package. These
tests fail while the snapshot differs from ``jupyter_goals.server.openapi.document()``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jupyter_goals.server.openapi import document

LABEXTENSION = Path(__file__).resolve().parent.parent / "labextension"
SNAPSHOT = LABEXTENSION / "openapi.json"
REFRESH = "python -m jupyter_goals.server.openapi > labextension/openapi.json"


def served() -> dict[str, Any]:
    """The document as a client reads it (JSON: tuples become lists)."""
    return dict(json.loads(json.dumps(document())))


def stale(snapshot: dict[str, Any], current: dict[str, Any]) -> str | None:
    """None when the snapshot is the current document, else what differs and the one command that refreshes it."""
    if snapshot == current:
        return None
    parts = [f"paths[{p!r}]" for p in sorted({*snapshot.get("paths", {}), *current.get("paths", {})})
             if snapshot.get("paths", {}).get(p) != current.get("paths", {}).get(p)]
    old, new = (d.get("components", {}).get("schemas", {}) for d in (snapshot, current))
    parts += [f"schemas[{s!r}]" for s in sorted({*old, *new}) if old.get(s) != new.get(s)]
    parts += [k for k in sorted({*snapshot, *current} - {"paths", "components"}) if snapshot.get(k) != current.get(k)]
    return (f"labextension/openapi.json differs from the document the server serves ({', '.join(parts) or 'components'});"
            f" refresh it from the checkout's root with `{REFRESH}` (the labextension's next build regenerates its"
            " types from it)")


def test_the_labextension_snapshot_is_the_document_the_server_serves() -> None:
    try:
        snapshot = json.loads(SNAPSHOT.read_text())
    except ValueError as exc:  # e.g. emptied by a refresh whose document() failed
        raise AssertionError(f"labextension/openapi.json is not JSON ({exc}): refresh it with `{REFRESH}`") from exc
    problem = stale(snapshot, served())
    assert problem is None, problem


def test_a_stale_snapshot_is_named_with_the_command_that_refreshes_it() -> None:
    current = served()
    old = json.loads(json.dumps(current))
    del old["components"]["schemas"]["GoalAction"]
    old["paths"]["/health"]["get"]["summary"] = "an older summary"
    problem = stale(old, current)
    assert problem is not None and REFRESH in problem
    assert "paths['/health']" in problem and "schemas['GoalAction']" in problem


def test_every_labextension_build_generates_the_types_from_the_snapshot() -> None:
    """``pip install .`` runs ``build:prod`` (hatch-jupyter-builder), which cleans ``lib/`` and the generated file."""
    scripts = json.loads((LABEXTENSION / "package.json").read_text())["scripts"]
    assert scripts["build:types"].startswith("openapi-typescript openapi.json ")
    assert "-o src/openapi.ts" in scripts["build:types"] and "src/openapi.ts" in scripts["clean:lib"]
    for name in ("build:lib", "build:lib:prod"):
        assert scripts[name].startswith("jlpm build:types && tsc"), name
