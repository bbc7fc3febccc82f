"""``AsyncGoalsClient`` (DESIGN §12: the Workflow API, sync and async) against a real server process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jupyter_goals import AsyncGoalsClient, GoalsError
from tests.servers import ServerProcess, write_script

pytestmark = pytest.mark.slow

RULES = [{"when": {"last_user_contains": "hello"}, "respond": {"text": "Hi there.", "delay_s": 1.0}}]


async def test_async_client_drives_a_chat_without_blocking_the_event_loop(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    server = ServerProcess(tmp_path / "state", root, model=write_script(tmp_path / "s.json", RULES))
    server.start()
    try:
        async with AsyncGoalsClient(server.url, server.token) as client:
            created = await client.create_session(title="async", cwd=str(root))
            sid = created["session"]["session_id"]
            await client.send(sid, "hello", client_request_id="a1")
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.05)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            snap = await client.wait(sid, timeout=30)
            ticker.cancel()
            assert snap["work"]["phase"] == "done"
            assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"] == ["Hi there."]
            assert ticks >= 10  # the loop kept running while the answer (1 s) was awaited
            with pytest.raises(GoalsError) as missing:
                await client.session("ses_missing")
            assert missing.value.status == 404 and missing.value.error
    finally:
        server.kill()
