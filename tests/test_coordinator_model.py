"""A model-based test of the Coordinator (issue 16, item 5): random interleavings, invariants after every step.

A hypothesis ``RuleBasedStateMachine`` drives, in this process and on a real SQLite file (a copy of one
file migrated by the real migrations), the real ``Coordinator`` (``recover()`` and ``admit()``), the real
``TurnRunner`` of worker attempts with the scripted provider, and the store functions behind the REST
routes (messages with their ``client_request_id``, pause / resume / stop / retry / stop_all, approve /
deny). Nothing of our storage is mocked.

How processes are played without processes:
- Every attempt a worker claims runs in a thread of its own; each interruption point it reaches
  (``faults.crash_point``: ``provider.*``, ``tool.*``) and the test tool's side effect hand control back
  to the state machine, so other rules run between any two steps of any attempt. Only one thread runs
  at a time: the histories are deterministic.
- The server's own points are played where its handlers commit: ``input.before_accept`` /
  ``input.after_accept`` around a message's commit (then the client retries with the same
  ``client_request_id``) and ``control.after_stop_commit`` after a Stop.
- A worker process and a server process are stood for by real ``sleep`` processes: the worker row is
  registered with one's ``(pid, start time)``, and the Coordinator's recovery claims carry the other's.
  A crash kills that process (the Coordinator confirms the death by identity, as after ``kill -9``) and
  abandons each of its attempts at the point it had reached (``Crash`` raised there: nothing after the
  point runs, as with ``os._exit``). A server crash (also at ``recovery.after_claim`` /
  ``recovery.after_decision``) takes its workers with it (``PR_SET_PDEATHSIG``); the new server's
  Coordinator runs ``recover()`` at start, sometimes after a new boot id (a machine restart).
- The test tool ``mark`` (capability ``unknown``, registered by implementation identity) appends its
  effect id to ``effects.log`` in the session's folder, so every execution is counted on disk.
- Histories start with up to three requests and sometimes a prefix played by the same machinery (a write
  waiting for its approval, that approval given, or a write whose worker died after it began), so that
  six random steps reach approvals, unknown outcomes and restricted turns often.

Invariants, after every step: at most one live attempt per work item (and per session, within the
quota); no effect executed twice, and an effect whose outcome became unknown never again dispatched or
executed; an approval consumed at most once, only after the person approved it, and every execution
that needed an approval consumed one; paused or stopped work never admitted nor starting a model
request or a tool call; no accepted message lost; every unfinished ``run`` item queued, working,
recovering, or waiting / failed with its reason code, and after a full Coordinator pass admitted or
held back by the quota or its session's running item.

The same model runs on the real PostgreSQL server (the shared store: ``FOR UPDATE`` / ``FOR SHARE``
instead of SQLite's one writer, counter rows for the logs' seqs), 150 histories, each on a schema
emptied and filled from a template schema's rows.

Goals: the last session holds them (``POST /goals`` as ``set_goal``, refused while one has not ended);
their attempts go through the same points plus ``goal.todo_complete_before_acceptance`` and
``goal.after_completion_commit``, with an acceptance review by the scripted model. Checked besides: a
Goal that ended stays ended with exactly one terminal record; an achieved Goal's work is done.

Subtasks: a chat that says "delegate" starts one with ``spawn_subtask`` (a state tool that creates
work) and waits without model turns; the child (its own session) makes a mark and answers; its result is
delivered to the parent through ``child.before_delivery`` / ``child.after_delivery``. Checked besides:
no parent model turn while it waits, at most one delivered result per subtask started, and a stopped
parent's subtasks stopped or finished.

The usage ledger: the server's outbox loop (``ledger``) applies control.db's operations to usage.db (a
second SQLite file, or schema), sometimes dying at ``usage.before_persist`` / ``usage.after_persist``.
Checked besides: each provider answer counted at most once, with the tokens control.db recorded for
it; every operation marked done is in usage.db; a lost request (usage unknown) has no receipt; a pass
nothing kills leaves nothing due.

Permission changes (``permissions``: ask, ask with the test tool allowed, bypass) on a busy session:
the approval check takes the scope each call's work item had when it was dispatched.

A graceful server stop (``shutdown``) closes admission and sometimes dies at
``shutdown.after_admission_stop``; otherwise the worker's attempts get a few more points, the rest are
cancelled where they are and handed back (``recovery.hand_back``, the worker's SIGTERM path), the
ledger flushes and a new server recovers. Checked besides: no request stays out for an attempt that
ended (its usage is lost, never left pending).

Detached shell commands: "run" makes the model call the real ``shell`` tool with a real command (its own
process group, its files in the effect dir) that counts its execution in effects.log, then runs until the
state machine ends it (``command_ends``), a stop kills it or the machine goes (a machine restart kills every
command). While it runs, the attempt's thread hands control back at ``tool.process_runs`` each time the
shell tool, a reconnected attempt or the watch for a stop would sleep, so a Stop, a crash of the worker
or of the server, a graceful stop or a restart can come at any moment of a command's life; the worker
may die at ``tool.after_dispatch`` and at ``tool.before_cancel_kill`` (its watch saw the stop), and the
server at ``tool.before_cancel_kill`` in the Coordinator's sweep of condemned commands nobody owns. A
command that outlived its worker is reconnected by the next attempt, never started again. Checked
besides: a command that still runs is never ``cancelled`` nor ``unknown``, and after a full Coordinator
pass no command of stopped work (or cancelled by a person) runs without a live attempt watching it. Between steps the test does what
the kernel and init would meanwhile: it waits until a started command has counted itself, and reaps
ended commands (the test process is their parent; a real worker's death leaves them to init).

Deterministic replays: hypothesis replays a history by its choices, and a history that goes otherwise the
second time fails as flaky. So no rule has a precondition (a rule with nothing to do does nothing), a
signal sent to a command's process group returns once the group is gone (``ModelOs``) and ``to_thread``
runs at once (``ModelAsyncio``): no step sees a command half way through dying, and which points an
attempt passes never depends on how fast a process or an executor thread was.

A person may also cancel one command (``cancel_command``, the ``cancel_tool`` action).

Not covered here: the REST handlers and ``GoalsService`` (the test commits what their transactions
commit, through the same store functions), late receipts
of commands whose outcome became unknown (a machine restart kills them here), Jobs and durable waits other
than a subtask's, and several attempts sharing one event loop (each runs on its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from jupyter_goals import faults as faults_module
from jupyter_goals.config import GoalsConfig
from jupyter_goals.goals import acceptance as acceptance_module
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.host import effect_files
from jupyter_goals.host.effect_files import group_members, shell_process
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.identity import boot_id, host_name, process_start_time
from jupyter_goals.models import TERMINAL_GOAL_STATES, ReasonCode, Requirement
from jupyter_goals.recovery import coordinator as coordinator_module
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.recovery.facts import load_facts
from jupyter_goals.runtime import calls as calls_module
from jupyter_goals.runtime import tools as tools_module
from jupyter_goals.runtime import turn as turn_module
from jupyter_goals.runtime.tools import ToolContext, ToolRegistry, ToolResult
from jupyter_goals.runtime.turn import HistoryCache, TurnRunner
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery as recovery_store
from jupyter_goals.store.db import Database, NotFound, Row, Tx, VersionConflict
from jupyter_goals.store.schema import migrate
from jupyter_goals.usage import ledger as outbox_module
from jupyter_goals.usage.prices import load_price_table
from tests.storekit import Backend, postgres_unreachable

HISTORIES = int(os.environ.get("JG_MODEL_HISTORIES", "2000"))
HISTORIES_PG = int(os.environ.get("JG_MODEL_HISTORIES_PG", "150"))  # each commit a real fsync on the server
STEPS = 6
MAX_CONCURRENT = 2
MAX_RECOVERIES = 3
# write: one call to the test tool; "write again": after an unknown outcome the model tries the write
# again as a new call (which then needs a fresh approval bound to the unknown set)
IDLE_TURN = "IDLE TURN WHILE A SUBTASK RUNS"
# the detached shell command of "run": it counts its execution in effects.log (as ``mark`` does), says it has
# started, then runs until the state machine ends it (``command_ends``), a stop kills it or the machine goes
COMMAND = ('echo "$JG_TOOL_EFFECT" >> effects.log; : > "$JG_DIR/started"; '
           'while [ ! -e "$JG_DIR/release" ]; do sleep 0.02; done; echo ran')
GOAL = "Produce marks"  # the objective of the Goals set in the model's last session
COMPLETED = 100  # a Goal prefix that stops at goal.after_completion_commit
RULES: list[dict[str, Any]] = [
    # a Goal: independent acceptance judges its one requirement met; its turns make a mark, then submit
    {"when": {"purpose": "acceptance", "goal_objective_contains": GOAL},
     "respond": {"verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": "a mark was made"}],
                 "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"goal_objective_contains": GOAL, "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "Submitted.", "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"goal_objective_contains": GOAL, "last_tool_result_contains": "marked"},
     "respond": {"tool_calls": [{"name": "update_goal", "arguments": {"candidate": True}}],
                 "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"goal_objective_contains": GOAL},
     "respond": {"text": "Marking.", "tool_calls": [{"name": "mark", "arguments": {"goal": True}}],
                 "usage": {"input_tokens": 2, "output_tokens": 1}}},
    # a subtask: the parent delegates and waits without model turns; the child makes a mark and answers;
    # the parent continues once the child's result is delivered
    {"when": {"last_user_contains": "child marked"},
     "respond": {"text": "Parent done.", "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"last_user_contains": "mark for the parent", "last_tool_result_contains": "marked"},
     "respond": {"text": "child marked", "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"last_user_contains": "mark for the parent"},
     "respond": {"text": "Child marking.", "tool_calls": [{"name": "mark", "arguments": {"child": True}}],
                 "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"last_user_contains": "delegate", "last_tool_result_contains": "started subtask"},
     "respond": {"text": IDLE_TURN}},  # a model turn while the subtask runs: must never happen
    {"when": {"last_user_contains": "delegate"},
     "respond": {"text": "Delegating.", "tool_calls": [{"name": "spawn_subtask",
                                                        "arguments": {"task": "mark for the parent"}}],
                 "usage": {"input_tokens": 2, "output_tokens": 1}}},
    {"when": {"last_user_contains": "again", "tool_result_unknown": True},
     "respond": {"text": "Trying again.", "tool_calls": [{"name": "mark", "arguments": {"again": True}}],
                 "usage": {"input_tokens": 3, "output_tokens": 2}}},
    {"when": {"last_tool_result_contains": ""},
     "respond": {"text": "Done.", "usage": {"input_tokens": 3, "output_tokens": 1}}},
    {"when": {"last_user_contains": "run"},
     "respond": {"text": "Running.", "tool_calls": [{"name": "shell", "arguments": {"command": COMMAND}}],
                 "usage": {"input_tokens": 2, "output_tokens": 2}}},
    {"when": {"last_user_contains": "write"},
     "respond": {"text": "Writing.", "tool_calls": [{"name": "mark", "arguments": {}}],
                 "usage": {"input_tokens": 2, "output_tokens": 2}}},
]
TEXTS = ["chat", "write", "write again", "delegate", "run"]
SESSIONS = [{"mode": "ask"}, {"mode": "bypass"}, {"mode": "bypass"}, {"mode": "bypass"}]
CHATS = len(SESSIONS) - 1  # messages go to the first three; the last one holds the Goals (controls reach all)
REDACTOR = Redactor({})
PRICES = load_price_table(None)  # the shipped table (the scripted model has no price: costs unknown)


class Crash(BaseException):
    """The process died at this point (``os._exit`` in the product): nothing after it runs."""


# --------------------------------------------------------------------------- attempts as stepped threads

_local = threading.local()
_coordinator_crash: dict[str, str | None] = {"at": None}
_passes_left = [0]  # how many times the point is passed before the crash there


def interruption_point(point: str) -> None:
    """Replaces ``crash_point`` in the turn loop and the Coordinator: an attempt's thread hands control
    back to the state machine here (which continues it or lets it die here); the Coordinator dies at
    the point the rule chose."""
    handoff: AttemptThread | None = getattr(_local, "handoff", None)
    if handoff is not None:
        handoff.pause(point)
    elif _coordinator_crash["at"] == point and _passes_left[0] > 0:
        _passes_left[0] -= 1
    elif _coordinator_crash["at"] == point:
        _coordinator_crash["at"] = None
        raise Crash(point)


async def mark(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """The test tool: a side effect counted on disk, one line per execution."""
    interruption_point("tool.side_effect")  # after the ``dispatched`` commit, before the effect happens
    # each attempt runs in a thread of its own: a one-line append needs no executor hop
    with open(Path(ctx.cwd) / "effects.log", "a", encoding="utf-8") as f:  # noqa: ASYNC230
        f.write(ctx.effect_id + "\n")
    return ToolResult("marked")


class AttemptThread:
    """One claimed attempt, run by the real TurnRunner in a thread that pauses at each point."""

    def __init__(self, runner: TurnRunner, attempt: Row, worker: str) -> None:
        self.attempt = attempt
        self.worker = worker
        self.point = "start"
        self.done = False
        self.error: BaseException | None = None
        self._crash = False
        self._go = threading.Semaphore(0)
        self._arrived = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._main, args=(runner,), daemon=True)

    def _main(self, runner: TurnRunner) -> None:
        _local.handoff = self
        try:
            asyncio.run(self._run(runner))
        except Crash:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by the state machine
            self.error = exc
        finally:
            self.done = True
            self._arrived.release()

    @staticmethod
    async def _run(runner: TurnRunner) -> None:
        def ignore_crashes(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            # a Crash raised in one task of several (the shell call, the watch for its stop) while the
            # other was ended by it: nothing of a dead process is left to report
            if not isinstance(context.get("exception"), Crash):
                loop.default_exception_handler(context)

        asyncio.get_running_loop().set_exception_handler(ignore_crashes)
        await runner.run()

    def pause(self, point: str) -> None:  # in the attempt's thread
        if self._crash:  # dead already: the Crash was raised in one task of several (a shell call and the
            raise Crash(point)  # watch for its stop); whatever the others reach next, nothing runs on
        self.point = point
        self._arrived.release()
        self._go.acquire()
        if self._crash:
            raise Crash(point)

    def start(self) -> None:
        self._thread.start()
        self._arrived.acquire()

    def advance(self) -> None:
        assert not self.done
        settle()
        self._go.release()
        self._arrived.acquire()

    def crash(self) -> None:
        if not self.done:
            self._crash = True
            self._go.release()
            self._arrived.acquire()
        self._thread.join()


def go_on(t: AttemptThread, hops: int | None = None) -> None:
    """Let an attempt go through ``hops`` more interruption points, or to its end (None: a shell command it
    waits for ends by itself)."""
    n = 0
    while not t.done and (hops is None or n < hops):
        if hops is None and t.point == "tool.process_runs":
            end_commands()
        t.advance()
        assert t.error is None, t.error
        n += 1


# --------------------------------------------------------------------------- stand-in processes


class Sleepers:
    """Real processes whose identity stands for a worker or a server; killing one is that process's death."""

    def __init__(self) -> None:
        self.pool: list[subprocess.Popen[bytes]] = []

    def take(self) -> subprocess.Popen[bytes]:
        return self.pool.pop() if self.pool else subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL,
                                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def give_back(self, proc: subprocess.Popen[bytes]) -> None:
        self.pool.append(proc)

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        proc.wait()

    def close(self) -> None:
        for p in self.pool:
            self.kill(p)
        self.pool.clear()


SLEEPERS = Sleepers()
COVERED: Counter[str] = Counter()  # what the histories did: rules run, crash points, outcomes seen


def identity(proc: subprocess.Popen[bytes]) -> tuple[str, str, int, int | None]:
    return host_name(), boot_id(), proc.pid, process_start_time(proc.pid)


# --------------------------------------------------------------------------- detached shell commands


class ModelAsyncio:
    """``asyncio`` as the turn loop, the shell tool and ``effect_files`` see it in the model: a ``sleep`` in
    an attempt's thread is time passing while a detached command runs (the shell tool's wait for its
    child, a reconnected attempt's wait for a foreign process, the watch for a stop or a cancel), so the
    thread hands control back at ``tool.process_runs`` and the state machine decides what happens
    meanwhile (the command ends, a Stop, a crash...). ``cancel_shell``'s grace loop and everything outside
    an attempt's thread (the Coordinator's sweep) sleep for real; the grace loop finds the group gone at
    once (``ModelOs``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay: float, result: Any = None) -> Any:
        handoff: AttemptThread | None = getattr(_local, "handoff", None)
        if handoff is None or sys._getframe(1).f_code.co_name == "cancel_shell":
            return await asyncio.sleep(delay, result)
        handoff.pause("tool.process_runs")
        return await asyncio.sleep(0, result)

    @staticmethod
    async def to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run at once, in the calling thread: an executor's thread would finish at a moment of its own, so
        how many times the attempt's other task (the shell tool's wait) hands control back before the
        result is used would depend on timing, and hypothesis replays histories by their choices."""
        return func(*args, **kwargs)


class ModelOs:
    """``os`` as ``cancel_shell`` sees it in the model: a signal sent to a command's process group returns
    once every process of the group is gone (a shell and its ``sleep`` end within milliseconds of a
    SIGTERM), so no step ever sees a group half way through dying: whether a command still runs when the
    state machine looks never depends on timing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def killpg(pgid: int, sig: int) -> None:
        os.killpg(pgid, sig)
        deadline = time.monotonic() + 5
        while effect_files.live_in_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.001)


def commands() -> list[Path]:
    """The effect dirs of the shell commands this history spawned (their identity on disk)."""
    assert ENV is not None
    root = ENV.state / "effects"
    return [d for d in sorted(root.iterdir()) if (d / "proc.json").exists()] if root.exists() else []


def _leader(d: Path) -> tuple[int, str | None]:
    """The command's shell (its process group's leader): pid and state letter (None once reaped or when
    the pid now belongs to another process)."""
    proc = shell_process(d)
    assert proc is not None
    pid = int(proc["pid"])
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return pid, None
    if process_start_time(pid) != proc.get("start_time"):
        return pid, None
    return pid, raw[raw.rindex(")") + 2]


def alive(d: Path) -> bool:
    return _leader(d)[1] not in (None, "Z")


def reap(d: Path) -> None:
    """What init does for a command whose worker died: the test process is every command's parent, and its
    zombies would look alive to ``shell_alive`` (a real worker's death hands them to init, which reaps them)."""
    pid, state = _leader(d)
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # the shell tool's own Popen.poll() reaped it


def wait_gone(d: Path) -> None:
    """Until the command's whole process group is gone (durable evidence: /proc), then reap it."""
    deadline = time.monotonic() + 10
    while group_members(d):
        assert time.monotonic() < deadline, f"the command of {d.name} still runs"
        time.sleep(0.002)
    reap(d)


def settle() -> None:
    """Done between two steps, as the kernel and init would meanwhile: a command let go by its spawn has
    counted itself in effects.log (so what a step reads there is final), and an ended one is reaped."""
    for d in commands():
        deadline = time.monotonic() + 10
        while not (d / "started").exists() and alive(d):
            assert time.monotonic() < deadline, f"the command of {d.name} never started"
            time.sleep(0.001)
        reap(d)


def end_command(d: Path) -> bool:
    """The command finishes by itself (exit status and output written) and is reaped; False when it ended
    without an exit status."""
    (d / "release").touch()
    wait_gone(d)
    return (d / "exit").exists()


def running_commands() -> list[Path]:
    """The commands still running that nothing has let go yet."""
    return [d for d in commands() if alive(d) and not (d / "release").exists()]


def end_commands() -> None:
    """Every running command not yet let go finishes by itself."""
    for d in running_commands():
        end_command(d)


def end_all_commands() -> None:
    """The machine goes down (or the history ends): every command's process group is killed and reaped."""
    for d in commands():
        if group_members(d):
            try:
                os.killpg(_leader(d)[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_gone(d)


# --------------------------------------------------------------------------- the model


class Env:
    """Per-test resources shared by all histories: a migrated template database and the script. On
    PostgreSQL (``backend``) the template is a schema of its own and each history's database another
    one, emptied and filled from the template's rows before each history."""

    def __init__(self, base: Path, backend: Backend | None = None) -> None:
        self.base = base
        self.backend = backend
        self.state = base / "state"  # each history's state dir: control.db copied from the template
        self.root = base / "root"  # the sessions' folder: effects.log counts the test tool's executions
        self.log = self.root / "effects.log"
        self.state.mkdir()
        self.root.mkdir()
        script = base / "script.json"
        script.write_text(json.dumps({"rules": RULES, "default": {"text": "Hi.", "usage": {"input_tokens": 1,
                                                                                         "output_tokens": 1}}}))
        self.model = f"scripted:{script}"
        self.registry = ToolRegistry({"mark": {"impl": f"{__name__}:mark", "capability": "unknown"}})
        # the modelled server's configuration: its Coordinator and every attempt its worker runs take it
        self.config = GoalsConfig(state_dir=self.state, default_model=self.model, max_concurrent_turns=MAX_CONCURRENT,
                                  max_recovery_attempts=MAX_RECOVERIES, recovery_backoff_s=0.0,
                                  provider_retry_base_s=0.01)
        self.template = base / "template.db"
        self.usage_template = base / "usage-template.db"  # the ledger (usage.db): empty, migrated
        self.usage_url = f"sqlite:///{self.state / 'usage.db'}"
        if backend is None:
            db = Database(f"sqlite:///{self.template}")
            migrate(db, "control")  # the real migrations, once; every history starts from a copy
            usage = Database(f"sqlite:///{self.usage_template}")
            migrate(usage, "usage")
            usage.close()
        else:
            db = backend.open("model_template", migrated="control")
            backend.open("model_usage_template", migrated="usage")
            # each history's schemas, refilled from the templates' rows
            self.history = backend.open("model_history", migrated="control")
            self.usage_history = backend.open("model_usage_history", migrated="usage")
            self.usage_url = backend.url("model_usage_history")
        self.sessions = [db.transact(lambda tx, p=p: c.create_session(tx, "s", str(self.root), self.model, p))["session_id"]
                         for p in SESSIONS]
        self.template_seq = int(db.transact(lambda tx: tx.scalar("SELECT MAX(seq) AS n FROM events")) or 0)
        if backend is None:
            db.close()
        self.count = 0

    def fresh(self) -> str:
        """A new history's control.db (a copy of the template) and an empty effects.log; its URL."""
        for f in self.state.iterdir():
            if f.is_dir():
                shutil.rmtree(f)
            else:
                f.unlink()
        self.log.unlink(missing_ok=True)
        self.count += 1
        if self.backend is None:
            shutil.copyfile(self.template, self.state / "control.db")
            shutil.copyfile(self.usage_template, self.state / "usage.db")
            return f"sqlite:///{self.state / 'control.db'}"
        refill(self.history, f"test_{self.backend.token}_model_template")
        refill(self.usage_history, f"test_{self.backend.token}_model_usage_template")
        return self.backend.url("model_history")


def refill(history: Database, template: str) -> None:
    """Empty a PostgreSQL history schema and copy the template schema's rows into it."""

    def copy(tx: Tx) -> None:
        tables = [str(r["table_name"]) for r in tx.all(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            " AND table_type = 'BASE TABLE' ORDER BY table_name")]
        tx.execute(f"TRUNCATE {', '.join(tables)}")
        for table in tables:
            tx.execute(f'INSERT INTO {table} SELECT * FROM "{template}".{table}')

    history.transact(copy)


ENV: Env | None = None


class Sweeps(dict[str, "asyncio.Task[None]"]):
    """The Coordinator's kills in progress (effect id -> task), remembering each task started: one that
    ended before the pass returned has left the dict, and its crash must still be seen."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[asyncio.Task[None]] = []

    def __setitem__(self, key: str, task: asyncio.Task[None]) -> None:
        self.started.append(task)
        super().__setitem__(key, task)


class CoordinatorModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert ENV is not None
        self.env = ENV
        url = ENV.fresh()
        self.state = ENV.state
        self.db = Database(url, inline=True)  # the server's store (read by the checks too)
        self.wdb = Database(url, inline=True)  # the workers' store
        self.udb = Database(ENV.usage_url, inline=True)  # the usage ledger the server's outbox loop writes
        self.ledger_moved = False  # usage.db changed in the last step (control.db maybe not)
        self.loop = asyncio.new_event_loop()
        self.boot = os.environ.get("JUPYTER_GOALS_BOOT_ID")
        self.server_proc = SLEEPERS.take()
        self.coordinator = self._new_coordinator()
        self.worker: tuple[str, int, subprocess.Popen[bytes]] | None = None
        self.histories = HistoryCache()  # the worker process's provider-ready histories (lost when it dies)
        self.threads: list[AttemptThread] = []
        self.sessions = ENV.sessions
        self.asked: dict[str, bool] = {}  # effect id -> whether its scope needed an approval when it was dispatched
        self.sent: list[tuple[str, str, str, str]] = []  # (session, client_request_id, text, message_id)
        self.approved: set[str] = set()  # approvals the person approved (they were pending then)
        self.denied: set[str] = set()
        self.approval_states: dict[str, str] = {}
        self.unknown_runs: dict[str, int] = {}  # effect id seen unknown -> executions counted then
        self.attempts_seen: set[str] = set()
        self.counted: set[str] = set()  # requests whose receipt the ledger holds
        self.command_states: dict[str, str] = {}  # a shell call's effect id -> its state at the last check
        self.full_pass = False  # the last step was a whole Coordinator pass that ran to its end
        self.last = Snapshot(event_seq=ENV.template_seq)  # the state after the last step (the next step's "before")

    # ------------------------------------------------------------------ plumbing
    def tx(self, fn: Any, write: bool = True) -> Any:
        return self.db.transact(fn, write=write)

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        return self.db.transact(lambda tx: tx.all(sql, params), write=False)  # type: ignore[no-any-return]

    def _new_coordinator(self) -> Coordinator:
        coord = Coordinator(self.db, self.env.config, registry=self.env.registry, redactor=REDACTOR)
        coord.claimant = "|".join(str(x) for x in identity(self.server_proc))  # this server process's identity
        coord._cancelling = Sweeps()
        return coord

    def live_threads(self) -> list[AttemptThread]:
        return [t for t in self.threads if not t.done]

    def _step_start(self) -> None:
        COVERED[sys._getframe(1).f_code.co_name] += 1
        self.full_pass = self.ledger_moved = False

    def _die(self, threads: list[AttemptThread]) -> None:
        for t in threads:
            t.crash()
            assert t.error is None, t.error

    def _worker_dies(self) -> None:
        if self.worker is None:
            return
        _, _, proc = self.worker
        self._die([t for t in self.live_threads() if t.worker == self.worker[0]])
        SLEEPERS.kill(proc)
        self.worker = None

    def _server_dies(self, reboot: bool) -> None:
        """The server dies; its workers die with it; a new server starts and recovers."""
        self._worker_dies()
        SLEEPERS.kill(self.server_proc)
        if reboot:
            end_all_commands()  # the detached commands go with the machine
            os.environ["JUPYTER_GOALS_BOOT_ID"] = c.new_id("boot")
        self.server_proc = SLEEPERS.take()
        self.coordinator = self._new_coordinator()
        self._recover()

    def _recover(self) -> None:
        """A full Coordinator pass; the kills its sweep started (tasks on the server's loop, beside
        everything else) are run to their end within it. A crash in one of them is the server's death."""
        self.loop.run_until_complete(self.coordinator.recover())
        assert isinstance(self.coordinator._cancelling, Sweeps)
        sweeps, self.coordinator._cancelling.started = self.coordinator._cancelling.started, []
        if sweeps:
            COVERED["stopped command killed by the Coordinator"] += 1
            self.loop.run_until_complete(asyncio.wait(sweeps))
            for task in sweeps:
                if (exc := task.exception()) is not None:
                    raise exc
        self.full_pass = True

    def _flush_ledger(self) -> None:
        """One pass of the server's outbox loop: due operations applied to usage.db, marked done."""
        self.ledger_moved = True
        self.loop.run_until_complete(outbox_module.OutboxDispatcher(self.db, self.udb, PRICES).dispatch_due())

    def teardown(self) -> None:
        for t in self.threads:
            t.crash()
        end_all_commands()
        if self.worker is not None:
            SLEEPERS.give_back(self.worker[2])
        SLEEPERS.give_back(self.server_proc)
        self.loop.close()
        self.db.close()
        self.wdb.close()
        self.udb.close()
        if self.boot is None:
            os.environ.pop("JUPYTER_GOALS_BOOT_ID", None)
        else:
            os.environ["JUPYTER_GOALS_BOOT_ID"] = self.boot

    # ------------------------------------------------------------------ people
    @initialize(first=st.lists(st.tuples(st.integers(0, CHATS - 1), st.sampled_from(TEXTS)), max_size=3),
                admit=st.booleans(), prefix=st.sampled_from(["", "", "", "approval asked", "approved", "unknown outcome", "delegated",
                                                       "delegated 3", "delegated 6", "delegated 99", "delegated 99",
                                                       "request lost", "command running", "command being stopped",
                                                       "command orphaned by a stop"]),
                goal=st.sampled_from([-1, -1, -1, 0, 2, 4, 6, 8, 10, 12, 14, 16, 99, COMPLETED]))
    def some_work(self, first: list[tuple[int, str]], admit: bool, prefix: str = "", goal: int = -1) -> None:
        """Histories start with up to three requests, admitted at once or not yet, sometimes after a prefix
        played by the same real machinery: a write waiting for its approval, the approval given, or a write
        whose worker died after it began (its outcome unknown; its work then restricted), or one whose worker
        died with a model request out (its usage unknown), or a chat that
        delegated to a subtask now waiting for it, the child 0, 3, 6 points in or finished; and sometimes a
        Goal whose attempt went ``goal`` interruption points in (its mark, its submission, its acceptance
        review and completion lie 2 to 16 points in; 99: to its end; ``COMPLETED``: to
        ``goal.after_completion_commit``), so that six random steps reach each."""
        if prefix:
            self._prefix(prefix)
        if goal >= 0:
            self._goal_prefix(goal)
        for s, text in first:
            self.send_message(s, text, False, 1, False)
        if admit or not (first or prefix):
            self.server("admit")

    def _goal_prefix(self, hops: int) -> None:
        check = self.check_invariants_after_each_step
        self.set_goal(True)
        check()
        if not hops:
            return
        for t in self.live_threads():  # a prefix's attempt still running goes on first
            go_on(t)
        check()
        assert self._claim() or self.live_threads()
        t = self.live_threads()[-1]
        if hops == COMPLETED:  # its completion committed; the worker may die right there
            while not t.done and t.point != "goal.after_completion_commit":
                go_on(t, 1)
        else:
            go_on(t, hops)
        check()

    def _prefix(self, prefix: str) -> None:
        check = self.check_invariants_after_each_step
        # the worker dies with a model request out (its usage unknown), or after the write began (its
        # outcome unknown; its work then restricted); the server recovers
        died_at = {"request lost": (2, "chat", "provider.after_response"),
                   "unknown outcome": (1, "write again", "tool.side_effect")}
        if prefix in died_at:
            s, text, point = died_at[prefix]
            self.send_message(s, text, False, 1, True)
            check()
            assert self._claim()
            t = self.live_threads()[-1]
            while t.point != point:
                t.advance()
            check()
            self._worker_dies()
            self.server("recover")
            check()
            return
        if prefix.startswith("command"):  # a shell command runs; it is being killed, or its killer died
            self.send_message(1, "run", False, 1, True)
            check()
            assert self._claim()
            t = self.live_threads()[-1]
            while t.point != "tool.process_runs":
                t.advance()
            check()
            if prefix == "command running":
                return
            self.control(1, "stop", 1, False, 1)
            check()
            if prefix == "command being stopped":
                while t.point != "tool.before_cancel_kill":
                    t.advance()
            else:
                self._worker_dies()  # the stop is committed, the command's worker gone: nothing killed it yet
            check()
            return
        if prefix.startswith("delegated"):  # the parent spawned its subtask and waits; the child went n points in
            self.send_message(1, "delegate", False, 1, True)
            check()
            assert self._claim()
            go_on(self.live_threads()[-1])
            self.server("admit")
            check()
            hops = int(prefix.split()[-1]) if prefix != "delegated" else 0
            if hops and self._claim():
                go_on(self.live_threads()[-1], hops)
                check()
            return
        self.send_message(0, "write", False, 1, True)
        check()
        assert self._claim()
        go_on(self.live_threads()[-1])
        check()
        if prefix == "approved":
            self.decide_approval(0, "approve", True, 1)
            check()

    def _wake(self, wake: bool) -> None:
        """After a commit that may create work the handler wakes the admission loop (or the wake-up is lost)."""
        if wake:
            self.loop.run_until_complete(self.coordinator.admit())

    @rule(s=st.integers(0, CHATS - 1), text=st.sampled_from(TEXTS), steer=st.booleans(),
          repeat=st.integers(0, 3), wake=st.booleans(),
          crash=st.sampled_from(["", "", "", "", "input.before_accept", "input.after_accept"]))
    def send_message(self, s: int, text: str, steer: bool, repeat: int, wake: bool = False, crash: str = "") -> None:
        """``POST /sessions/{id}/messages``; one time in four a client's retry of an earlier message with
        its ``client_request_id``, which answers the first message and changes nothing. The server may die
        at ``input.before_accept`` (nothing committed: the client's retry after the restart is the first
        message) or ``input.after_accept`` (committed, never answered: the retry gets that message)."""
        self._step_start()
        if crash == "input.before_accept":
            COVERED[crash] += 1
            counts = self.rows("SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM work_items) AS w")
            self._server_dies(reboot=False)
            assert self.rows("SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM work_items) AS w") \
                == counts
            self.check_invariants_after_each_step()
            self._step_start()
        if repeat == 0 and self.sent:
            sid, crid, text, message_id = self.sent[(s * 7 + len(text)) % len(self.sent)]
        else:
            sid, crid, message_id = self.sessions[s], f"r{len(self.sent)}", ""
        before = self.rows("SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM work_items) AS w")

        def run(tx: Tx) -> tuple[Row, bool]:
            return c.accept_message(tx, c.get_session(tx, sid), text, crid, "steer" if steer else "queue",
                                    auto_recover=True, host=host_name())

        msg, created = self.tx(run)
        if message_id:
            COVERED["message repeated"] += 1
            assert not created and msg["message_id"] == message_id
            assert self.rows("SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM work_items) AS w") \
                == before
        else:
            assert created
            self.sent.append((sid, crid, text, msg["message_id"]))
        if crash == "input.after_accept":  # no answer, no wake-up: the new server recovers, the client retries
            COVERED[crash] += 1
            self._server_dies(reboot=False)
            self.check_invariants_after_each_step()
            self._step_start()
            counts = self.rows("SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM work_items) AS w")
            again, created = self.tx(run)
            assert not created and again["message_id"] == msg["message_id"], "the retry made a second message"
            assert self.rows("SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM work_items) AS w") \
                == counts
            return
        self._wake(wake)

    @rule(s=st.integers(0, len(SESSIONS) - 1),
          action=st.sampled_from(["pause", "resume", "stop", "retry", "pause", "resume", "stop_all"]),
          stale=st.integers(0, 4), wake=st.booleans(), crash=st.integers(0, 1))
    def control(self, s: int, action: str, stale: int, wake: bool, crash: int = 1) -> None:
        """A session action as ``POST /sessions/{id}/actions`` commits it (End = stop), or ``stop_all``; one
        time in five sent with an outdated ``expected_control_version`` (409, nothing changes). One stop in
        two kills the server at ``control.after_stop_commit`` (the intent is durable; no kill or sweep
        followed it): the new server recovers."""
        self._step_start()
        busy = [r["session_id"] for r in self.rows("SELECT DISTINCT session_id FROM work_items WHERE phase NOT IN"
                                                    " ('done', 'cancelled') ORDER BY session_id")]
        sid = busy[s % len(busy)] if busy else self.sessions[s]
        if action == "stop_all":
            self.tx(c.stop_all)
            self._wake(wake)
            return

        def run(tx: Tx) -> Row:
            work = c.current_work(tx, sid)
            if work is None:
                raise NotFound(sid)
            expected = int(work["control_version"]) - 1 if stale == 0 else None
            if action == "stop":
                for other in c.unfinished_work_of_session(tx, sid, except_work_id=work["work_id"]):
                    c.apply_control(tx, other, "stop", None)
                    goal_lifecycle.sync_with_work(tx, other, "stop")
            work = c.apply_control(tx, work, action, expected)
            goal_lifecycle.sync_with_work(tx, work, action)  # a Goal's work item moves its Goal too
            return work

        try:
            self.tx(run)
            COVERED[f"control {action}"] += 1
        except (NotFound, VersionConflict):
            COVERED["control refused"] += 1  # rolled back: nothing changed
        else:
            if action == "stop" and crash == 0:
                COVERED["control.after_stop_commit"] += 1
                self._server_dies(reboot=False)
                return
        self._wake(wake)

    @rule(i=st.integers(0, 50), verdict=st.sampled_from(["approve", "deny"]), wake=st.booleans(),
          again=st.integers(0, 3))
    def decide_approval(self, i: int, verdict: str, wake: bool, again: int) -> None:
        """Approve or deny a pending approval; one time in four a decision on one no longer pending (a second
        decision, or one withdrawn by a control), which is a 409 and changes nothing."""
        self._step_start()
        if not self.approval_states:
            return  # (no precondition: a rule no history can take makes hypothesis discard the history)
        pending = sorted(a for a, state in self.approval_states.items() if state == "pending")
        ids = pending if pending and again else sorted(self.approval_states)
        aid = ids[i % len(ids)]
        state = self.rows("SELECT state FROM approvals WHERE approval_id = ?", (aid,))[0]["state"]
        try:
            self.tx(lambda tx: c.decide_approval(tx, aid, verdict))
        except VersionConflict:
            assert state != "pending"
            COVERED["decision repeated"] += 1
            return
        assert state == "pending"
        (self.approved if verdict == "approve" else self.denied).add(aid)
        COVERED["approved" if verdict == "approve" else "denied"] += 1
        self._wake(wake)

    @rule(wake=st.booleans())
    def set_goal(self, wake: bool) -> None:
        """``POST /goals`` in the Goal session: the objective, its one requirement and the Goal's work item
        committed together; refused (409) while the session's last Goal has not ended."""
        self._step_start()
        sid = self.sessions[CHATS]

        def run(tx: Tx) -> Row:
            return goal_lifecycle.create(tx, c.get_session(tx, sid), GOAL, [Requirement(text="a mark is made")], {},
                                         host=host_name(), auto_recover=True)

        try:
            self.tx(run)
            COVERED["goal set"] += 1
        except VersionConflict:
            COVERED["goal refused"] += 1
            return
        self._wake(wake)

    # ------------------------------------------------------------------ the server
    @rule(event=st.sampled_from(["admit", "admit", "recover", "recover", "recovery.after_claim",
                                 "recovery.after_decision", "tool.before_cancel_kill", "server crash",
                                 "machine restart"]))
    def server(self, event: str) -> None:
        """The cheap admission pass (after a message or control), a full Coordinator pass (start, tick, a
        worker's exit, ``jupyter goals recover``) that may die at a recovery point, or kill -9 of the
        server (its workers die with it) or of the machine (a new boot id); a new server recovers."""
        self._step_start()
        COVERED[event] += 1
        if event == "admit":
            self.loop.run_until_complete(self.coordinator.admit())
            return
        if event in ("server crash", "machine restart"):
            self._server_dies(reboot=event == "machine restart")
            return
        _coordinator_crash["at"] = None if event == "recover" else event
        try:
            self._recover()
        except Crash:
            COVERED[f"server died at {event}"] += 1
            self._server_dies(reboot=False)
        finally:
            _coordinator_crash["at"] = None

    @rule(s=st.integers(0, len(SESSIONS) - 1), scope=st.sampled_from(["ask", "ask, mark allowed", "bypass"]),
          stale=st.integers(0, 4), wake=st.booleans())
    def permissions(self, s: int, scope: str, stale: int, wake: bool) -> None:
        """``PATCH /sessions/{id}``: a new permission scope (ask, ask with the test tool allowed, bypass),
        carried to the session's unfinished work and its subtasks' sessions with a new control version
        (a running attempt yields at its next step); its pending approvals are voided. One time in five
        sent with an outdated ``expected_control_version``: 409, nothing changes."""
        self._step_start()
        busy = [r["session_id"] for r in self.rows("SELECT DISTINCT session_id FROM work_items WHERE phase NOT IN"
                                                    " ('done', 'cancelled') ORDER BY session_id")]
        sid = busy[s % len(busy)] if busy else self.sessions[s]
        perms: dict[str, Any] = {"mode": "bypass"} if scope == "bypass" else \
            {"mode": "ask", "allow": ["mark"] if "allowed" in scope else []}

        def run(tx: Tx) -> Row:
            current = c.current_work(tx, sid)
            expected = (int(current["control_version"]) - 1 if current else -1) if stale == 0 else None
            return c.change_permissions(tx, sid, perms, expected)

        try:
            self.tx(run)
        except VersionConflict:
            COVERED["permissions refused"] += 1
            return
        COVERED[f"permissions {scope}"] += 1
        self._wake(wake)

    @rule(crash=st.sampled_from(["", "", "usage.before_persist", "usage.after_persist"]), nth=st.integers(0, 3))
    def ledger(self, crash: str, nth: int = 0) -> None:
        """The server's outbox loop applies the due operations (request attributions, receipts, lost
        requests) from control.db to usage.db, each insert-if-absent on its key, then marks it done in
        control.db. The server may die just before a usage.db commit or just after it (the done mark not
        yet committed), at the ``nth`` operation of the pass; the new server recovers and a later pass applies
        what is left, nothing twice. A pass that nothing kills leaves nothing due."""
        self._step_start()
        _coordinator_crash["at"], _passes_left[0] = crash or None, nth
        try:
            self._flush_ledger()
        except Crash:
            COVERED[f"crash at {crash}"] += 1
            self._server_dies(reboot=False)
            return
        finally:
            _coordinator_crash["at"], _passes_left[0] = None, 0
        due = self.rows("SELECT op_key FROM outbox WHERE state = 'pending' AND next_attempt_at <= ?", (time.time(),))
        assert not due, f"a ledger pass left operations due: {due}"
        COVERED["ledger drained"] += 1

    @rule(crash=st.booleans(), grace=st.integers(0, 6))
    def shutdown(self, crash: bool, grace: int) -> None:
        """A graceful server stop (SIGTERM), then a start. Admission closes (one stop in two dies right
        there, at ``shutdown.after_admission_stop``: a kill -9); the worker's attempts get ``grace`` more
        interruption points to reach a commit, the rest are cancelled where they are (nothing durable is
        written on the way out) and the worker hands every attempt it still runs back as a checkpoint
        (``recovery.hand_back``, as its SIGTERM handler does); the ledger is flushed; the new server
        recovers."""
        self._step_start()
        self.coordinator.admission_open = False
        if crash:
            COVERED["crash at shutdown.after_admission_stop"] += 1
            self._server_dies(reboot=False)
            return
        for t in self.live_threads():
            go_on(t, grace)
        if self.worker is not None:
            for t in self.live_threads():
                COVERED[f"cancelled at {t.point}"] += 1
            wid, _, proc = self.worker
            self._die([t for t in self.live_threads() if t.worker == wid])
            self.tx(lambda tx: recovery_store.hand_back(tx, wid))
            SLEEPERS.kill(proc)
            self.worker = None
        self._flush_ledger()
        self._server_dies(reboot=False)  # its process has exited (no worker is left); a new server recovers

    # ------------------------------------------------------------------ workers
    def _claim(self) -> bool:
        """The worker claims the oldest admitted attempt and runs it to its first interruption point."""
        if self.worker is None:
            proc = SLEEPERS.take()
            host, boot, pid, start = identity(proc)
            wid = c.new_id("wkr")
            gen = self.tx(lambda tx: c.register_worker(tx, wid, host, boot, pid, start, 60.0))
            self.worker = (wid, gen, proc)
            self.histories = HistoryCache()
        wid, gen, _ = self.worker
        attempt = self.tx(lambda tx: c.claim_attempt(tx, wid, gen))
        if attempt is None:
            return False
        COVERED["claim"] += 1
        runner = TurnRunner(self.wdb, attempt, self.env.config, cwd=str(self.env.root), registry=self.env.registry,
                            redactor=REDACTOR, histories=self.histories)
        t = AttemptThread(runner, attempt, wid)
        self.threads.append(t)
        t.start()
        assert t.error is None, t.error
        return True

    def _work(self, i: int, hops: int) -> None:
        """The worker claims an admitted attempt, or one of its attempts goes on through ``hops``
        interruption points (or to its end)."""
        self._step_start()
        live = self.live_threads()
        if (not live or i % 3 == 0) and self._claim():
            hops -= 1
            live = self.live_threads()
        if not live:
            return
        t = live[i % len(live)]
        for _ in range(hops):
            t.advance()
            assert t.error is None, t.error
            if t.done:
                COVERED["attempt ended"] += 1
                break

    @rule(i=st.integers(0, 11), hops=st.integers(1, 10))
    def work(self, i: int, hops: int) -> None:
        self._work(i, hops)

    # two more copies: the worker acts about as often as people and the server together
    @rule(i=st.integers(0, 11), hops=st.integers(1, 10))
    def work_more(self, i: int, hops: int) -> None:
        self._work(i, hops)

    @rule(i=st.integers(0, 11), hops=st.integers(1, 10))
    def work_again(self, i: int, hops: int) -> None:
        self._work(i, hops)

    @rule()
    def worker_crash(self) -> None:
        """kill -9 of the worker process: each of its attempts stops at the point it had reached. (No
        precondition: which rules a step may choose must never depend on the state a history reached.)"""
        self._step_start()
        for t in self.live_threads():
            COVERED[f"crash at {t.point}"] += 1
        self._worker_dies()

    @rule(i=st.integers(0, 7))
    def command_ends(self, i: int) -> None:
        """A running shell command finishes by itself: its exit status and output written, its process gone."""
        self._step_start()
        running = running_commands()
        if not running:
            return
        if end_command(running[i % len(running)]):
            COVERED["command ended"] += 1

    @rule(i=st.integers(0, 7))
    def cancel_command(self, i: int) -> None:
        """``POST /sessions/{id}/actions`` ``cancel_tool``: a person cancels one shell call; a 409 (nothing
        recorded) once it no longer runs. Its worker kills it at its next look (or, if that worker died,
        the Coordinator's sweep) and the turn goes on with the cancelled result."""
        self._step_start()
        calls = [d.name for d in commands()]
        if not calls:
            return
        eid = calls[i % len(calls)]
        sid = self.rows("SELECT session_id FROM effects WHERE effect_id = ?", (eid,))[0]["session_id"]
        try:
            self.tx(lambda tx: c.request_cancel_tool(tx, sid, eid))
        except VersionConflict:
            COVERED["cancel refused"] += 1
            return
        COVERED["cancel requested"] += 1

    # ------------------------------------------------------------------ invariants
    def snapshot(self) -> Snapshot:
        """The durable state the invariants read: a handful of whole-table reads (the tables are small)."""

        def read(tx: Tx) -> Snapshot:
            return Snapshot(
                event_seq=int(tx.scalar("SELECT COALESCE(MAX(seq), 0) AS n FROM events") or 0),
                work={w["work_id"]: w for w in tx.all("SELECT * FROM work_items ORDER BY created_at")},
                attempts=tx.all("SELECT attempt_id, work_id, session_id, state, control_version, worker_id"
                                " FROM attempts"),
                effects={e["effect_id"]: e for e in tx.all(
                    "SELECT effect_id, call_id, work_id, session_id, seq, attempt_id, tool, state, dispatched_at,"
                    " cancel_requested_at FROM effects")},
                approvals=tx.all("SELECT approval_id, call_id, state, consumed_by_attempt FROM approvals"),
                lost_messages=tx.all("SELECT m.message_id, w.phase FROM messages m JOIN work_items w ON"
                                     " w.work_id = m.work_id WHERE m.consumed = 0 AND w.phase = 'done'"),
                requests=Counter({r["work_id"]: r["n"] for r in tx.all(
                    "SELECT work_id, COUNT(*) AS n FROM requests GROUP BY work_id")}),
                goals={r["goal_id"]: r for r in tx.all("SELECT goal_id, work_id, state FROM goals")},
                goal_records=Counter(r["goal_id"] for r in tx.all("SELECT goal_id FROM goal_history")),
                children={r["work_id"]: r for r in tx.all(
                    "SELECT work_id, parent_work_id, desired_state, phase FROM work_items WHERE parent_work_id IS NOT NULL")},
                deliveries=Counter(r["work_id"] for r in tx.all(
                    "SELECT work_id FROM transcript WHERE kind = 'subtask_result'")),
                idle_turns=int(tx.scalar("SELECT COUNT(*) AS n FROM transcript WHERE content = ?", (IDLE_TURN,)) or 0),
            )

        snap: Snapshot = self.db.transact(read, write=False)
        snap.log_size, snap.runs = self.runs()
        return snap

    def runs(self) -> tuple[int, Counter[str]]:
        """The test tool's executions counted on disk (effects.log), and the file's size."""
        try:
            size = os.stat(self.env.log).st_size
        except FileNotFoundError:
            return 0, Counter()
        if size == self.last.log_size:
            return size, self.last.runs
        with open(self.env.log, encoding="utf-8") as f:
            return size, Counter(f.read().split())

    @invariant()
    def check_invariants_after_each_step(self) -> None:
        settle()
        before = self.last
        if not self.full_pass:
            seq = self.db.transact(lambda tx: tx.scalar("SELECT COALESCE(MAX(seq), 0) AS n FROM events"), write=False)
            if seq == before.event_seq and self.runs()[0] == before.log_size and not self.ledger_moved:
                return  # nothing was committed and nothing ran: the state the last check passed is unchanged
        now = self.snapshot()
        self.a_pass_reads_the_facts_each_item_reads_alone()
        self.at_most_one_owner(now)
        self.no_effect_executed_twice_and_no_unknown_rerun(now)
        self.approvals_consumed_once_and_only_when_approved(now)
        self.held_work_is_never_admitted_and_starts_nothing(before, now)
        assert not now.lost_messages, f"accepted messages lost: {now.lost_messages}"
        self.run_work_is_admitted_or_waiting_with_a_reason(now)
        self.goals_end_once(before, now)
        self.subtasks_deliver_once_and_never_outlive_a_stop(now)
        self.usage_counted_once_per_receipt()
        self.commands_end_with_their_work(now)
        self.last = now

    def a_pass_reads_the_facts_each_item_reads_alone(self) -> None:
        """An admission pass reads the facts of all its work items together (``recovery_store.pass_reads``):
        for every unfinished item they are the facts it reads alone, whatever state the steps left."""
        coord = self.coordinator

        def compare(tx: Tx) -> None:
            at = time.time()
            reads = recovery_store.pass_reads(tx, coord.host)
            for work in recovery_store.unfinished_work(tx, coord.host):
                session = c.get_session(tx, work["session_id"])
                assert reads.sessions[work["session_id"]] == session
                assert (work["work_id"] in reads.recovery_pending) == recovery_store.recovery_pending(tx, work["work_id"])
                each = [load_facts(tx, work, session, config=coord.config, registry=coord.registry, prices=coord.prices,
                                   host_name=coord.host, now=at, models={}, reads=r) for r in (None, reads)]
                assert each[0] == each[1], (work["work_id"], each)

        self.tx(compare, write=False)

    def usage_counted_once_per_receipt(self) -> None:
        """usage.db holds each provider answer's receipt at most once, with the tokens control.db recorded
        for that request; every operation control.db marked done is in usage.db; a request whose usage
        became unknown (lost) has no receipt (unknown is not zero); no request stays out once its attempt
        ended (a dead attempt's are lost by its recovery)."""
        answered = {r["request_id"]: r for r in self.rows(
            "SELECT request_id, state, tokens FROM requests WHERE state IN ('received', 'failed')")}
        orphans = self.rows("SELECT r.request_id, a.state FROM requests r JOIN attempts a ON a.attempt_id = r.attempt_id"
                            " WHERE r.state = 'sent' AND a.state NOT IN ('running', 'dead')")
        assert not orphans, f"requests still out for attempts that ended (their usage neither counted nor unknown): {orphans}"
        done = self.rows("SELECT op_key, kind FROM outbox WHERE state = 'done'")

        def read(tx: Tx) -> tuple[list[Row], dict[str, str]]:
            return (tx.all("SELECT receipt_key, request_id, input_tokens, output_tokens, usage_known FROM receipts"),
                    {r["request_id"]: r["state"] for r in tx.all("SELECT request_id, state FROM requests")})

        receipts, ledger_requests = self.udb.transact(read, write=False)
        counted = Counter(r["request_id"] for r in receipts)
        assert max(counted.values(), default=0) <= 1, f"a request counted twice: {counted.most_common(1)}"
        for r in receipts:
            assert r["receipt_key"] == f"receipt:{r['request_id']}", r
            req = answered.get(r["request_id"])
            assert req is not None, f"a receipt for a request no answer was recorded for: {r}"
            if r["usage_known"]:
                assert r["input_tokens"] + r["output_tokens"] == req["tokens"], (r, req)
            COVERED["receipt counted"] += r["request_id"] not in self.counted
        self.counted = set(counted)
        keys = {r["receipt_key"] for r in receipts}
        for op in done:
            kind, _, request_id = str(op["op_key"]).partition(":")
            if kind == "receipt":
                assert op["op_key"] in keys, f"marked done, not in the ledger: {op}"
            else:
                assert request_id in ledger_requests, f"marked done, not in the ledger: {op}"
        for request_id, state in ledger_requests.items():
            if state == "lost":
                assert request_id not in counted, f"a lost request (usage unknown) has a receipt: {request_id}"
                COVERED["lost request in the ledger"] += 1

    def commands_end_with_their_work(self, now: Snapshot) -> None:
        """A shell call whose process still runs is neither ``cancelled`` nor ``unknown`` (a kill commits
        only once the group is gone; an unknown outcome means its executor and its process died), and after a
        full Coordinator pass no command of stopped work, nor one a person cancelled, runs unless a live
        attempt still watches it (it kills it at its next look)."""
        watched = {t.attempt["work_id"] for t in self.live_threads()}
        for d in commands():
            eff = now.effects[d.name]
            running = alive(d)
            if eff["state"] != self.command_states.get(d.name):
                self.command_states[d.name] = eff["state"]
                COVERED[f"command {eff['state']}"] += 1
            assert not (running and eff["state"] in ("cancelled", "unknown")), f"{eff['state']} yet running: {eff}"
            condemned = now.work[eff["work_id"]]["desired_state"] == "cancelled" or eff["cancel_requested_at"]
            if running and self.full_pass and condemned:
                assert eff["work_id"] in watched, f"a stopped or cancelled command runs on after a full pass: {eff}"

    def subtasks_deliver_once_and_never_outlive_a_stop(self, now: Snapshot) -> None:
        """A parent gets at most one result per subtask it started, never takes a model turn while it
        waits for one, and a stopped parent's subtasks are stopped (or finished) too."""
        assert now.idle_turns == 0, "the parent took a model turn while its subtask ran"
        started = Counter(child["parent_work_id"] for child in now.children.values())
        for parent, n in now.deliveries.items():
            assert n <= started[parent], f"{parent} got {n} subtask results for {started[parent]} subtasks"
            COVERED["subtask result delivered"] += n - self.last.deliveries[parent]
        for child in now.children.values():
            COVERED["subtask " + child["phase"]] += child["work_id"] not in self.last.children or \
                self.last.children[child["work_id"]]["phase"] != child["phase"]
            parent = now.work[child["parent_work_id"]]
            if parent["desired_state"] == "cancelled":
                assert child["desired_state"] == "cancelled" or child["phase"] in ("done", "cancelled"), (parent, child)

    def goals_end_once(self, before: Snapshot, now: Snapshot) -> None:
        """A Goal that ended stays ended, in the state it ended in, with exactly one terminal record; an
        achieved Goal's work is done."""
        for gid, goal in now.goals.items():
            was = before.goals.get(gid)
            if was is not None and was["state"] in TERMINAL_GOAL_STATES:
                assert goal["state"] == was["state"], f"Goal {gid} ended {was['state']}, now {goal['state']}"
            if goal["state"] in TERMINAL_GOAL_STATES:
                COVERED[f"goal {goal['state']}"] += was is None or was["state"] != goal["state"]
                assert now.goal_records[gid] == 1, f"Goal {gid} {goal['state']} with {now.goal_records[gid]} records"
            else:
                assert now.goal_records[gid] == 0, f"Goal {gid} still {goal['state']} has a terminal record"
            if goal["state"] == "achieved":
                assert now.work[goal["work_id"]]["phase"] == "done", (goal, now.work[goal["work_id"]])

    def at_most_one_owner(self, now: Snapshot) -> None:
        live = [a for a in now.attempts if a["state"] in ("admitted", "running")]
        per_work = Counter(a["work_id"] for a in live)
        assert all(n == 1 for n in per_work.values()), f"two live attempts of one work item: {live}"
        per_session = Counter(a["session_id"] for a in live)
        assert all(n == 1 for n in per_session.values()), f"two live attempts in one session: {live}"
        assert len(live) <= MAX_CONCURRENT, live
        # a thread still running an attempt is its one owner: its row is running, under its own worker
        rows = {a["attempt_id"]: a for a in now.attempts}
        for t in self.live_threads():
            row = rows[t.attempt["attempt_id"]]
            assert row["worker_id"] == t.worker and row["state"] in ("running", "ended"), row

    def no_effect_executed_twice_and_no_unknown_rerun(self, now: Snapshot) -> None:
        assert all(n == 1 for n in now.runs.values()), f"an effect executed twice: {now.runs}"
        assert all(now.effects[e]["dispatched_at"] is not None for e in now.runs), "executed without dispatched"
        for eid, e in now.effects.items():
            if e["state"] in ("unknown", "reconciled") and eid not in self.unknown_runs:
                COVERED["unknown outcome"] += 1
                self.unknown_runs[eid] = now.runs[eid]
        for eid, n in self.unknown_runs.items():
            assert now.effects[eid]["state"] in ("unknown", "reconciled"), (eid, now.effects[eid])
            assert now.runs[eid] == n, f"the effect {eid} of unknown outcome was executed again"

    def approvals_consumed_once_and_only_when_approved(self, now: Snapshot) -> None:
        allowed = {"pending": {"pending", "approved", "denied", "invalidated"},
                   "approved": {"approved", "consumed", "invalidated"}}
        for a in now.approvals:
            before = self.approval_states.get(a["approval_id"])
            if before is not None:
                assert a["state"] in allowed.get(before, {before}), (before, a)
            elif a["state"] == "pending":
                COVERED["approval asked"] += 1
            if a["state"] == "consumed" and before != "consumed":
                COVERED["approval consumed"] += 1
            self.approval_states[a["approval_id"]] = a["state"]
            if a["state"] in ("approved", "consumed"):
                assert a["approval_id"] in self.approved, f"approval {a['approval_id']} approved by no one"
        consumed = [a for a in now.approvals if a["state"] == "consumed"]
        assert len({a["call_id"] for a in consumed}) == len(consumed), f"two approvals used by one call: {consumed}"
        by_call = {a["call_id"]: a for a in consumed}
        # (seq, until): an earlier outcome of the work item was unknown until then (None: still unknown); a
        # reconciliation (a late receipt, a person's settle) lifts the restriction for calls dispatched after it
        unknown_spans: dict[str, list[tuple[int, float | None]]] = {}
        for e in now.effects.values():
            if e["state"] in ("unknown", "reconciled"):
                until = float(e["ended_at"]) if e["state"] == "reconciled" and e["ended_at"] is not None else None
                unknown_spans.setdefault(e["work_id"], []).append((int(e["seq"]), until))
        for e in now.effects.values():
            if e["dispatched_at"] is None:
                continue
            # ask mode, or any call dispatched while an earlier outcome of its work item was unknown: one
            # approval, used by this dispatch
            if e["effect_id"] not in self.asked:  # dispatched in this step: under the scope its work has now
                self.asked[e["effect_id"]] = needs_approval(now.work[e["work_id"]]["permission_scope"], e["tool"])
                COVERED["dispatched under ask"] += self.asked[e["effect_id"]]
            at = float(e["dispatched_at"])
            if self.asked[e["effect_id"]] or any(s < int(e["seq"]) and (until is None or until > at)
                                                 for s, until in unknown_spans.get(e["work_id"], [])):
                a = by_call.get(e["call_id"])
                assert a is not None, f"call {e['call_id']} dispatched without an approval"
                assert a["consumed_by_attempt"] == e["attempt_id"], (a, e)
        denied = {a["call_id"] for a in now.approvals if a["approval_id"] in self.denied}
        ran = {e["call_id"] for e in now.effects.values() if e["dispatched_at"] is not None}
        assert not denied & ran - set(by_call), "a denied call ran"

    def held_work_is_never_admitted_and_starts_nothing(self, before: Snapshot, now: Snapshot) -> None:
        for a in now.attempts:
            w = now.work[a["work_id"]]
            if a["state"] == "admitted":
                assert w["desired_state"] == "run", f"{w['desired_state']} work has an admitted attempt: {a}"
            if a["attempt_id"] not in self.attempts_seen:  # admitted during this step (after any control of it)
                self.attempts_seen.add(a["attempt_id"])
                assert w["desired_state"] == "run", f"admitted while {w['desired_state']}: {a}"
                assert a["control_version"] == w["control_version"], f"admitted under an old control version: {a}"
        dispatched = Counter(e["work_id"] for e in now.effects.values() if e["dispatched_at"] is not None)
        dispatched_before = Counter(e["work_id"] for e in before.effects.values() if e["dispatched_at"] is not None)
        for wid, w in now.work.items():
            was = before.work.get(wid)
            if was is not None and was["desired_state"] == "cancelled":  # a stop is final
                assert w["desired_state"] == "cancelled", f"{wid} was being stopped, now {w['desired_state']}"
            if was is None or was["desired_state"] == "run" or w["desired_state"] == "run":
                continue
            assert now.requests[wid] == before.requests[wid], f"{wid} held, yet a model request started"
            assert dispatched[wid] == dispatched_before[wid], f"{wid} held, yet a tool call started"

    def run_work_is_admitted_or_waiting_with_a_reason(self, now: Snapshot) -> None:
        live = {a["work_id"]: a for a in now.attempts if a["state"] in ("admitted", "running")}
        work = [w for w in now.work.values() if w["desired_state"] == "run" and w["phase"] not in ("done", "cancelled")]
        for w in work:
            assert w["reason_code"], w
            assert w["phase"] in ("queued", "working", "waiting", "recovering", "failed"), w
            if w["phase"] == "waiting":
                assert w["reason_code"] in WAIT_REASONS, w
        if not self.full_pass:
            return
        busy_sessions = {a["session_id"] for a in live.values()}
        quota_full = len(live) >= MAX_CONCURRENT
        for w in work:
            if w["work_id"] in live or w["phase"] in ("waiting", "failed"):
                continue
            # held back by the quota or by its session's running item: queued (or still recovering)
            assert w["phase"] in ("queued", "recovering"), f"after a full pass: {w['phase']} {w['reason_code']}"
            older = [o for o in work if o["session_id"] == w["session_id"] and o["created_at"] < w["created_at"]]
            assert quota_full or w["session_id"] in busy_sessions or older, (
                f"runnable work left unadmitted after a full pass: {w['work_id']} {w['reason_code']}")


@dataclass
class Snapshot:
    event_seq: int = 0
    work: dict[str, Row] = field(default_factory=dict)
    attempts: list[Row] = field(default_factory=list)
    effects: dict[str, Row] = field(default_factory=dict)
    approvals: list[Row] = field(default_factory=list)
    lost_messages: list[Row] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    goals: dict[str, Row] = field(default_factory=dict)
    goal_records: Counter[str] = field(default_factory=Counter)
    children: dict[str, Row] = field(default_factory=dict)
    deliveries: Counter[str] = field(default_factory=Counter)
    idle_turns: int = 0
    runs: Counter[str] = field(default_factory=Counter)
    log_size: int = 0


WAIT_REASONS = {str(r) for r in ReasonCode}


def needs_approval(scope: str | dict[str, Any], tool: str) -> bool:
    """Whether a work item's permission scope makes a call of ``tool`` (the test tool or shell) wait for a person."""
    perms = json.loads(scope) if isinstance(scope, str) else scope
    return bool(perms.get("mode", "ask") == "ask" and tool not in perms.get("allow", []))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def model_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """The model's resources on a SQLite file or on the real PostgreSQL server (the shared store)."""
    global ENV
    base = Path(tempfile.mkdtemp(prefix="jg-model-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    backend: Backend | None = None
    if request.param == "postgresql":
        if reason := postgres_unreachable():
            if os.environ.get("CI"):  # CI starts PostgreSQL (.ci/run): its absence there fails, never skips
                pytest.fail(f"CI is set and {reason}")
            pytest.skip(reason)
        backend = Backend("postgresql", base)
    monkeypatch.setattr(turn_module, "crash_point", interruption_point)
    monkeypatch.setattr(calls_module, "crash_point", interruption_point)
    monkeypatch.setattr(coordinator_module, "crash_point", interruption_point)
    monkeypatch.setattr(acceptance_module, "crash_point", interruption_point)
    monkeypatch.setattr(outbox_module, "crash_point", interruption_point)
    # the shell tool and cancel_shell import crash_point when they run (tool.after_dispatch, tool.before_cancel_kill)
    monkeypatch.setattr(faults_module, "crash_point", interruption_point)
    for module in (calls_module, tools_module, effect_files):
        monkeypatch.setattr(module, "asyncio", ModelAsyncio())
    monkeypatch.setattr(effect_files, "os", ModelOs())
    COVERED.clear()
    try:
        ENV = Env(base, backend)
        yield ENV
    finally:
        ENV = None
        SLEEPERS.close()
        if backend is not None:
            backend.cleanup()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow  # 2,000 histories on SQLite, 150 on PostgreSQL (about 3 and 1.5 min): skipped by `-m "not slow"` locally
def test_coordinator_model_over_random_histories(model_env: Env) -> None:
    histories = HISTORIES if model_env.backend is None else HISTORIES_PG
    run_state_machine_as_test(
        CoordinatorModel,
        # PostgreSQL's 150 histories are the fixed set Hypothesis draws under CI (its ci profile derandomizes),
        # here too, so a local run checks what CI checks; SQLite's 2,000 stay random outside CI
        settings=settings(max_examples=histories, stateful_step_count=STEPS, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), derandomize=model_env.backend is not None),
    )
    assert model_env.count >= histories
    # what the histories did (shown with -s); the model is not vacuous: each kind of event happened
    print(f"\n{model_env.count} histories:", dict(sorted(COVERED.items())))
    if model_env.backend is None and histories >= 2000:
        for seen in ("unknown outcome", "approval consumed", "denied", "decision repeated", "message repeated",
                     "machine restart", "recovery.after_claim", "recovery.after_decision", "control pause",
                     "control stop", "crash at provider.before_request", "input.before_accept", "input.after_accept",
                     "control.after_stop_commit", "goal achieved", "crash at goal.todo_complete_before_acceptance",
                     "crash at goal.after_completion_commit", "subtask result delivered", "receipt counted",
                     "ledger drained", "crash at usage.before_persist", "crash at usage.after_persist",
                     "lost request in the ledger", "crash at shutdown.after_admission_stop", "shutdown",
                     "permissions ask", "permissions bypass", "permissions refused", "dispatched under ask",
                     "command committed", "command cancelled", "crash at tool.before_cancel_kill",
                     "crash at tool.process_runs", "stopped command killed by the Coordinator", "cancel requested"):
            assert COVERED[seen], f"no history had {seen!r}: {COVERED}"
        assert sum(n for k, n in COVERED.items() if k.startswith("crash at tool.")), COVERED
        assert sum(n for k, n in COVERED.items() if k.startswith("crash at child.")), COVERED
        assert sum(n for k, n in COVERED.items() if k.startswith("cancelled at provider.")), COVERED
        assert sum(n for k, n in COVERED.items() if k.startswith("cancelled at tool.")), COVERED
    elif model_env.backend is not None and histories >= 150:
        # the events seen 10 times or more per 150 histories (the rarer ones are left to SQLite's 2,000; a
        # consumed approval, 0 to 11 per 150, is played on PostgreSQL every run by
        # test_a_scope_narrowed_while_a_call_waits_to_be_dispatched_makes_it_ask_first[postgresql])
        # (a repeated message is left to SQLite's 2,000 and to test_store.py's
        # test_repeated_client_request_id_returns_the_first_message_and_no_second_work_item[postgresql]: the
        # fixed PostgreSQL set draws none since this session's rules changed what each history enables)
        for seen in ("unknown outcome", "goal achieved", "subtask done", "receipt counted"):
            assert COVERED[seen], f"no history had {seen!r}: {COVERED}"
        assert sum(n for k, n in COVERED.items() if k.startswith("crash at ")), COVERED


# --------------------------------------------------------------------------- the histories that found bugs


@pytest.fixture
def machine(model_env: Env) -> Iterator[CoordinatorModel]:
    m = CoordinatorModel()
    try:
        yield m
    finally:
        m.teardown()


def until(m: CoordinatorModel, point: str) -> AttemptThread:
    """Claim the admitted attempt and run it to ``point`` (the invariants checked at each point)."""
    m._step_start()
    assert m._claim()
    m.check_invariants_after_each_step()
    t = m.live_threads()[-1]
    while t.point != point:
        go(m, t)
        assert not t.done, f"the attempt ended before {point}"
    return t


def go(m: CoordinatorModel, t: AttemptThread) -> None:
    m._step_start()
    t.advance()
    m.check_invariants_after_each_step()


def test_a_pause_committed_after_a_call_was_chosen_starts_no_tool(machine: CoordinatorModel) -> None:
    """Found by the model: the dispatch commit did not re-read the control, so a call chosen before a
    Pause (or Stop) committed by another process still started after it."""
    machine.some_work([(1, "write")], True)
    machine.check_invariants_after_each_step()
    t = until(machine, "tool.before_dispatch")
    machine.control(1, "pause", 1, False)
    machine.check_invariants_after_each_step()
    go(machine, t)
    assert t.done and not machine.env.log.exists()
    work = machine.rows("SELECT desired_state, phase FROM work_items")[0]
    assert (work["desired_state"], work["phase"]) == ("paused", "paused")
    assert [e["state"] for e in machine.rows("SELECT state FROM effects")] == ["planned"]


def test_work_resumed_while_its_paused_step_still_runs_is_not_shown_paused(machine: CoordinatorModel) -> None:
    """Found by the model: Resume during the paused item's last step left phase ``paused`` with intent ``run``."""
    machine.some_work([(0, "chat")], True)
    machine.check_invariants_after_each_step()
    until(machine, "provider.before_request")
    machine.control(0, "pause", 1, False)
    machine.check_invariants_after_each_step()
    machine.control(0, "resume", 1, False)
    work = machine.rows("SELECT desired_state, phase, reason_code FROM work_items")[0]
    assert (work["desired_state"], work["phase"], work["reason_code"]) == ("run", "working", "working")
    machine.check_invariants_after_each_step()


def test_a_session_runs_one_item_at_a_time_while_a_paused_or_stopped_step_ends(machine: CoordinatorModel) -> None:
    """Found by the model: a session's next item was admitted while the attempt of a paused (or stopped)
    item still ran, or before a resumed item that came earlier in the pass."""
    machine.some_work([(0, "chat"), (0, "chat")], True)
    machine.check_invariants_after_each_step()
    t = until(machine, "provider.before_request")
    machine.control(0, "pause", 1, True)  # the first item's step still runs: the second waits its turn
    assert len(machine.rows("SELECT work_id FROM attempts WHERE state IN ('admitted', 'running')")) == 1
    machine.check_invariants_after_each_step()
    while not t.done:  # the step ends: the attempt yields to the pause
        go(machine, t)
    machine.server("admit")  # now the second item goes
    machine.check_invariants_after_each_step()
    machine.control(0, "resume", 1, True)  # the first item again: not beside the second one's attempt
    assert len(machine.rows("SELECT work_id FROM attempts WHERE state IN ('admitted', 'running')")) == 1
    machine.check_invariants_after_each_step()
    until(machine, "provider.before_request")
    machine.control(0, "stop", 1, True)  # End: its step is being stopped; a new message waits for that
    machine.check_invariants_after_each_step()
    machine.send_message(0, "chat", False, 1, True)
    assert len(machine.rows("SELECT work_id FROM attempts WHERE state IN ('admitted', 'running')")) == 1
    machine.check_invariants_after_each_step()


@pytest.mark.parametrize("action", ["stop", "pause"])
def test_a_control_committed_before_a_goals_acceptance_review_sends_no_review(
    machine: CoordinatorModel, action: str
) -> None:
    """Found by the model: a Stop (or Pause) committed by another process after a Goal's candidate was
    submitted, before its acceptance review was recorded, still sent the review (a paid model request for
    work the person had stopped). Now the review is not recorded nor sent and the attempt yields: a
    stopped Goal is cancelled with its one record; a paused one, resumed, is reviewed and achieved."""
    machine.set_goal(True)
    machine.check_invariants_after_each_step()
    t = until(machine, "goal.todo_complete_before_acceptance")
    machine.control(CHATS, action, 1, False, 1)
    machine.check_invariants_after_each_step()
    go(machine, t)
    assert t.done
    assert not machine.rows("SELECT 1 FROM requests WHERE purpose = 'acceptance'")
    work = machine.rows("SELECT desired_state, phase FROM work_items")[0]
    goal = machine.rows("SELECT state FROM goals")[0]
    if action == "stop":
        assert (work["phase"], goal["state"]) == ("cancelled", "cancelled"), (work, goal)
        return
    assert (work["phase"], goal["state"]) == ("paused", "paused"), (work, goal)
    machine.control(CHATS, "resume", 1, True, 1)
    machine.check_invariants_after_each_step()
    t = machine.live_threads()[-1] if machine.live_threads() else until(machine, "goal.todo_complete_before_acceptance")
    while not t.done:
        go(machine, t)
    assert machine.rows("SELECT state FROM goals")[0]["state"] == "achieved"
    assert len(machine.rows("SELECT 1 FROM requests WHERE purpose = 'acceptance'")) == 1


def test_a_receipt_the_ledger_holds_when_the_server_dies_is_not_counted_again(machine: CoordinatorModel) -> None:
    """The server dies after usage.db committed a receipt, before control.db marked it done: the next
    pass applies the operation again, and the ledger still counts the answer once."""
    machine.send_message(2, "chat", False, 1, True)
    go_on(until(machine, "provider.before_request"))
    machine.check_invariants_after_each_step()
    machine.ledger("usage.after_persist", 1)  # the request's attribution, then its receipt: dies after it
    machine.check_invariants_after_each_step()
    assert machine.counted  # in the ledger, yet its done mark was lost:
    assert [r["op_key"] for r in machine.rows("SELECT op_key FROM outbox WHERE state = 'pending'")] == \
        [f"receipt:{r}" for r in machine.counted]
    machine.ledger("")
    machine.check_invariants_after_each_step()
    assert machine.counted and not machine.rows("SELECT op_key FROM outbox WHERE state = 'pending'")


def test_a_scope_narrowed_while_a_call_waits_to_be_dispatched_makes_it_ask_first(machine: CoordinatorModel) -> None:
    """A write chosen under bypass, its session switched to ask before the dispatch commit: the call is not
    started; the attempt yields and the call waits for a person's approval under the new scope."""
    machine.send_message(1, "write", False, 1, True)
    t = until(machine, "tool.before_dispatch")
    machine.permissions(1, "ask", 1, False)
    machine.check_invariants_after_each_step()
    go_on(t)
    machine.check_invariants_after_each_step()
    assert not machine.runs()[1]  # nothing ran
    machine.server("admit")
    assert machine._claim()  # the new attempt asks at once (its permission step ends it)
    for live in machine.live_threads():
        go_on(live)
    machine.check_invariants_after_each_step()
    [approval] = machine.rows("SELECT state FROM approvals")
    assert approval["state"] == "pending" and not machine.runs()[1]
    # the person approves: the call runs once under the approval, which is consumed (the invariants check
    # it at each step; on PostgreSQL too, where the random histories reach a consumed approval less often)
    machine.decide_approval(0, "approve", True, 1)
    machine.check_invariants_after_each_step()
    assert machine._claim()
    for live in machine.live_threads():
        go_on(live)
    machine.check_invariants_after_each_step()
    [approval] = machine.rows("SELECT state FROM approvals")
    assert approval["state"] == "consumed" and sum(machine.runs()[1].values()) == 1


def test_a_stopped_command_whose_worker_and_then_server_die_before_the_kill_is_killed_once_and_never_rerun(
    machine: CoordinatorModel,
) -> None:
    """A shell command runs; its work is stopped; its worker dies before its watch saw the stop, then the
    server dies in the Coordinator's sweep at ``tool.before_cancel_kill``: the next server kills it, commits
    it ``cancelled`` (never unknown, never run again), and the stopped work ends."""
    machine.some_work([], False, "command orphaned by a stop")
    [d] = commands()
    assert alive(d)
    machine.server("tool.before_cancel_kill")  # the sweep dies before its kill; the new server's sweep kills
    assert COVERED["server died at tool.before_cancel_kill"] == 1
    machine.check_invariants_after_each_step()
    assert not group_members(d)
    [eff] = machine.rows("SELECT state, result FROM effects WHERE tool = 'shell'")
    assert eff["state"] == "cancelled" and "stopped the work" in eff["result"], eff
    assert machine.runs()[1] == Counter({d.name: 1})
    machine.server("recover")
    machine.check_invariants_after_each_step()
    [work] = machine.rows("SELECT desired_state, phase FROM work_items")
    assert (work["desired_state"], work["phase"]) == ("cancelled", "cancelled"), work
    assert machine.runs()[1] == Counter({d.name: 1})
