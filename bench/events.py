"""Event latency (issue 33 item 5): a committed change to its Server-Sent Event at many connected clients.

A real server (``workers=0``: no other writer) and ``clients`` event streams (``GET /api/goals/events``)
held open by one asyncio process with httpx, as a browser tab holds one each. The bench then commits
``changes`` changes through the REST API (``POST /sessions``, each one transaction with its event), one
every 50 ms, and every client records when each event's ``data:`` line arrived. Latency = arrival minus
the event's ``ts`` (taken in the committing transaction, same host clock). Every client must receive
every event committed after it connected (checked against the events table): ``missing`` counts those
it never got. The baseline is the same run with one client.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.common import Bench, percentile, ro, scalar, wait_health
from jupyter_goals.testing import write_script


async def _follow(http: httpx.AsyncClient, after: int, got: dict[int, float], ready: asyncio.Event,
                  connected: list[int]) -> None:
    async with http.stream("GET", "events", params={"after": after}) as r:
        r.raise_for_status()
        connected.append(1)
        ready.set()
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                now = time.time()
                ev = json.loads(line[5:])
                got[int(ev["seq"])] = now - float(ev["ts"])


async def _measure(url: str, token: str, clients: int, changes: int, after: int, cwd: str,
                   last_seq: Callable[[], int]) -> list[dict[int, float]]:
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    timeout = httpx.Timeout(60, read=None)
    async with httpx.AsyncClient(base_url=f"{url}api/goals/", headers={"Authorization": f"token {token}"},
                                 limits=limits, timeout=timeout) as http:
        got: list[dict[int, float]] = [{} for _ in range(clients)]
        connected: list[int] = []
        tasks = [asyncio.create_task(_follow(http, after, got[i], asyncio.Event(), connected)) for i in range(clients)]
        deadline = time.monotonic() + 60
        while len(connected) < clients:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(connected)} of {clients} event streams connected")
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # let each stream's first poll pass (its headers came first)
        async with httpx.AsyncClient(base_url=f"{url}api/goals/", headers={"Authorization": f"token {token}"},
                                     timeout=60) as writer:
            for i in range(changes):
                r = await writer.post("sessions", json={"title": f"event {i}", "cwd": cwd})
                r.raise_for_status()
                await asyncio.sleep(0.05)
        want = last_seq()
        for _ in range(600):  # at most 30 s for every client to have the newest event
            if all(max(g, default=0) >= want for g in got):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return got


def run(clients: int = 100, changes: int = 50) -> dict[str, Any]:
    with Bench("events") as b:
        server = b.server(write_script(b.base / "s.json", []), ["--GoalsApp.workers=0"]).start(wait=False)
        wait_health(server)
        db = ro(b.state)
        out: dict[str, Any] = {"clients": clients, "changes": changes}
        for label, n in (("one_client", 1), ("many_clients", clients)):
            after = int(scalar(db, "SELECT COALESCE(MAX(seq), 0) FROM events"))
            got = asyncio.run(_measure(server.url, server.token, n, changes, after, str(b.root),
                                       lambda: int(scalar(db, "SELECT MAX(seq) FROM events"))))
            committed = [int(r[0]) for r in db.execute("SELECT seq FROM events WHERE seq > ?", (after,))]
            lat = [v * 1000 for g in got for v in g.values()]
            missing = sum(1 for g in got for s in committed if s not in g)
            out[label] = {"clients": n, "events": len(committed), "p50_ms": round(percentile(lat, 0.5), 1),
                          "p99_ms": round(percentile(lat, 0.99), 1), "max_ms": round(max(lat, default=float("nan")), 1),
                          "missing": missing}
        db.close()
        server.kill()
    return out
