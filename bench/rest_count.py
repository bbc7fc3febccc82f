"""How many REST requests a JupyterLab page makes per change it shows (issue 32 item 8).

A real ``jupyter lab`` (the installed labextension, a scripted model) and headless Chromium (Debian's
``/usr/bin/chromium`` through playwright) show what a person keeps open: the Goals panel with one chat
selected (its detail below the list), two chat views side by side in the main area, and a notebook with the
four Goals cards the magics leave (Goal, approval, history, chat: a saved notebook with the MIME outputs,
as ``cards.*_bundle`` build them). Then changes are driven from outside over REST, one after another, in
cycles of five: a message to chat A (the model answers), a rename of chat A, a message to chat B (its model
asks to write a file: an approval), that approval approved (the tool runs, the model answers), a rename of
chat B. Each is waited on until its effect is visible in the page (the answer, the new heading, the
approval card) before the next is sent.

Counted: every request the page makes under ``/api/goals/`` (playwright's ``page.on("request")``) except
the event stream ``/api/goals/events``, from the first driven change until the page is quiet again: the
last change's effect is visible and then no counted request for 2 s (a request restarts the 2 s). A
timer of the page would count too, as a person's page makes its requests (it has none: nothing polls);
an idle window before the first change measures them alone. Each request is charged to the
change whose POST it follows (by the request's start time), which gives the breakdown by kind of change
and by URL pattern.

``python bench/rest_count.py [--events N] [--json]`` runs it alone; ``python -m bench --only rest``
through the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import httpx

from bench.common import Bench, api, ro, scalar, wait_until
from jupyter_goals.clients.notebook import cards
from jupyter_goals.testing import ServerProcess
from jupyter_goals.testing.servers import write_script

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page, Request

CHROMIUM = os.environ.get("JUPYTER_GOALS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
KINDS = ("message_a", "rename_a", "message_b", "approve_b", "rename_b")  # one cycle of driven changes
QUIET_S = 2.0
#: path segments followed by an id in the REST API: the id becomes ``{id}`` in a URL pattern
ID_PARENTS = {"sessions", "goals", "approvals", "history", "jobs"}
#: query parameters whose value says what is asked (kept in a URL pattern); other values become ``…``
KEPT_VALUES = {"state", "before", "format", "limit"}


@dataclass
class Seen:
    """One request the page made: when playwright delivered it, and the request (its timing read later)."""

    arrived: float  # time.monotonic() when the handler ran
    method: str
    url: str
    request: Request


def pattern(method: str, url: str) -> str:
    """``GET sessions/{id}?after=…&limit=500``: the URL with its ids and cursors blanked."""
    parts = urlsplit(url)
    path = parts.path.split("/api/goals/", 1)[-1].strip("/").split("/")
    norm = [seg if i == 0 or path[i - 1] not in ID_PARENTS else "{id}" for i, seg in enumerate(path)]
    query = sorted(parse_qsl(parts.query, keep_blank_values=True))
    # a bare number as a key is a cache buster (JupyterLab's ServerConnection adds one to each GET)
    q = "&".join(f"{k}={v if k in KEPT_VALUES else '…'}" for k, v in query if k != "token" and not k.isdigit())
    return f"{method} {'/'.join(norm)}" + (f"?{q}" if q else "")


def counted(url: str) -> bool:
    path = urlsplit(url).path
    return "/api/goals/" in path and not path.rstrip("/").endswith("/api/goals/events")


def _script(path: Path, cycles: int) -> str:
    rules: list[dict[str, Any]] = [
        {"when": {"purpose": "work", "last_user_contains": "hello nb"}, "respond": {"text": "Hello from the script."}},
        {"when": {"last_user_contains": "B-setup.", "last_tool_result_contains": ""}, "respond": {"text": "written"}},
        {"when": {"last_user_contains": "B-setup."},
         "respond": {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "setup"}}]}},
    ]
    for k in range(cycles):
        rules += [
            {"when": {"last_user_contains": f"A-{k:03d}."}, "respond": {"text": f"answer-{k:03d}"}},
            {"when": {"last_user_contains": f"B-{k:03d}.", "last_tool_result_contains": ""},
             "respond": {"text": f"written-{k:03d}"}},
            {"when": {"last_user_contains": f"B-{k:03d}."},
             "respond": {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": str(k)}}]}},
        ]
    # anything else (the notebook's Goal) waits on the model: the Goal is paused before it answers
    return write_script(path, rules, default={"text": "still working", "delay_s": 120})


def _lab(b: Bench, model: str) -> ServerProcess:
    """``jupyter lab`` with the product's own timings, isolated config/data/runtime dirs beside the state."""
    config, data, runtime = b.base / "config", b.base / "data", b.base / "runtime"
    for d in (config, data, runtime):
        d.mkdir(parents=True, exist_ok=True)
    news = config / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    args = ["--ip=127.0.0.1", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    installed = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyter-goals" / "package.json"
    built = Path(__file__).resolve().parent.parent / "jupyter_goals" / "labextension"
    if not installed.is_file():
        if not (built / "package.json").is_file():
            raise RuntimeError("the jupyter-goals labextension is neither installed nor built (jlpm build:prod)")
        extra = b.base / "labextensions"
        extra.mkdir()
        (extra / "jupyter-goals").symlink_to(built, target_is_directory=True)
        args.append(f"--LabApp.extra_labextensions_path={extra}")
    env = {"JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(data), "JUPYTER_RUNTIME_DIR": str(runtime),
           "JUPYTER_PLATFORM_DIRS": "0", "PYTHONUNBUFFERED": "1"}
    server = ServerProcess(b.state, b.root, model=model, extra=args, env=env, app="jupyterlab", fast=False,
                           log_path=b.base / "jupyter-lab.log")
    b.servers.append(server)
    return server.start(timeout=120)


def _ok(r: httpx.Response) -> Any:
    if r.status_code >= 300:
        raise RuntimeError(f"{r.request.method} {r.request.url} -> {r.status_code} {r.text[:500]}")
    return r.json()


def _pending(http: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    return [a for a in _ok(http.get("approvals", params={"state": "pending"}))["approvals"]
            if a["session_id"] == session_id]


def _setup(http: httpx.Client, root: Path) -> dict[str, str]:
    """Chats A (bypass) and B (ask), and the notebook session with an ended Goal (a history record), a chat
    answer and a paused Goal; a notebook file showing the four cards."""
    a = _ok(http.post("sessions", json={"title": "Chat A", "permissions": {"mode": "bypass"}}))["session_id"]
    b = _ok(http.post("sessions", json={"title": "Chat B", "permissions": {"mode": "ask"}}))["session_id"]
    nb = _ok(http.put("notebook-session", json={"path": "cards.ipynb", "permissions": {"mode": "bypass"}}))["session_id"]
    old = _ok(http.post("goals", json={"session_id": nb, "objective": "An older Goal", "requirements": [{"text": "x"}]}))
    _ok(http.post(f"goals/{old['goal_id']}/actions", json={"action": "end", "expected_revision": old["revision"]}))
    [record] = _ok(http.get(f"sessions/{nb}/history"))["records"]
    sent = _ok(http.post(f"sessions/{nb}/messages", json={"text": "hello nb", "client_request_id": "rest-nb-1"}))
    wait_until(lambda: (_ok(http.get(f"sessions/{nb}"))["work"] or {}).get("phase") == "done", 60, "the notebook chat")
    goal = _ok(http.post("goals", json={"session_id": nb, "objective": "Tidy the notes",
                                        "requirements": [{"text": "notes are tidy"}]}))
    _ok(http.post(f"goals/{goal['goal_id']}/actions", json={"action": "pause", "expected_revision": goal["revision"]}))
    wait_until(lambda: (_ok(http.get(f"sessions/{nb}"))["work"] or {}).get("phase") == "paused", 150,
               "the notebook Goal's work to pause")
    _ok(http.post(f"sessions/{b}/messages", json={"text": "B-setup. write b.txt", "client_request_id": "rest-b-setup"}))
    wait_until(lambda: bool(_pending(http, b)), 60, "chat B's first approval")
    [approval] = _pending(http, b)
    _ok(http.post(f"approvals/{approval['approval_id']}", json={"decision": "approve"}))
    wait_until(lambda: (_ok(http.get(f"sessions/{b}"))["work"] or {}).get("phase") == "done", 60, "chat B's setup turn")
    decided = _ok(http.get(f"approvals/{approval['approval_id']}"))
    bundles = [cards.goal_bundle(_ok(http.get(f"goals/{goal['goal_id']}"))),
               cards.approval_bundle(decided),
               cards.history_bundle(record),
               cards.chat_bundle(nb, sent["work_id"], sent["message_id"], "hello nb")]
    cell = {"cell_type": "code", "execution_count": 1, "id": "cards", "metadata": {}, "source": ["%goal status"],
            "outputs": [{"output_type": "display_data", "metadata": {}, "data": d} for d in bundles]}
    (root / "cards.ipynb").write_text(json.dumps({"cells": [cell], "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))
    return {"a": a, "b": b, "nb": nb, "approval_state": str(decided["state"])}


def _view(page: Page, session_id: str) -> Locator:
    return page.locator(f'[data-testid="goals-session-view"][data-session-id="{session_id}"]')


def _open_page(page: Page, server: ServerProcess, ids: dict[str, str]) -> None:
    """The Goals panel with chat A selected; chat A and chat B side by side; the notebook below chat B."""
    page.goto(f"{server.url}lab?token={server.token}")
    page.wait_for_function("() => window.jupyterapp !== undefined")
    page.evaluate("() => window.jupyterapp.restored.then(() => true)")
    page.wait_for_selector("#jupyterlab-splash", state="detached")
    page.evaluate("() => window.jupyterapp.commands.execute('jupyter-goals:open')")
    page.locator(f'#jupyter-goals-sidebar [data-testid="goals-session"][data-session-id="{ids["a"]}"]').click()
    _view(page, ids["a"]).get_by_role("heading", name="Chat A").wait_for()
    page.evaluate("(sid) => window.jupyterapp.commands.execute('jupyter-goals:open-session', "
                  "{session_id: sid, mode: 'split-right'})", ids["b"])
    _view(page, ids["b"]).get_by_role("heading", name="Chat B").wait_for()
    page.evaluate("(p) => window.jupyterapp.commands.execute('docmanager:open', "
                  "{path: p, options: {mode: 'split-bottom'}})", "cards.ipynb")
    out = '[data-testid="goals-output"][data-kind="{}"]'
    page.locator(out.format("goal")).locator('[data-testid="goals-goal-state"]').filter(has_text="paused").wait_for()
    page.locator(out.format("approval")).locator('[data-testid="goals-approval-state"]').filter(
        has_text=ids["approval_state"]).wait_for()
    page.locator(out.format("history")).locator('[data-testid="goals-history-objective"]').filter(
        has_text="An older Goal").wait_for()
    page.locator(out.format("chat")).locator('[data-testid="goals-chat-item"]').filter(
        has_text="Hello from the script.").wait_for()
    for sid in (ids["a"], ids["b"]):  # every view in sight, none hidden behind a tab
        if not _view(page, sid).is_visible():
            raise RuntimeError(f"the view of {sid} is not visible")


def _wait_quiet(page: Page, seen: list[Seen], timeout: float = 60) -> float:
    """Until no counted request arrived for ``QUIET_S``; returns the time.monotonic() of the last one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page.wait_for_timeout(100)  # playwright delivers the page's requests while it waits
        last = max((s.arrived for s in seen), default=0.0)
        if time.monotonic() - last >= QUIET_S:
            return last
    raise TimeoutError(f"the page never went quiet for {QUIET_S:g} s within {timeout:.0f} s")


def _start_ms(s: Seen) -> float:
    """The request's start (epoch ms) as the browser timed it; its arrival here when there is no timing."""
    try:
        start = float(s.request.timing.get("startTime", -1))
    except Exception:  # a request that never got an answer has no timing
        start = -1
    return start if start > 0 else (time.time() - (time.monotonic() - s.arrived)) * 1000


def _drive(page: Page, http: httpx.Client, ids: dict[str, str], n: int) -> list[tuple[str, float]]:
    """``n`` changes in cycles of ``KINDS``, each waited on in the page; returns (kind, epoch ms at its POST)."""
    marks: list[tuple[str, float]] = []
    va, vb = _view(page, ids["a"]), _view(page, ids["b"])
    approval = ""
    for i in range(n):
        kind, k = KINDS[i % len(KINDS)], i // len(KINDS)
        marks.append((kind, time.time() * 1000))
        if kind == "message_a":
            _ok(http.post(f"sessions/{ids['a']}/messages", json={"text": f"A-{k:03d}. hello", "client_request_id": f"a{k}"}))
            va.locator('[data-testid="goals-item"]').filter(has_text=f"answer-{k:03d}").first.wait_for()
        elif kind == "message_b":
            _ok(http.post(f"sessions/{ids['b']}/messages", json={"text": f"B-{k:03d}. write", "client_request_id": f"b{k}"}))
            wait_until(lambda: bool(_pending(http, ids["b"])), 30, "chat B's approval", every=0.05)
            approval = _pending(http, ids["b"])[0]["approval_id"]
            vb.locator(f'[data-testid="goals-approval"][data-approval-id="{approval}"]').first.wait_for()
        elif kind == "approve_b":
            _ok(http.post(f"approvals/{approval}", json={"decision": "approve"}))
            vb.locator('[data-testid="goals-item"]').filter(has_text=f"written-{k:03d}").first.wait_for()
        else:
            sid, view, name = (ids["a"], va, "A") if kind == "rename_a" else (ids["b"], vb, "B")
            title = f"Chat {name} r{k:03d}"
            _ok(http.patch(f"sessions/{sid}", json={"title": title}))
            view.get_by_role("heading", name=title).wait_for()
    return marks


def run(events: int = 100, idle_s: float = 10.0, headless: bool = True,
        screenshot: Path | None = None) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        raise RuntimeError(f"{CHROMIUM} not found: run .ci/install-chromium.sh (Debian's chromium package)")
    cycles = -(-events // len(KINDS))
    with Bench("rest") as b:
        server = _lab(b, _script(b.base / "script.json", cycles))
        with api(server) as http, sync_playwright() as pw:
            ids = _setup(http, b.root)
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=headless, args=CHROMIUM_ARGS)
            try:
                page = browser.new_context(viewport={"width": 1920, "height": 1200}).new_page()
                page.set_default_timeout(60_000)
                seen: list[Seen] = []
                streams: list[str] = []

                def on_request(r: Request) -> None:
                    if counted(r.url):
                        seen.append(Seen(time.monotonic(), r.method, r.url, r))
                    elif "/api/goals/" in r.url:
                        streams.append(r.url)

                page.on("request", on_request)
                _open_page(page, server, ids)
                _wait_quiet(page, seen)
                # the page's timers alone: requests over an idle window before the first change
                idle_from = len(seen)
                t0 = time.monotonic()
                while time.monotonic() - t0 < idle_s:
                    page.wait_for_timeout(100)
                idle = [pattern(s.method, s.url) for s in seen[idle_from:]]
                _wait_quiet(page, seen)
                db = ro(b.state)
                seq0 = int(scalar(db, "SELECT COALESCE(MAX(seq), 0) FROM events"))
                first = len(seen)
                streams_before = len(streams)
                started = time.monotonic()
                marks = _drive(page, http, ids, events)
                last = _wait_quiet(page, seen)
                window_s = last - started if len(seen) > first else time.monotonic() - started
                log_events = int(scalar(db, "SELECT COALESCE(MAX(seq), 0) FROM events")) - seq0
                db.close()
                driven = seen[first:]
                started_ms = [_start_ms(s) for s in driven]
                if screenshot is not None:
                    page.screenshot(path=str(screenshot))
            finally:
                browser.close()
        return _summary(events, driven, started_ms, marks, idle, idle_s, window_s, log_events,
                        len(streams) - streams_before)


def _summary(events: int, driven: list[Seen], started_ms: list[float], marks: list[tuple[str, float]],
             idle: list[str], idle_s: float, window_s: float, log_events: int, stream_requests: int) -> dict[str, Any]:
    by_pattern = Counter(pattern(s.method, s.url) for s in driven)
    per_kind: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    starts = [m for _, m in marks]
    for s, at in zip(driven, started_ms, strict=True):
        i = max((j for j, m in enumerate(starts) if m <= at), default=0)
        per_kind[marks[i][0]][pattern(s.method, s.url)] += 1
    kinds_n = Counter(k for k, _ in marks)
    return {
        "events": events, "requests": len(driven), "requests_per_event": round(len(driven) / events, 3),
        "log_events": log_events, "requests_per_log_event": round(len(driven) / log_events, 3) if log_events else None,
        "window_s": round(window_s, 1), "quiet_s": QUIET_S,
        "by_pattern": dict(by_pattern.most_common()),
        "per_kind": {k: {"events": kinds_n[k], "requests_per_event": round(sum(c.values()) / kinds_n[k], 2),
                         "by_pattern": {p: round(v / kinds_n[k], 2) for p, v in c.most_common()}}
                     for k, c in per_kind.items() if kinds_n[k]},
        "idle": {"seconds": idle_s, "requests": len(idle), "by_pattern": dict(Counter(idle).most_common())},
        "event_stream_requests": stream_requests,
    }


def explain(r: dict[str, Any], top: int = 6) -> str:
    """The breakdown in one line: the URL patterns fetched per driven change, and per kind of change."""
    n = r["events"]
    pats = "; ".join(f"{p} {c / n:.2f}" for p, c in list(r["by_pattern"].items())[:top])
    kinds = ", ".join(f"{k} {v['requests_per_event']}" for k, v in r["per_kind"].items())
    idle = r["idle"]
    return (f"{r['requests']} requests for {n} changes ({r['log_events']} log events) over {r['window_s']} s. "
            f"Per change by URL: {pats}. Per kind of change: {kinds}. Idle page: {idle['requests']} requests "
            f"in {idle['seconds']:g} s ({', '.join(idle['by_pattern']) or 'none'})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--events", type=int, default=100)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle page measured before the changes")
    ap.add_argument("--headed", action="store_true")
    ap.add_argument("--screenshot", type=Path, help="save the page as it looks after the last change")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(args.events, args.idle, headless=not args.headed, screenshot=args.screenshot)
    print(json.dumps(r, indent=2) if args.json else f"{r['requests_per_event']} requests per change\n{explain(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
