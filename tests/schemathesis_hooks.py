"""schemathesis hooks of ``tests/test_openapi.py``'s fuzzing runs (``SCHEMATHESIS_HOOKS``).

They keep out of the requests the few rules that JSON Schema and OpenAPI 3.1 cannot state, each one
written in the served document's descriptions and answered 400 by the server (a documented answer):
two query arguments that exclude each other, and requirement ids that must differ. Everything else the
server checks is in the document itself, so "a schema-valid request is accepted" holds for the rest.
The generated values are mended (a filter would refuse too many of them: hypothesis gives up); what
the stateful phase adds from an earlier answer (an id) is mended just before the call, and schemathesis
then judges the request as it is sent.
"""

from __future__ import annotations

from typing import Any

import schemathesis

#: (method, path) → (rule, the query arguments it binds), as the parameters' descriptions say
QUERY_RULES: dict[tuple[str, str], tuple[str, tuple[str, str]]] = {
    ("GET", "/sessions/{session_id}"): ("not both", ("before", "after")),
    ("GET", "/usage"): ("exactly one", ("session_id", "goal_id")),
}


def _rule(context: Any) -> tuple[str, tuple[str, str]] | None:
    op = context.operation
    return QUERY_RULES.get((op.method.upper(), op.path)) if op is not None else None


@schemathesis.hook
def map_query(context: Any, query: Any) -> Any:
    """Both of two exclusive arguments: the first stays. Neither of two where one is needed: a well-formed
    session id that names nothing (a documented 404)."""
    rule = _rule(context)
    if rule is None or not isinstance(query, dict):
        return query
    kind, (first, second) = rule
    if first in query and second in query:
        del query[second]
    elif kind == "exactly one" and first not in query and second not in query:
        query[first] = "ses_" + "0" * 24
    return query


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    """A Goal's requirements name each explicit ``id`` once (JSON Schema has no "unique by property"):
    a repeated one is dropped, so the server names the requirement itself."""
    if isinstance(body, dict) and isinstance(body.get("requirements"), list):
        seen: set[str] = set()
        for r in body["requirements"]:
            if isinstance(r, dict) and r.get("id") is not None:
                if repr(r["id"]) in seen:
                    del r["id"]
                else:
                    seen.add(repr(r["id"]))
    return body


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    """The stateful phase adds an id from an earlier answer after the query was generated (and mended)."""
    rule = _rule(context)
    query = case.query
    if rule is not None and isinstance(query, dict) and all(name in query for name in rule[1]):
        del query[rule[1][1]]
