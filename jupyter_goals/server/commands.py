"""The writes behind the REST routes: sessions, messages, controls, approvals, Goals, Jobs and notebook
bindings. Each commits in one transaction before it answers (so a 2xx means durable), then wakes the
admission loop; the interruption points around the commits (``input.*``, ``control.after_stop_commit``)
let the crash tests stop the server exactly there.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any

from jupyter_goals import faults
from jupyter_goals.config import GoalsConfig
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.host.effect_files import shell_alive, shell_result_text
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.identity import host_name
from jupyter_goals.models import (
    CreateGoal,
    CreateJob,
    CreateSession,
    GoalAction,
    NotebookSession,
    PostMessage,
    ReasonCode,
    SessionAction,
    SettleOutcome,
    UpdateGoal,
    UpdateSession,
)
from jupyter_goals.recovery import takeover
from jupyter_goals.recovery.repair import late_receipt_text
from jupyter_goals.runtime.tools import ToolRegistry, cancellable
from jupyter_goals.server import answers as a
from jupyter_goals.server.catalog import ModelCatalog
from jupyter_goals.server.params import session_folder
from jupyter_goals.server.queries import Queries
from jupyter_goals.server.startup import Stores, WatchedDatabase
from jupyter_goals.store import control as c
from jupyter_goals.store import notebooks, waits
from jupyter_goals.store.db import Row, Tx


def default_permissions() -> dict[str, Any]:
    return {"mode": "ask", "allow": []}


class Commands:
    def __init__(self, config: GoalsConfig, stores: Stores, queries: Queries, catalog: ModelCatalog,
                 registry: ToolRegistry, wake: Callable[[], None]) -> None:
        self.config = config
        self.stores = stores
        self.queries = queries
        self.catalog = catalog
        self.registry = registry
        self.wake = wake  # after a commit that may create work: the admission loop runs now

    @property
    def control(self) -> WatchedDatabase:
        return self.stores.control

    # ------------------------------------------------------------------ sessions
    async def create_session(self, body: CreateSession, root_dir: str, by: str | None = None) -> a.SessionCreated:
        """A new session; its folder is ``body.cwd`` (absolute, or relative to the server's root directory
        ``root_dir``), and the root directory itself when none is given — never the server process's cwd.
        Its allow rules are recorded as added by ``by`` (the Jupyter user) with the session."""
        self.stores.check()
        cwd = session_folder(body.cwd, root_dir)
        model = self.catalog.resolve(body.model) if body.model else self.catalog.default_model  # UnknownModel → 400
        perms = body.permissions.model_dump() if body.permissions else default_permissions()

        def run(tx: Tx) -> Row:
            row = c.create_session(tx, body.title or "Untitled chat", cwd, model, perms)
            c.record_allow_rules(tx, row["session_id"], [], perms.get("allow") or [], by, "created", row["created_at"])
            return row

        row = await self.control.run(run)
        snapshot = await self.queries.snapshot(row["session_id"])
        # contract (DESIGN §10): 201 {session_id, …}; the snapshot nests it under "session"
        return a.SessionCreated(session_id=row["session_id"], **dict(snapshot))

    async def update_session(self, session_id: str, body: UpdateSession, by: str | None = None) -> a.Snapshot:
        """Rename the session or change its model (a name of ``GET /models`` or ``provider:model``, as
        ``POST /sessions`` reads it; empty: the server's default), in one transaction with a change of the
        permission scope (unfinished work follows it, pending approvals are voided). A new model applies
        from the session's next turn (``store/sessions.turn_model``). An allow rule the change adds is recorded
        as added by ``by`` (the Jupyter user), now."""
        self.stores.check()
        model = None if body.model is None else self.catalog.resolve(body.model) if body.model \
            else self.catalog.default_model  # UnknownModel → 400, before anything is written
        perms = body.permissions.model_dump() if body.permissions else None

        def run(tx: Tx) -> None:
            c.update_session(tx, session_id, title=body.title, model=model)  # 404 for an unknown session
            if perms is not None:
                c.change_permissions(tx, session_id, perms, body.expected_control_version, by)

        await self.control.run(run)
        self.wake()  # a new model or scope can let waiting work run (resource_missing.model, approvals)
        return await self.queries.snapshot(session_id)

    async def post_message(self, session_id: str, body: PostMessage) -> tuple[a.MessageAccepted, bool]:
        self.stores.check()
        faults.crash_point("input.before_accept")

        def run(tx: Tx) -> tuple[Row, bool]:
            s = c.get_session(tx, session_id)
            delivery = goal_lifecycle.message_delivery(tx, session_id, body.delivery)  # user input outranks continuation
            return c.accept_message(tx, s, body.text, body.client_request_id, delivery,
                                    auto_recover=self.config.auto_recover, host=host_name())

        msg, created = await self.control.run(run)
        faults.crash_point("input.after_accept")
        self.wake()
        return a.MessageAccepted(message_id=msg["message_id"], work_id=msg["work_id"], delivery=msg["delivery"]), created

    async def session_action(self, session_id: str, body: SessionAction, by: str = "") -> a.SessionActionAnswer:
        """``by``: who asked (the Jupyter user), recorded with a takeover."""
        self.stores.check()
        if body.action == "cancel_tool":  # never the control path below: it has no cancel_tool
            return a.SessionActionAnswer(await self._cancel_tool(session_id, body.effect_id or ""))
        if body.action == "takeover":
            return a.SessionActionAnswer(await self._take_over_session(session_id, by))
        if body.action == "settle" and body.outcome is not None:  # the model requires the outcome with settle
            return a.SessionActionAnswer(await self._settle(session_id, body.effect_id or "", body.outcome, by))
        action = body.action

        def run(tx: Tx) -> Row:
            c.get_session(tx, session_id)
            work = c.current_work(tx, session_id)
            if work is None:  # the session exists: its state, not its id, refuses the action
                raise c.VersionConflict(f"session {session_id} has no work to {action}")
            if action == "stop":
                # End applies to the whole session: everything queued behind it stops too
                for other in c.unfinished_work_of_session(tx, session_id, except_work_id=work["work_id"]):
                    c.apply_control(tx, other, "stop", None)
                    goal_lifecycle.sync_with_work(tx, other, "stop")
            if action == "retry" and work["reason_code"] == ReasonCode.TOOL_CHANGED:
                # the person accepts the new implementations: planned calls are bound to them
                c.rebind_planned_calls(tx, work, {n: (s.identity, s.digest) for n, s in self.registry.tools.items()})
            work = c.apply_control(tx, work, action, body.expected_control_version)
            goal_lifecycle.sync_with_work(tx, work, action)  # a Goal's work item moves its Goal too
            return work

        work = await self.control.run(run)
        if action == "stop":
            faults.crash_point("control.after_stop_commit")
        self.wake()
        return a.SessionActionAnswer(a.ControlApplied.model_validate(
            {k: work[k] for k in ("work_id", "control_version", "desired_state", "phase")}))

    async def _cancel_tool(self, session_id: str, effect_id: str) -> a.ToolCancelRequested:
        def cancel(tx: Tx) -> Row:
            eff = c.request_cancel_tool(tx, session_id, effect_id)  # 404 unknown, 409 not running
            if not cancellable(eff["tool"]):  # raising undoes the request: nothing is recorded
                raise c.VersionConflict(
                    f"tool call {eff['call_id']} ({eff['tool']}) cannot be cancelled: only a running shell"
                    " command can; this call ends by itself")
            return eff

        eff = await self.control.run(cancel)
        return a.ToolCancelRequested(effect_id=eff["effect_id"], call_id=eff["call_id"], cancel_requested=True)

    async def _settle(self, session_id: str, effect_id: str, outcome: SettleOutcome, by: str) -> a.EffectSettled:
        """``settle``: a person says whether a call whose outcome is unknown ran (``ran`` / ``did_not_run``),
        or asks that its evidence be read again (``check``: a shell command's exit file, on the host that ran
        it). One transaction records the reconciliation and withdraws the approvals asked only because of
        it (``store/effects.settle_effect``). 404 no such session or call; 409 another session's call, an
        outcome no longer unknown, or (``check``) no probe here or no evidence found."""
        who = by or "a user"

        def find(tx: Tx) -> tuple[Row, str | None]:
            c.get_session(tx, session_id)  # 404 for an unknown session
            eff = c.effect_to_settle(tx, session_id, effect_id)
            return eff, c.shell_call_host(tx, eff) if eff["tool"] == "shell" else None

        eff, host = await self.control.run(find, write=False)
        evidence: str | None = None
        names: tuple[str, ...] = ()
        if outcome == "check":
            evidence, names = await self._evidence(eff, host)

        def settle(tx: Tx) -> tuple[Row, float, list[str]]:
            now = c.effect_to_settle(tx, session_id, effect_id)  # a late receipt or another answer may be first
            at, withdrawn = c.settle_effect(tx, now, outcome, who, evidence, names)
            return now, at, withdrawn

        settled, at, withdrawn = await self.control.run(settle)
        self.wake()  # a withdrawn approval's work is queued again
        return a.EffectSettled(effect_id=settled["effect_id"], call_id=settled["call_id"], tool=settled["tool"],
                               state="reconciled", outcome=outcome, settled_by=who, settled_at=at, withdrawn=withdrawn)

    @functools.cached_property
    def redactor(self) -> Redactor:
        """Evidence read again is tool output: credentials never reach the transcript (as a late receipt)."""
        return Redactor.from_environment(extra=self.config.secrets)

    async def _evidence(self, eff: Row, host: str | None) -> tuple[str, tuple[str, ...]]:
        """``check``: a shell command's real result, read again from its exit file (redacted); 409 when no
        probe exists here (not a shell command, or another host's) or when it left no exit status."""
        call = f"{eff['tool']} ({eff['call_id']})"
        if host is None:
            raise c.VersionConflict(f"{call} cannot be checked again: only a shell command's exit file can be read;"
                                    " say whether it ran")
        if host != host_name():
            raise c.VersionConflict(f"{call} ran on host {host}: its files are there, not on {host_name()};"
                                    " check from that host's server or say whether it ran")
        effect_dir = self.config.state_dir / "effects" / eff["effect_id"]
        text = await asyncio.to_thread(shell_result_text, effect_dir)
        if text is None:
            running = await asyncio.to_thread(shell_alive, effect_dir)
            raise c.VersionConflict(f"No evidence was found: {call} left no exit status"
                                    + (" (its process still runs)" if running else "")
                                    + "; its outcome stays unknown. Say whether it ran, or check again later.")
        clean = self.redactor.redact(late_receipt_text(eff["call_id"], text))
        return clean.text, tuple(clean.names)

    async def stop_all(self) -> a.StopAllAnswer:
        self.stores.check()
        stopped = await self.control.run(c.stop_all)
        faults.crash_point("control.after_stop_commit")  # the intent is durable; kills follow (worker, sweep)
        self.wake()
        return a.StopAllAnswer(stopped=stopped)

    async def take_over(self, from_host: str, by: str) -> a.TakeoverAnswer:
        """``POST /actions {action: takeover, host}``: every unfinished work item of the lost host
        ``from_host`` moves to this host (``recovery/takeover.py``; 409 and nothing moved when the host is
        reachable or a session's folder is missing here)."""
        self.stores.check()
        me = host_name()
        moved = await self.control.run(lambda tx: takeover.take_over(
            tx, from_host=from_host, to_host=me, by=f"{by or 'a user'} on {me}", claimant=takeover.claimant()))
        self.wake()
        return a.TakeoverAnswer(taken=moved.taken)

    async def _take_over_session(self, session_id: str, by: str) -> a.TakeoverAnswer:
        """A session's ``takeover``: its work (and its subtasks') moves from its lost host to this one."""
        me = host_name()

        def run(tx: Tx) -> takeover.Takeover:
            c.get_session(tx, session_id)  # 404 for an unknown session
            work = c.current_work(tx, session_id)
            if work is None or work["host_name"] == me:
                raise c.VersionConflict(f"session {session_id} has no work of another host to take over")
            return takeover.take_over(tx, from_host=work["host_name"], to_host=me, by=f"{by or 'a user'} on {me}",
                                      claimant=takeover.claimant(), session_id=session_id)

        moved = await self.control.run(run)
        self.wake()
        return a.TakeoverAnswer(taken=moved.taken)

    async def decide_approval(self, approval_id: str, decision: str, always: bool = False,
                              by: str | None = None) -> a.ApprovalDecided:
        """Approve or deny a pending call; ``always`` (with approve) also adds its tool to the session's allow
        rules, recorded as added by ``by`` through the approval, in the same transaction."""
        self.stores.check()

        def run(tx: Tx) -> Row:
            row = c.decide_approval(tx, approval_id, decision)
            permissions = dict(c.get_session(tx, row["session_id"])["permissions"]) if always else {}
            allow = list(permissions.get("allow") or [])
            if always and row["tool"] not in allow:
                c.change_permissions(tx, row["session_id"], {**permissions, "allow": [*allow, row["tool"]]}, None,
                                     by, "approval")
            return row

        row = await self.control.run(run)
        self.wake()
        return a.ApprovalDecided(approval_id=approval_id, state=row["state"])

    # ------------------------------------------------------------------ Jobs
    async def create_job(self, body: CreateJob) -> tuple[a.JobAccepted, bool]:
        """Commit the Job (its work item, saved Goal identity and permissions) before answering 202."""
        self.stores.check()
        faults.crash_point("input.before_accept")
        job, created = await self.control.run(lambda tx: waits.create_job(
            tx, body.session_id, body.input, body.goal_id, body.client_request_id, host=host_name(),
            auto_recover=self.config.auto_recover))
        faults.crash_point("input.after_accept")
        self.wake()
        return a.JobAccepted(job_id=job["job_id"], work_id=job["work_id"], session_id=job["session_id"]), created

    # ------------------------------------------------------------------ Goals
    async def create_goal(self, body: CreateGoal) -> a.Goal:
        """Commit the objective, requirements, budget and the Goal's work item before answering 201; a
        repeated ``client_request_id`` of the session answers the Goal it created (201, the same body)."""
        self.stores.check()
        faults.crash_point("input.before_accept")
        budget = body.budget.model_dump(exclude_none=True) if body.budget else {}

        def run(tx: Tx) -> Row:
            session = c.get_session(tx, body.session_id)
            return goal_lifecycle.create(tx, session, body.objective, body.requirements, budget, host=host_name(),
                                         auto_recover=self.config.auto_recover,
                                         client_request_id=body.client_request_id)  # a repeat: the same Goal

        try:
            answer = await self.queries.goal_answer(run, write=True)
        except Exception as exc:
            # another server of a shared store committed the same id first (its unique index): answer that Goal
            if body.client_request_id is None or not self.control.is_integrity_error(exc):
                raise
            answer = await self.queries.goal_answer(run, write=True)
        faults.crash_point("input.after_accept")
        self.wake()
        return answer

    async def update_goal(self, goal_id: str, body: UpdateGoal) -> a.Goal:
        self.stores.check()
        budget = body.budget.model_dump(exclude_none=True) if body.budget else None
        answer = await self.queries.goal_answer(lambda tx: goal_lifecycle.revise(
            tx, goal_id, body.expected_revision, objective=body.objective, requirements=body.requirements,
            budget=budget, reason=body.reason), write=True)
        self.wake()
        return answer

    async def goal_action(self, goal_id: str, body: GoalAction) -> a.Goal:
        self.stores.check()
        answer = await self.queries.goal_answer(
            lambda tx: goal_lifecycle.act(tx, goal_id, body.action, body.expected_revision), write=True)
        if body.action == "end":
            faults.crash_point("control.after_stop_commit")
        self.wake()
        return answer

    # ------------------------------------------------------------------ notebooks
    async def notebook_session(self, body: NotebookSession, path: str, root_dir: str,
                               by: str | None = None) -> tuple[a.NotebookBinding, bool]:
        """The session bound to the notebook at API ``path`` (created on first use, cwd = the notebook's
        folder), or ``body.session_id`` bound to it. One row per path in control.db. A folder's key
        (``work/``, ``./`` for the root: kernels that cannot know their notebook) gets the folder as cwd."""
        self.stores.check()
        if body.session_id:
            sid = body.session_id
            row = await self.control.run(lambda tx: notebooks.bind(tx, path, sid))
            return a.NotebookBinding.model_validate(notebooks.view(row)), False
        folder = os.path.normpath(os.path.join(root_dir, os.path.dirname(path)))  # noqa: ASYNC240 - no disk access
        cwd = folder if await asyncio.to_thread(os.path.isdir, folder) else root_dir
        model = self.catalog.resolve(body.model) if body.model else self.catalog.default_model  # names as POST /sessions
        perms = body.permissions.model_dump() if body.permissions else default_permissions()
        title = body.title or (os.path.basename(folder) + "/" if path.endswith("/") else os.path.basename(path))
        row, created = await self.control.run(lambda tx: notebooks.get_or_create(tx, path, title, cwd, model, perms, by))
        return a.NotebookBinding.model_validate(notebooks.view(row)), created

    async def notebook_renamed(self, old: str, new: str) -> int:
        """Follow the contents manager's rename (``old`` and ``new`` are API paths)."""
        if self.stores.degraded is not None or not self.stores.started:
            return 0
        return int(await self.control.run(lambda tx: notebooks.rename(tx, old.strip("/"), new.strip("/"))))
