"""A fault-injecting store for tests, as Temporal's persistence tests wrap every store interface.

``FaultyDatabase`` is a real :class:`~jupyter_goals.store.db.Database` (same constructor plus a
``plan``; a real SQLite file, real migrations, the real ``transact``): only its connection is wrapped,
to see each ``BEGIN``, ``COMMIT`` and ``ROLLBACK``. A :class:`FaultPlan` names a store transition —
``"<module>.<function>"`` of ``jupyter_goals.store`` (``effects.mark_dispatched``,
``usage.apply_receipt``, ``requests.outbox_done``, ``recovery.charge_death``, …) — and how the commit
of the next write transaction that reached it fails:

- ``before_commit``: the commit is refused, the transaction rolls back, the caller gets
  :class:`InjectedFault` (a ``StorageUnavailable``, like a connection dropped before COMMIT);
- ``ack_lost``: COMMIT runs, then the caller gets :class:`InjectedFault`: the change is durable but
  the acknowledgement is lost (the connection is reset, as after a dropped connection);
- ``lock_timeout``: nothing is committed and the caller gets SQLite's own
  ``sqlite3.OperationalError("database is locked")``: the transaction is rolled back and taken again
  with no busy timeout while another connection holds the write lock, exactly what a writer sees when
  the busy timeout runs out at ``BEGIN IMMEDIATE``.

How a transaction is known to have reached a transition: the plan replaces the store function's
module attribute (pytest's ``monkeypatch``) with a wrapper that, once the function returns, marks the
connection of its ``tx``, both in its aggregate module and in the facade ``store/control.py`` that
re-exports it. Every caller goes through a module attribute (``c.mark_dispatched(tx, …)`` with
``from jupyter_goals.store import control as c``), and so do calls inside a store module (a
module global is looked up at call time), so the plan sees every call, on whichever thread the
transaction runs; ``watch`` refuses a transition that some module imported by name (``from … import
emit``), whose calls it could not see. A call from a plain ``Database`` is not marked: only a ``FaultyDatabase`` fails.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import pytest

from jupyter_goals.store import control
from jupyter_goals.store.db import Database, StorageUnavailable, Tx

FaultKind = Literal["before_commit", "ack_lost", "lock_timeout"]
KINDS: tuple[FaultKind, ...] = ("before_commit", "ack_lost", "lock_timeout")


class InjectedFault(StorageUnavailable):
    """A failure the plan injected (never raised by the product itself)."""


@dataclass
class Fault:
    transition: str
    kind: FaultKind
    times: int  # how many commits fail; then the transition commits normally again
    when: Callable[..., bool] | None = None  # called with the store function's arguments after ``tx``
    fired: int = 0

    @property
    def armed(self) -> bool:
        return self.fired < self.times


@dataclass
class FaultPlan:
    """Which transitions fail, how, and how often; what fired (``fired``) and what was reached (``reached``)."""

    monkeypatch: pytest.MonkeyPatch
    faults: list[Fault] = field(default_factory=list)
    fired: list[tuple[str, FaultKind]] = field(default_factory=list)
    reached: dict[str, int] = field(default_factory=dict)  # commits of write transactions that reached it
    _wrapped: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, transition: str, kind: FaultKind, *, times: int = 1,
             when: Callable[..., bool] | None = None) -> Fault:
        """The next ``times`` write transactions that reach ``transition`` (and, with ``when``, whose
        call satisfies it) fail at commit in the way ``kind`` says."""
        assert kind in KINDS, kind
        self.watch(transition)
        fault = Fault(transition, kind, times, when)
        self.faults.append(fault)
        return fault

    def watch(self, transition: str) -> None:
        """Count commits of the transition (``reached``) without failing any."""
        if transition in self._wrapped:
            return
        module_name, _, name = transition.rpartition(".")
        module = importlib.import_module(f"jupyter_goals.store.{module_name}")
        original = getattr(module, name)
        assert callable(original), transition
        # the facade (``store/control.py``) re-exports the aggregates' names: wrapped there too, so calls
        # through ``c.<name>`` are seen as well as those inside the store
        facade = [control] if vars(control).get(name) is original else []
        for other in _product_modules():  # a caller holding the function itself would not be seen
            if other is not module and other is not control and vars(other).get(name) is original:
                raise AssertionError(f"{other.__name__} imports {name} by name: the plan cannot see its calls")

        def wrapper(tx: Tx, *args: Any, **kwargs: Any) -> Any:
            result = original(tx, *args, **kwargs)
            conn = getattr(tx, "_conn", None)
            if isinstance(conn, FaultyConnection):
                conn.marks.append((transition, args, kwargs))
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        for holder in (module, *facade):
            self.monkeypatch.setattr(holder, name, wrapper)
        self._wrapped.add(transition)

    def count(self, transition: str) -> int:
        return sum(1 for t, _ in self.fired if t == transition)

    def _due(self, marks: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Fault | None:
        """Called at a write transaction's COMMIT with what it reached: the fault to apply, if any."""
        with self._lock:
            for transition, _, _ in marks:
                self.reached[transition] = self.reached.get(transition, 0) + 1
            for fault in self.faults:
                if not fault.armed:
                    continue
                for transition, args, kwargs in marks:
                    if transition == fault.transition and (fault.when is None or fault.when(*args, **kwargs)):
                        fault.fired += 1
                        self.fired.append((fault.transition, fault.kind))
                        return fault
        return None


@functools.cache
def _product_modules() -> list[ModuleType]:
    """Every module of the product, imported (a module not yet loaded could still call a transition)."""
    import jupyter_goals

    modules = []
    for info in pkgutil.walk_packages(jupyter_goals.__path__, "jupyter_goals."):
        if info.name.endswith(".__main__"):
            continue  # a program's entry point runs when imported
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError:
            continue  # an optional extra that is not installed (the Jupyter AI persona): it holds no transition
    return modules


class FaultyConnection:
    """A sqlite3 connection that applies the plan at COMMIT; everything else goes to the real one."""

    def __init__(self, conn: sqlite3.Connection, db: FaultyDatabase) -> None:
        self._real = conn
        self._db = db
        self.marks: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.writing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        head = sql.lstrip()[:16].upper()
        if head.startswith("BEGIN"):
            self.marks = []
            self.writing = "IMMEDIATE" in head
        elif head.startswith("ROLLBACK") and not head.startswith("ROLLBACK TO"):
            self.marks = []
        elif head.startswith("COMMIT"):
            marks, self.marks = self.marks, []
            fault = self._db.plan._due(marks) if self.writing else None
            if fault is not None:
                return self._fail(fault)
        return self._real.execute(sql, params)

    def _fail(self, fault: Fault) -> sqlite3.Cursor:
        what = f"{fault.transition} ({fault.kind}, injected)"
        if fault.kind == "before_commit":
            raise InjectedFault(f"connection lost before COMMIT of {what}")  # transact rolls back
        if fault.kind == "ack_lost":
            self._real.execute("COMMIT")
            raise InjectedFault(f"connection lost after COMMIT of {what}: the change is durable")
        self._real.execute("ROLLBACK")
        assert self._db.path is not None
        blocker = sqlite3.connect(self._db.path, isolation_level=None, timeout=10)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock for longer than we wait
            self._real.execute("PRAGMA busy_timeout=0")
            try:
                self._real.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                assert "locked" in str(exc), exc
                raise
            raise AssertionError("the write lock was not held")  # pragma: no cover
        finally:
            self._real.execute(f"PRAGMA busy_timeout={int(self._db.busy_timeout_ms)}")
            blocker.execute("ROLLBACK")
            blocker.close()


class FaultyDatabase(Database):
    """A real SQLite ``Database`` whose write transactions fail as ``plan`` says."""

    def __init__(self, url: str, *, plan: FaultPlan, inline: bool = False, busy_timeout_ms: int = 10000) -> None:
        super().__init__(url, inline=inline, busy_timeout_ms=busy_timeout_ms)
        assert self.dialect == "sqlite", "fault injection wraps SQLite connections"
        self.plan = plan

    def _connect(self, lane: str = "jupyter-goals-db") -> Any:
        return FaultyConnection(super()._connect(lane), self)
