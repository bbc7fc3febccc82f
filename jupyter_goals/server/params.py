"""What the handlers read from a request besides its body: the keyset cursor of ``GET /sessions``, a
transcript page's ``before=latest``, a session's folder and a notebook's API path. Pure: path arithmetic
and parsing, no disk access.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re

LATEST = 2**62  # ``?before=latest``: before every seq

# the cursor of GET /sessions, as the OpenAPI document states it: every string it matches is one the
# server reads (a base64 cursor was opaque to the document, so a client could not tell a good one)
CURSOR_PATTERN = r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,2})?~[A-Za-z0-9_\-]{1,100}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(activity: float, session_id: str) -> str:
    """The ``next_cursor`` of ``GET /sessions``: the last row's keyset key, ``<activity>~<session_id>``
    (``repr`` of the float, so it reads back exactly)."""
    return f"{float(activity)!r}~{session_id}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    """ValueError when ``cursor`` is not one :func:`encode_cursor` made (or, before it, the base64 of
    ``[activity, session_id]``, still read so that a listing survives an upgrade)."""
    if _CURSOR.fullmatch(cursor):
        activity, session_id = cursor.split("~")
        return float(activity), session_id
    try:
        activity, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except Exception as exc:
        raise ValueError("cursor is not a next_cursor of GET /sessions") from exc
    if not isinstance(activity, (int, float)) or isinstance(activity, bool) or not isinstance(session_id, str):
        raise ValueError("cursor is not a next_cursor of GET /sessions")
    return float(activity), session_id


def session_folder(cwd: str | None, root_dir: str) -> str:
    """A session's folder as an absolute path: ``cwd`` (``~`` expanded) when absolute, else resolved
    against the server's root directory, which an empty ``cwd`` means. Path arithmetic, no disk access."""
    root = os.path.abspath(os.path.expanduser(root_dir))
    given = os.path.expanduser((cwd or "").strip())
    return os.path.normpath(os.path.join(root, given)) if given else root


def notebook_api_path(path: str, root_dir: str) -> str:
    """A notebook's API path (relative to the server root, ``/``-separated), from an API path or from
    the absolute OS path a kernel gets in ``JPY_SESSION_NAME``. ValueError when it leaves the root.
    A path ending in ``/`` names a folder, and keeps its ``/`` (``./`` for the root): the key of the
    kernels working there that cannot know their notebook (nbconvert, papermill)."""
    raw = path.strip()
    folder = raw.endswith(("/", os.sep))
    if os.path.isabs(raw):
        root = os.path.abspath(root_dir)
        full = os.path.abspath(raw)
        if os.path.commonpath([root, full]) != root:
            raise ValueError(f"{path!r} is outside the server root {root}")
        raw = os.path.relpath(full, root)
    norm = posixpath.normpath(raw.replace(os.sep, "/")).lstrip("/")
    if folder and norm in ("", "."):
        return "./"
    if norm in ("", ".") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"{path!r} is not a notebook path inside the server root")
    return norm + "/" if folder else norm
