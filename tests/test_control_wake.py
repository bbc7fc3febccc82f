"""A Stop reaches the worker running the command by a wake-up, not by its safety tick (host/wake.py
``CONTROLS``): the server that commits a control notifies its workers (a datagram on this host) and, on a
shared PostgreSQL store, every other host's (``NOTIFY``). Both tests set ``safety_tick_s`` to 30 s, so the
only way the command can be gone within 2 s of the Stop is the wake-up; a running call's watch otherwise
reads the store once per safety tick, not five times a second."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.host.effect_files import group_members
from tests.hostkit import Hosts, one_step_rules
from tests.servers import ServerFactory, ServerProcess, db_rows, wait_for

pytestmark = pytest.mark.slow

SLOW_TICK = ["--GoalsApp.safety_tick_s=30"]


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}api/goals/{path}", json=body, headers={"Authorization": f"token {server.token}"},
                      timeout=30)


def running_command(rows: list[dict[str, Any]], state_dir: Path) -> Path | None:
    for r in rows:
        effect_dir = state_dir / "effects" / r["effect_id"]
        if group_members(effect_dir):
            return effect_dir
    return None


def stop_and_time(server: ServerProcess, sid: str, effect_dir: Path) -> float:
    stopped_at = time.monotonic()
    assert post(server, f"sessions/{sid}/actions", {"action": "stop"}).status_code == 200
    wait_for(lambda: not group_members(effect_dir), timeout=5, what="the command gone after the Stop")
    return time.monotonic() - stopped_at


def test_a_stop_wakes_the_running_call_on_this_host_without_waiting_for_the_safety_tick(tmp_path: Path) -> None:
    factory = ServerFactory(tmp_path, rules=one_step_rules())
    try:
        server = factory.make(extra=SLOW_TICK).start()
        cl = server.client()
        sid = str(cl.create_session(title="stop", cwd=str(factory.root), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "work", client_request_id="w")
        sql = "SELECT effect_id FROM effects WHERE state = 'dispatched' AND tool = 'shell'"
        wait_for(lambda: running_command(db_rows(factory.state, sql), factory.state) is not None, timeout=60,
                 what="the command running")
        effect_dir = running_command(db_rows(factory.state, sql), factory.state)
        assert effect_dir is not None
        assert stop_and_time(server, sid, effect_dir) < 2.0
        assert cl.wait(sid, phases=("cancelled",), timeout=30)["work"]["phase"] == "cancelled"
        assert not (factory.root / "once.txt").exists()
    finally:
        factory.close()


@pytest.mark.postgres
def test_a_stop_on_another_host_wakes_the_running_call_by_notify(tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    hosts = Hosts(tmp_path, hosts_store, one_step_rules(), extra=SLOW_TICK)
    try:
        a, b = hosts.a.start(), hosts.b.start()
        sid = str(a.client().create_session(title="stop", cwd=str(hosts.root),
                                            permissions={"mode": "bypass"})["session"]["session_id"])
        a.client().send(sid, "work", client_request_id="w")
        sql = "SELECT effect_id FROM effects WHERE state = 'dispatched' AND tool = 'shell'"
        wait_for(lambda: running_command(hosts.rows(sql), a.state_dir) is not None, timeout=60,
                 what="the command running on A")
        effect_dir = running_command(hosts.rows(sql), a.state_dir)
        assert effect_dir is not None
        assert stop_and_time(b, sid, effect_dir) < 2.0  # committed on B, A's worker woken by NOTIFY
        assert b.client().wait(sid, phases=("cancelled",), timeout=30)["work"]["phase"] == "cancelled"
        assert not (hosts.root / "once.txt").exists()
    finally:
        hosts.close()

