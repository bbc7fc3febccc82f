"""Turn attempts run inside the test process against a real control.db and the real Coordinator.

Shared by fast tests that need a turn to execute (approvals, permissions, unknown effects) without
starting a server process. Each step registers a worker under the identity of a process that has
already exited, so the next ``recover()`` confirms its death by identity exactly as after a kill -9;
``crash_after_spawn`` cancels a running attempt once its shell process exists (the worker "dies"
there, the detached tool process lives on).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from jupyter_goals.config import GoalsConfig
from jupyter_goals.goals import lifecycle
from jupyter_goals.host.effect_files import group_members, kill_shell
from jupyter_goals.identity import ProcessIdentity, boot_id, host_name
from jupyter_goals.models import Requirement
from jupyter_goals.recovery.coordinator import Coordinator, RecoveryReport
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.runtime.turn import TurnRunner
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Database, Row, Tx
from jupyter_goals.store.schema import migrate
from jupyter_goals.usage.prices import PriceTable


def exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


class Rig:
    def __init__(self, tmp_path: Path, rules: list[dict[str, Any]], trusted_tools: dict[str, Any] | None = None,
                 prices: PriceTable | None = None) -> None:
        self.prices = prices
        self.tool_env_allow: list[str] = []  # GoalsApp.tool_env_allow of the rig's "server"
        self.state = tmp_path / "state"
        self.root = tmp_path / "root"
        self.state.mkdir()
        self.root.mkdir()
        script = tmp_path / "script.json"
        script.write_text(json.dumps({"rules": rules, "default": {"text": "(no rule)"}}))
        self.model = f"scripted:{script}"
        url = f"sqlite:///{self.state / 'control.db'}"
        self.db = Database(url)
        migrate(self.db, "control")
        self.wdb = Database(url, inline=True)
        self.registry = ToolRegistry(trusted_tools)
        # the rig's "server" configuration: its Coordinator and each attempt it runs take it
        self.config = GoalsConfig(state_dir=self.state, control_db_url=url, default_model=self.model,
                                  recovery_backoff_s=0.0, provider_retry_base_s=0.05, trusted_tools=trusted_tools or {})
        self.coordinator = Coordinator(self.db, self.config, registry=self.registry, prices=prices)

    def close(self) -> None:
        self.db.close()
        self.wdb.close()

    def tx(self, fn: Any) -> Any:
        return self.db.transact(fn)

    def session(self, permissions: dict[str, Any]) -> str:
        row = self.tx(lambda tx: c.create_session(tx, "t", str(self.root), self.model, permissions))
        return str(row["session_id"])

    def send(self, sid: str, text: str) -> str:
        def run(tx: Tx) -> str:
            msg, _ = c.accept_message(tx, c.get_session(tx, sid), text, f"r{time.monotonic_ns()}", "queue",
                                      auto_recover=True, host=host_name())
            return str(msg["work_id"])

        return str(self.tx(run))

    async def recover(self) -> RecoveryReport:
        return await self.coordinator.recover()

    def _claim(self) -> Row | None:
        def run(tx: Tx) -> Row | None:
            wid = c.new_id("wkr")
            gen = c.register_worker(tx, wid, host_name(), boot_id(), exited_pid(), 1, 60.0)
            return c.claim_attempt(tx, wid, gen)

        return self.tx(run)  # type: ignore[no-any-return]

    def _runner(self, attempt: Row) -> TurnRunner:
        config = self.config.replace(tool_env_allow=self.tool_env_allow)  # as the test set it
        return TurnRunner(self.wdb, attempt, config, cwd=str(self.root), registry=self.registry, prices=self.prices)

    async def step(self) -> bool:
        """recover() (which admits), then run one admitted attempt to its end. False if none was admitted."""
        await self.recover()
        attempt = self._claim()
        if attempt is None:
            return False
        await self._runner(attempt).run()
        return True

    async def run_until_quiet(self, limit: int = 20) -> None:
        for _ in range(limit):
            if not await self.step():
                return
        raise AssertionError("work did not settle")

    async def crash_after_spawn(self, within_s: float = 20.0) -> Path:
        """Run the next attempt until its shell process is spawned, then let the worker die there."""
        await self.recover()
        attempt = self._claim()
        assert attempt is not None, "nothing was admitted"
        before = set((self.state / "effects").glob("*/proc.json")) if (self.state / "effects").exists() else set()
        task = asyncio.create_task(self._runner(attempt).run())
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            now = set((self.state / "effects").glob("*/proc.json")) if (self.state / "effects").exists() else set()
            if now - before:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return next(iter(now - before)).parent
            await asyncio.sleep(0.02)
        raise TimeoutError("no shell process was spawned")

    async def kill_command(self, effect_dir: Path, within_s: float = 10.0) -> None:
        """SIGKILL a call's shell process group and wait until none of it lives (the signal is delivered
        asynchronously: a recovery run at once may still see the command running and reattach to it)."""
        assert kill_shell(effect_dir), f"no live command in {effect_dir}"
        deadline = time.monotonic() + within_s
        while group_members(effect_dir):
            assert time.monotonic() < deadline, f"the command's process group in {effect_dir} did not end"
            await asyncio.sleep(0.02)

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        return self.db.transact(lambda tx: tx.all(sql, params), write=False)

    def work(self, work_id: str) -> Row:
        return self.db.transact(lambda tx: c.get_work(tx, work_id), write=False)

    def approvals(self, state: str | None = None) -> list[dict[str, Any]]:
        return self.db.transact(lambda tx: c.list_approvals(tx, state), write=False)  # type: ignore[no-any-return]

    def decide(self, approval_id: str, decision: str) -> Row:
        return self.tx(lambda tx: c.decide_approval(tx, approval_id, decision))  # type: ignore[no-any-return]

    def items(self, sid: str) -> list[Any]:
        return self.db.transact(lambda tx: c.transcript(tx, sid), write=False)  # type: ignore[no-any-return]


async def run_next_attempt(db: Database, state_dir: Path, model: str, cwd: str, *, within_s: float = 10.0,
                           registry: ToolRegistry | None = None) -> Row:
    """Wait until an attempt is admitted (e.g. by a server's Coordinator), claim it as a worker living in
    this process (alive, so no recovery tick fences it) and run it to its end."""
    me = ProcessIdentity.current()
    deadline = time.monotonic() + within_s

    def claim(tx: Tx) -> Row | None:
        if tx.one("SELECT attempt_id FROM attempts WHERE state = 'admitted' LIMIT 1") is None:
            return None
        wid = c.new_id("wkr")
        gen = c.register_worker(tx, wid, me.host_name, me.boot_id, me.pid, me.start_time, 60.0)
        return c.claim_attempt(tx, wid, gen)

    while (attempt := await db.run(claim)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError("no attempt was admitted")
        await asyncio.sleep(0.05)
    await TurnRunner(db, attempt, GoalsConfig(state_dir=state_dir, default_model=model), cwd=cwd,
                     registry=registry or ToolRegistry()).run()
    return attempt


# --------------------------------------------------------------------------- Goal helpers

BYPASS = {"mode": "bypass", "allow": []}


def call(name: str, text: str = "", **arguments: Any) -> dict[str, Any]:
    return {"text": text, "tool_calls": [{"name": name, "arguments": arguments}]}


def new_goal(rig: Rig, objective: str, requirements: list[dict[str, Any]] | None = None,
             permissions: dict[str, Any] | None = None) -> tuple[str, Row]:
    sid = rig.session(permissions or BYPASS)

    def run(tx: Tx) -> Row:
        reqs = [Requirement.model_validate(r) for r in requirements] if requirements is not None else None
        return lifecycle.create(tx, c.get_session(tx, sid), objective, reqs, {}, host=host_name(), auto_recover=True)

    return sid, rig.tx(run)


def goal(rig: Rig, goal_id: str) -> Row:
    return rig.db.transact(lambda tx: g.get_goal(tx, goal_id), write=False)  # type: ignore[no-any-return]


def acceptance(rig: Rig, goal_id: str) -> list[Row]:
    return rig.rows("SELECT * FROM acceptance_results WHERE goal_id = ? ORDER BY result_version", (goal_id,))
