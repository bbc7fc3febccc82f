"""Recovery at scale (issue 33 item 3): ``n`` work items with run intent ``run`` when the server died by kill -9.

The state a killed server leaves is seeded through the real store functions (as ``jupyter_goals/testing/seed.py``
does, on SQLite or the local PostgreSQL): two worker rows of this host and boot whose process is gone
(a pid that exited, with a start time no process has), and per item its own chat session in ``ask``
mode, its work item admitted and claimed by one of them; half the items had their model ask for a shell
command and wait on its ``pending`` approval (attempt ended ``awaiting_approval``, phase ``waiting``), half
are mid-turn (attempt ``running``). Then a real ``jupyter server`` starts on it with the product's
timings, two workers and ``max_concurrent_turns`` 16.

Measured from durable rows: the recovery pass begins with the deaths it confirms (``workers.ended_at``
of the dead workers) and ends when it records its summary (``server_state['recovery.last_pass']``,
written after every item was decided: admitted, or waiting/queued with its reason). ``recovery_s`` is
that span; ``from_process_start_s`` adds the start of Python, Jupyter Server and the migration check.
The baseline is the same server started on an empty state dir (process start to health).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from bench.common import Bench, control_reader, pg_schemas, wait_health, wait_until
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import ItemKind, Phase, ReasonCode
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.store.schema import migrate
from jupyter_goals.testing import write_script

BATCH = 500  # items per seeding transaction
SERVER = ["--GoalsApp.workers=2", "--GoalsApp.max_concurrent_turns=16", "--GoalsApp.heartbeat_s=2.0",
          "--GoalsApp.lease_ttl_s=10", "--GoalsApp.reconcile_interval_s=5", "--GoalsApp.recovery_backoff_s=1"]


def gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def seed_interrupted(db: Database, n: int, cwd: str, model: str) -> None:
    """``n`` interrupted items as a kill -9 leaves them (see the module docstring)."""
    shell = ToolRegistry().tools["shell"]
    pid = gone_pid()
    workers = db.transact(lambda tx: [(f"wkr_dead{j}", c.register_worker(tx, f"wkr_dead{j}", host_name(), boot_id(), pid,
                                                                        1, 3600.0)) for j in range(2)])

    def one(tx: Tx, i: int) -> None:
        s = c.create_session(tx, f"interrupted {i}", cwd, model, {"mode": "ask", "allow": []})
        w = c.create_work(tx, s, "chat", {"text": f"task {i}"}, auto_recover=True, host=host_name())
        c.admit(tx, c.get_work(tx, w["work_id"]), mode="fresh", turn_id=None)
        wid, gen = workers[i % 2]
        a = c.claim_attempt(tx, wid, gen)
        assert a is not None and a["work_id"] == w["work_id"]
        if i % 2:
            return  # mid-turn: its model request was out when the server died
        call_id, args = f"call_{i}", {"command": "echo hello"}
        seq = c.append_item(tx, s["session_id"], ItemKind.TOOL_CALL, "assistant", "", item_id=f"call:{call_id}",
                            work_id=w["work_id"], turn_id=a["turn_id"], call_id=call_id, tool="shell", arguments=args)
        assert seq is not None
        work = c.get_work(tx, w["work_id"])
        c.plan_call(tx, work, a["turn_id"], call_id, "shell", args, capability=str(shell.capability),
                    impl_identity=shell.identity, impl_digest=shell.digest, seq=seq)
        [eff] = [e for e in c.open_effects_of_turn(tx, a["turn_id"]) if e["call_id"] == call_id]
        c.request_approval(tx, work, eff, [], "shell runs a command")
        c.end_attempt(tx, a, "awaiting_approval")
        c.set_phase(tx, c.get_work(tx, w["work_id"]), Phase.WAITING, ReasonCode.AWAITING_APPROVAL)

    for first in range(0, n, BATCH):
        def batch(tx: Tx, first: int = first) -> None:
            for i in range(first, min(n, first + BATCH)):
                one(tx, i)

        db.transact(batch)


def _run(n: int, control_url: str | None, usage_url: str | None) -> dict[str, Any]:
    with Bench(f"recovery{n}") as b:
        model = write_script(b.base / "ask.json", [], {"text": "Running it.", "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo hello"}}]})
        b.state.mkdir(parents=True)
        db = Database(control_url or f"sqlite:///{b.state / 'control.db'}")
        migrate(db, "control")
        t0 = time.monotonic()
        seed_interrupted(db, n, str(b.root), model)
        seeded_s = time.monotonic() - t0
        db.close()
        extra = list(SERVER)
        if control_url:
            extra += [f"--GoalsApp.control_db_url={control_url}", f"--GoalsApp.usage_db_url={usage_url}"]
        q = control_reader(b.state, control_url)
        spawned = time.time()
        server = b.server(model, extra, fast=False).start(wait=False)
        healthy = wait_health(server, timeout=600)
        wait_until(lambda: q("SELECT COUNT(*) FROM server_state WHERE key = 'recovery.last_pass'")[0][0], 600,
                   "the recovery pass", every=0.05)
        header = json.loads(q("SELECT value FROM server_state WHERE key = 'recovery.last_pass'")[0][0])
        began = float(q("SELECT MIN(ended_at) FROM workers WHERE worker_id LIKE 'wkr_dead%'")[0][0])
        reported = q(f"SELECT phase, reason_code, COUNT(*) FROM recovery_decisions WHERE claimed_by = '{header['pass_id']}'"
                     " GROUP BY phase, reason_code")
        server.kill()
    decided = sum(int(r[2]) for r in reported)
    return {"items": n, "store": "postgresql" if control_url else "sqlite", "seed_s": round(seeded_s, 1),
            "recovery_s": round(header["at"] - began, 3), "from_process_start_s": round(header["at"] - spawned, 3),
            "health_after_process_start_s": round(healthy - spawned, 3), "decided": decided,
            "outcomes": {f"{r[0]}/{r[1]}": int(r[2]) for r in reported}}


def empty_start() -> dict[str, Any]:
    """The baseline: the same server on an empty state dir, process start to health."""
    with Bench("empty") as b:
        spawned = time.time()
        server = b.server(write_script(b.base / "s.json", []), list(SERVER), fast=False).start(wait=False)
        healthy = wait_health(server)
        server.kill()
    return {"health_after_process_start_s": round(healthy - spawned, 3)}


def sqlite(n: int) -> dict[str, Any]:
    return _run(n, None, None)


def postgres(n: int) -> dict[str, Any]:
    with pg_schemas("control", "usage") as urls:
        return _run(n, urls["control"], urls["usage"])
