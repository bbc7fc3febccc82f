"""Event push across processes (issue 33 item 5): a worker's commits, and on a PostgreSQL store another
host's, reach the open event streams through the wake-up channel ``events`` (``host/wake.py``), not a poll.

Every server runs with ``safety_tick_s`` 30 s: the event hub's only read without a wake-up is that tick, so
events that arrive within seconds were pushed by their commit.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import APPEND_RULES, ServerProcess, lines, new_session, stored_server_env, write_script
from tests.storekit import Backend, postgres_unreachable

pytestmark = pytest.mark.slow

NO_TICK = ["--GoalsApp.safety_tick_s=30", "--GoalsApp.reconcile_interval_s=60"]
STREAMS = 5


@pytest.fixture
def stored(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    with stored_server_env(tmp_path, APPEND_RULES, backend) as e:
        yield e


@pytest.fixture
def pg_store(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A control store and a ledger in private schemas of the real PostgreSQL (CI fails without it)."""
    if reason := postgres_unreachable():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}")
        pytest.skip(reason)
    backend = Backend("postgresql", tmp_path)
    try:
        yield backend.url("control"), backend.url("usage")
    finally:
        backend.cleanup()


def two_hosts(tmp_path: Path, store: tuple[str, str]) -> tuple[ServerProcess, ServerProcess, Path]:
    """Host A and host B (own host names and state dirs) on one PostgreSQL store, one shared folder."""
    control, usage = store
    root = tmp_path / "root"
    root.mkdir()
    model = write_script(tmp_path / "script.json", APPEND_RULES)
    args = [f"--GoalsApp.control_db_url={control}", f"--GoalsApp.usage_db_url={usage}", *NO_TICK]
    a, b = (ServerProcess(tmp_path / name / "state", root, model=model, extra=args,
                          env={"JUPYTER_GOALS_HOST_NAME": f"host-{name}"}) for name in ("a", "b"))
    for s in (a, b):
        s.state_dir.parent.mkdir(parents=True)
    return a, b, root


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}api/goals/{path}", json=body, timeout=30,
                      headers={"Authorization": f"token {server.token}"})


def last_seq(server: ServerProcess) -> int:
    r = httpx.get(f"{server.url}api/goals/events", params={"format": "json", "limit": 1, "after": 2**62},
                  headers={"Authorization": f"token {server.token}"}, timeout=10)
    r.raise_for_status()
    return int(r.json()["last_seq"])


def logged(server: ServerProcess, after: int) -> list[int]:
    seqs: list[int] = []
    while True:
        r = httpx.get(f"{server.url}api/goals/events", params={"format": "json", "limit": 500, "after": after},
                      headers={"Authorization": f"token {server.token}"}, timeout=10)
        r.raise_for_status()
        page = [int(e["seq"]) for e in r.json()["events"]]
        seqs += page
        if len(page) < 500:
            return seqs
        after = page[-1]


class Streams:
    """``n`` event streams of ``server`` from ``after``, each recording (seq, arrival - event ts)."""

    def __init__(self, server: ServerProcess, after: int, n: int) -> None:
        self.server, self.after = server, after
        self.got: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self.opened = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Streams:
        self.tasks = [asyncio.create_task(self._follow(g)) for g in self.got]
        deadline = time.monotonic() + 20
        while self.opened < len(self.got):
            assert time.monotonic() < deadline, "the event streams did not open"
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _follow(self, got: list[tuple[int, float]]) -> None:
        headers = {"Authorization": f"token {self.server.token}"}
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=None)) as client:
            async with client.stream("GET", f"{self.server.url}api/goals/events?after={self.after}") as resp:
                assert resp.status_code == 200
                self.opened += 1
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        ev = json.loads(line[6:])
                        got.append((int(ev["seq"]), time.time() - float(ev["ts"])))

    async def reach(self, seq: int, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while any(max((s for s, _ in g), default=0) < seq for g in self.got):
            assert time.monotonic() < deadline, f"seq {seq} did not reach every stream within {within_s} s"
            await asyncio.sleep(0.02)


def test_a_workers_commits_reach_every_stream_without_a_poll(stored: dict[str, Any]) -> None:
    """A chat run by a worker (a shell call: its plan, dispatch, result, answer, each a commit of the worker's)
    shows on every open stream within seconds although the hub's safety tick is 30 s; every stream gets every
    event of the log once, in order."""
    env = stored
    server = env["make"](NO_TICK).start()
    sid = new_session(server, env["root"])
    start = last_seq(server)

    async def run() -> tuple[list[int], Streams]:
        async with Streams(server, start, STREAMS) as streams:
            await asyncio.to_thread(server.client().send, sid, "please append a line", client_request_id="r1")
            snap = await asyncio.to_thread(server.client().wait, sid, timeout=60)
            assert snap["work"]["phase"] == "done"
            want = await asyncio.to_thread(logged, server, start)
            await streams.reach(want[-1], 5.0)
            return want, streams

    want, streams = asyncio.run(run())
    assert lines(env["out"]) == 1
    for g in streams.got:  # (a commit after the last read of the log may follow)
        assert [s for s, _ in g][: len(want)] == want
    worst = max(lat for g in streams.got for _, lat in g)
    assert worst < 5.0, worst


@pytest.mark.postgres
def test_another_hosts_commits_reach_this_hosts_streams_through_notify(tmp_path: Path, pg_store: tuple[str, str]) -> None:
    """Two hosts on one PostgreSQL store: sessions created on host A, and A's worker running a chat, show on
    the event streams open on host B within seconds (``NOTIFY jupyter_goals_events``), not at B's 30 s tick."""
    a, b, root = two_hosts(tmp_path, pg_store)
    try:
        a.start()
        b.start()
        start = last_seq(b)

        async def run() -> tuple[list[int], Streams]:
            async with Streams(b, start, STREAMS) as streams:
                r = await asyncio.to_thread(post, a, "sessions", {"title": "on a", "cwd": str(root),
                                                                       "permissions": {"mode": "bypass"}})
                assert r.status_code == 201, r.text
                sid = r.json()["session_id"]
                await streams.reach(max(await asyncio.to_thread(logged, a, start)), 5.0)
                await asyncio.to_thread(a.client().send, sid, "please append a line", client_request_id="r1")
                snap = await asyncio.to_thread(a.client().wait, sid, timeout=60)
                assert snap["work"]["phase"] == "done"
                want = await asyncio.to_thread(logged, a, start)
                await streams.reach(want[-1], 5.0)
                return want, streams

        want, streams = asyncio.run(run())
        for g in streams.got:
            assert [s for s, _ in g][: len(want)] == want
    finally:
        a.kill()
        b.kill()
