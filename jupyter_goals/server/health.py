"""``GET /health``: the server's status, each database's state with what a person can do about it,
the workers, the last recovery pass and the open event streams. It answers while the server starts or
is degraded (every other route then answers 503), and reads without writing.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import RecoveryMode
from jupyter_goals.server import answers as a
from jupyter_goals.server.startup import STORAGE_CORRUPT, USAGE_DB_MISSING, Stores, redact, storage_action
from jupyter_goals.store.db import StorageUnavailable


class StorageProblem(a.Answer):
    """Why a database is not ok, and what a person can do (``action``)."""

    code: str
    message: str
    action: str | None = a.omitted()
    checked_at: float | None = a.omitted("when a start try last looked at the control store")


class LedgerRepair(a.Answer):
    """The last rebuild of the usage ledger after usage.db was lost."""

    code: str
    message: str
    operations: int | None
    since: float
    repaired_at: float


class DatabaseHealth(a.Answer):
    url: str
    ok: bool
    error: StorageProblem | None = a.omitted()
    repaired: LedgerRepair | None = a.omitted()


class Databases(a.Answer):
    control: DatabaseHealth
    usage: DatabaseHealth


class WorkerProcess(a.Answer):
    worker_id: str
    pid: int


class RecoveryError(a.Answer):
    code: str
    message: str


class WaitNotice(a.Answer):
    wait_id: str
    work_id: str
    woke: bool
    refused: str


class LastRecovery(a.Answer):
    """The last recovery pass (empty before the first one): what it found and did, or why it failed."""

    at: float | None = a.omitted()
    error: RecoveryError | None = a.omitted()
    reconciled: list[str] | None = a.omitted()
    cancelled: list[str] | None = a.omitted()
    notified: list[WaitNotice] | None = a.omitted()
    dead_workers: list[str] | None = a.omitted()
    recovered: dict[str, RecoveryMode] | None = a.omitted()
    decisions: dict[str, str] | None = a.omitted()
    admitted: list[str] | None = a.omitted()
    charged: dict[str, str] | None = a.omitted()
    taken_over: list[str] | None = a.omitted("work ids taken over from a host whose leases expired (allow_cross_host_takeover)")


class Health(a.Answer):
    """``status``: ok, degraded (``reason_code`` says why; each database its error and action) or
    starting (other routes answer 503 ``starting`` meanwhile)."""

    status: Literal["ok", "degraded", "starting"]
    reason_code: str
    databases: Databases
    workers: list[WorkerProcess]
    recovery: LastRecovery
    admission_open: bool
    event_streams: int
    host_name: str
    boot_id: str


LEDGER_REBUILDING = ("Nothing to do: the ledger is being rebuilt from control.db by itself; usage totals are "
                     "incomplete until then. Receipts are never counted twice.")


async def health(stores: Stores, *, workers: list[dict[str, Any]], recovery: dict[str, Any],
                 admission_open: bool, event_streams: int) -> Health:
    # a write or read that failed at run time (disk full, a lock held past the busy timeout, an
    # unreadable file), rechecked now without writing: the state, the reason and what to do
    control = stores.control
    problems = await asyncio.to_thread(control.recheck) if control.problems else {}
    problem = problems.get("write") or problems.get("read")
    corruption = await stores.corruption_rechecked()
    if corruption is not None:  # a damaged file outranks what an empty transaction could not see
        problem = StorageUnavailable(corruption, STORAGE_CORRUPT)
    lost = stores.usage_lost
    if lost is None and stores.started and stores.usage_ready:  # said at once; the outbox loop rebuilds it
        reason = await stores.usage_file_changed()
        if reason is not None:
            lost = {"code": USAGE_DB_MISSING, "message": reason}
    config = stores.config
    control_db = DatabaseHealth(url=redact(config.control_db_url), ok=stores.degraded is None and problem is None)
    usage_db = DatabaseHealth(url=redact(config.usage_db_url), ok=stores.usage_degraded is None and lost is None)
    if stores.degraded is not None:
        control_db.error = StorageProblem(code=stores.degraded.code.value, message=str(stores.degraded))
        if stores.migration_action is not None:
            control_db.error.action = stores.migration_action
            control_db.error.checked_at = stores.control_checked_at  # tried again meanwhile
    elif problem is not None:
        control_db.error = StorageProblem(code=problem.code, message=str(problem),
                                            action=storage_action(problem.code, config.control_db_url))
    if stores.usage_degraded:
        usage_db.error = StorageProblem(code="storage_unavailable", message=stores.usage_degraded)
    elif lost is not None:
        usage_db.error = StorageProblem(code=lost["code"], message=lost["message"], action=LEDGER_REBUILDING)
    if stores.usage_repaired is not None:
        usage_db.repaired = LedgerRepair.model_validate(
            {k: stores.usage_repaired[k] for k in ("code", "message", "operations", "since", "repaired_at")})
    ok = stores.degraded is None and problem is None and stores.usage_degraded is None and lost is None
    status = "ok" if ok else "degraded"
    if stores.degraded is None and not stores.started:
        status = "starting"
    reason = stores.degraded.code.value if stores.degraded else (problem.code if problem is not None else "")
    if not reason and lost is not None and not stores.usage_degraded:
        reason = lost["code"]
    return Health.model_validate({
        "status": status,
        "reason_code": reason or ("" if stores.started else "starting"),
        "databases": Databases(control=control_db, usage=usage_db),
        "workers": workers,
        "recovery": recovery,
        "admission_open": admission_open,
        "event_streams": event_streams,
        "host_name": host_name(),
        "boot_id": boot_id(),
    })
