"""Event push, in process (issue 33 item 5): a commit reaches every open event stream at once, through one
read of the log for all of them (``server/event_hub.py``), with no poll interval.

The server runs with ``safety_tick_s`` 30 s, so an event that arrives within seconds was pushed by its
commit: the hub's only other read is that tick.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from jupyter_server.serverapp import ServerApp

from jupyter_goals.server.answers import EventPage
from tests import restkit
from tests.restkit import Api, Json

jp_asyncio_loop = restkit.jp_asyncio_loop
goals_state_dir = restkit.goals_state_dir
api = restkit.api
raw_url = restkit.raw_url

STREAMS = 20
COMMITS = 5


@pytest.fixture
def jp_server_config(goals_state_dir: Path) -> Json:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_goals": True}, "reraise_server_extension_failures": True},
        "GoalsApp": {"workers": 0, "safety_tick_s": 30.0},
    }


async def follow(url: str, headers: dict[str, str], got: list[tuple[int, float]], opened: asyncio.Event) -> None:
    """Record (seq, arrival - event ts) of every event a stream sends, until cancelled."""
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=None)) as client:
        async with client.stream("GET", url) as resp:
            assert resp.status_code == 200
            opened.set()
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    ev = json.loads(line[6:])
                    got.append((int(ev["seq"]), time.time() - float(ev["ts"])))


async def test_every_stream_gets_every_commit_at_once_from_one_read_per_wake(
    api: Api, raw_url: Any, jp_auth_header: dict[str, str], jp_serverapp: ServerApp
) -> None:
    service = jp_serverapp.web_app.settings["jupyter_goals_service"]
    queries = service.queries
    reads: list[int] = []
    original = queries.events

    async def counted(after: int, limit: int) -> EventPage:
        reads.append(after)
        return await original(after, limit)

    queries.events = counted
    start = (await api.events())["last_seq"]
    got: list[list[tuple[int, float]]] = [[] for _ in range(STREAMS)]
    opened = [asyncio.Event() for _ in range(STREAMS)]

    streams = [asyncio.create_task(follow(raw_url(f"events?after={start}"), jp_auth_header, got[i], opened[i]))
               for i in range(STREAMS)]
    try:
        await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 15)
        for _ in range(200):  # every stream has joined the hub (health counts open streams)
            if (await api.ok("GET", "health"))["event_streams"] == STREAMS:
                break
            await asyncio.sleep(0.02)
        before = len(reads)
        for i in range(COMMITS):
            await api.new_session(title=f"pushed {i}")
        page = await original(start, 500)
        committed = [e.seq for e in page.events]
        deadline = time.monotonic() + 10  # far below the 30 s safety tick
        while any(max((s for s, _ in g), default=0) < committed[-1] for g in got):
            assert time.monotonic() < deadline, "an event was not pushed to every stream"
            await asyncio.sleep(0.02)
    finally:
        for t in streams:
            t.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    for g in got:
        assert [s for s, _ in g] == committed  # every event, in order, once
    latencies = sorted(lat for g in got for _, lat in g)
    assert latencies[-1] < 5.0, latencies[-5:]
    # one read of the log per wake-up for all the streams, not one per stream
    pushed_reads = len(reads) - before
    assert pushed_reads <= 3 * COMMITS, (pushed_reads, STREAMS * COMMITS)
    assert service.event_hub.reads >= 1


async def test_a_stream_behind_the_hub_catches_up_from_the_log_then_follows(
    api: Api, raw_url: Any, jp_auth_header: dict[str, str], jp_serverapp: ServerApp
) -> None:
    """A stream opened from an old seq reads its own pages up to the hub's window, then gets the pushed
    events: nothing skipped, nothing twice."""
    first = (await api.events())["last_seq"]
    for i in range(3):
        await api.new_session(title=f"before {i}")
    live: list[tuple[int, float]] = []
    opened = asyncio.Event()
    follower = asyncio.create_task(follow(raw_url("events"), jp_auth_header, live, opened))  # hub starts here
    await asyncio.wait_for(opened.wait(), 15)
    late: list[tuple[int, float]] = []
    late_opened = asyncio.Event()
    late_task = asyncio.create_task(follow(raw_url("events"), {**jp_auth_header, "Last-Event-ID": str(first)}, late,
                                           late_opened))
    try:
        await asyncio.wait_for(late_opened.wait(), 15)
        for i in range(3):
            await api.new_session(title=f"after {i}")
        want = [e["seq"] for e in (await api.events(first))["events"]]
        deadline = time.monotonic() + 10
        while max((s for s, _ in late), default=0) < want[-1] or max((s for s, _ in live), default=0) < want[-1]:
            assert time.monotonic() < deadline, (late, want)
            await asyncio.sleep(0.02)
    finally:
        for t in (follower, late_task):
            t.cancel()
        await asyncio.gather(follower, late_task, return_exceptions=True)
    assert [s for s, _ in late] == want
    everything = [e["seq"] for e in (await api.events(0))["events"]]
    assert [s for s, _ in live] == everything[: len(live)]
