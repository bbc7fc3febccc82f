"""Request bodies, refused before anything is written (issue 16, bad input).

``parse_body`` turns the raw bytes of a request into the JSON object a handler validates, or refuses
them with a ``{"error", "message"}`` answer, in this order:

1. more than ``max_bytes`` bytes: 413 ``request_too_large``, checked on the byte count before any
   decoding or parsing (``GoalsApp.max_request_bytes``);
2. not UTF-8 (RFC 8259): 400 ``bad_json`` naming the byte and its position;
3. not JSON, or ``NaN`` / ``Infinity`` / a number too large for a float: 400 ``bad_json``;
4. nested deeper than ``MAX_JSON_DEPTH`` (or deep enough to exhaust the parser): 400 ``bad_json``;
5. not an object: 400 ``bad_request``;
6. a string (value or key) holding an unpaired UTF-16 surrogate (``"\\ud800"``, valid JSON that no
   UTF-8 database or client can store): 400 ``bad_json``;
7. a string longer than ``max_chars`` characters (a message, a Job's input, a Goal's objective, …):
   413 ``text_too_large`` naming the field (``GoalsApp.max_message_chars``).

Pure: no I/O. The depth and string checks walk the parsed value iteratively, so a hostile body
cannot exhaust the stack here either.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

MAX_JSON_DEPTH = 32  # no request body of DESIGN §10 nests deeper than 4 levels


class BodyRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _where(path: list[str]) -> str:
    return ".".join(path) or "body"


def parse_body(data: bytes, *, max_bytes: int, max_chars: int) -> dict[str, Any]:
    """The request body as a JSON object (an empty body is ``{}``), or ``BodyRefused``."""
    if len(data) > max_bytes:
        raise BodyRefused(413, "request_too_large",
                          f"request body is {len(data):,} bytes; the limit is {max_bytes:,} bytes"
                          " (GoalsApp.max_request_bytes)")
    if not data.strip():
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRefused(400, "bad_json", f"request body is not UTF-8 text: byte 0x{data[exc.start]:02x}"
                          f" at position {exc.start} ({exc.reason})") from None
    try:
        raw = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise BodyRefused(400, "bad_json", f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise BodyRefused(400, "bad_json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BodyRefused(400, "bad_request", f"request body must be a JSON object, not {_KINDS.get(type(raw), 'that')}")
    # the walk is needed only when a string could be too long, a container too deep, or a surrogate
    # present (json.dumps finds those at C speed); typical bodies skip it
    if len(data) > max_chars or data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH or not _encodable(raw):
        _check(raw, max_chars)
    return raw


_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
          type(None): "null"}


def _encodable(raw: dict[str, Any]) -> bool:
    try:
        json.dumps(raw, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check(root: dict[str, Any], max_chars: int) -> None:
    """Depth-first with one iterator per open container: memory grows with the depth, not the size."""
    for k in root:
        _check_text(k, ["(key)"], max_chars)
    stack: list[tuple[Iterator[tuple[str, Any]], list[str]]] = [(((k[:40], v) for k, v in root.items()), [])]
    while stack:
        items, path = stack[-1]
        step = next(items, None)
        if step is None:
            stack.pop()
            continue
        key, value = step
        if isinstance(value, str):
            _check_text(value, [*path, key], max_chars)
        elif isinstance(value, (dict, list)):
            if len(stack) >= MAX_JSON_DEPTH:
                raise BodyRefused(400, "bad_json", f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(value, dict):
                for k in value:
                    _check_text(k, [*path, key, "(key)"], max_chars)
                stack.append((((k[:40], v) for k, v in value.items()), [*path, key]))
            else:
                stack.append((((str(i), v) for i, v in enumerate(value)), [*path, key]))


def _check_text(s: str, path: list[str], max_chars: int) -> None:
    if len(s) > max_chars:
        raise BodyRefused(413, "text_too_large", f"{_where(path)} is {len(s):,} characters; the limit is"
                          f" {max_chars:,} (GoalsApp.max_message_chars)")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BodyRefused(400, "bad_json", f"{_where(path)} holds an unpaired UTF-16 surrogate"
                              f" (\\u{ord(s[exc.start]):04x} at character {exc.start}); send valid Unicode text") from None
