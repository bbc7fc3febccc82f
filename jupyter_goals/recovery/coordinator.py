"""The Coordinator: the one idempotent recovery and admission entry point (DESIGN §8).

``recover()`` is called at server start, when the supervisor sees a worker exit, on every reconcile
tick and by ``jupyter goals recover``. It (1) confirms executor ownership and fences the dead,
(2) claims each interrupted work item, repairs its context and records exactly one recovery mode,
(3) runs ``decide()`` for every unfinished work item without a live attempt and (4) admits runnable
work round-robin across sessions under ``max_concurrent_turns``. Repeating any step is harmless.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_goals import budget
from jupyter_goals.faults import crash_point
from jupyter_goals.goals.lifecycle import goal_wait
from jupyter_goals.identity import ProcessIdentity
from jupyter_goals.models import DesiredState, EffectState, ItemKind, Phase, ReasonCode, TurnState
from jupyter_goals.prices import PriceTable
from jupyter_goals.providers.base import check_model
from jupyter_goals.recovery.decide import Action, Owner, RecoveryFacts, decide
from jupyter_goals.recovery.repair import late_receipt_text, placeholder_text
from jupyter_goals.runtime.tools import ToolRegistry, shell_alive, shell_result_text
from jupyter_goals.store import control as c
from jupyter_goals.store import waits
from jupyter_goals.store.db import Database, Row, Tx, VersionConflict


@dataclass
class RecoveryReport:
    dead_workers: list[str] = field(default_factory=list)
    recovered: dict[str, str] = field(default_factory=dict)  # work_id -> mode
    decisions: dict[str, str] = field(default_factory=dict)  # work_id -> action/reason
    admitted: list[str] = field(default_factory=list)
    charged: dict[str, str] = field(default_factory=dict)  # work_id -> worker whose death it was charged with
    reconciled: list[str] = field(default_factory=list)  # call ids whose late receipt was appended
    notified: list[dict[str, Any]] = field(default_factory=list)  # missed wait notifications found

    def as_dict(self) -> dict[str, Any]:
        return {
            "reconciled": self.reconciled,
            "notified": self.notified,
            "dead_workers": self.dead_workers,
            "recovered": self.recovered,
            "decisions": self.decisions,
            "admitted": self.admitted,
            "charged": self.charged,
        }


def recovery_backoff(attempts: int, base: float, cap: float = 300.0) -> float:
    """No delay for the first recovery; growing delays for a work item that keeps killing workers."""
    return 0.0 if attempts <= 1 else float(min(cap, base * 2 ** (attempts - 2)))


class Coordinator:
    def __init__(
        self,
        db: Database,
        *,
        state_dir: Path,
        default_model: str,
        registry: ToolRegistry,
        max_concurrent_turns: int = 4,
        allow_cross_host_takeover: bool = False,
        max_recovery_attempts: int = 5,
        recovery_backoff_s: float = 1.0,
        prices: PriceTable | None = None,
    ) -> None:
        self.db = db
        self.state_dir = state_dir
        self.default_model = default_model
        self.registry = registry
        self.max_concurrent_turns = max_concurrent_turns
        self.allow_cross_host_takeover = allow_cross_host_takeover
        self.max_recovery_attempts = max_recovery_attempts
        self.recovery_backoff_s = recovery_backoff_s
        self.prices = prices  # hard cost budgets quote the next request's reservation with it
        self._held: dict[str, budget.Problem] = {}  # this pass's budget problems, by work_id
        self.me = ProcessIdentity.current()
        self.claimant = f"{self.me.host_name}|{self.me.boot_id}|{self.me.pid}|{self.me.start_time}"
        self.admission_open = True

    # ------------------------------------------------------------------ entry point
    async def recover(self) -> RecoveryReport:
        report = RecoveryReport()
        report.dead_workers = await self.db.run(lambda tx: self._confirm_ownership(tx, report))
        for attempt in await self.db.run(self._unrecovered_attempts, write=False):
            mode = await self._recover_attempt(attempt)
            if mode:
                report.recovered[attempt["work_id"]] = mode
        report.reconciled = await self.db.run(self._late_receipts)
        report.notified = await self.db.run(lambda tx: waits.reconcile_waits(tx, time.time()))
        await self.db.run(lambda tx: self._reconcile(tx, report))
        return report

    async def admit(self) -> RecoveryReport:
        """The cheap path after a new message or control: decide and admit, no ownership scan."""
        report = RecoveryReport()
        await self.db.run(lambda tx: self._reconcile(tx, report))
        return report

    # ------------------------------------------------------------------ 1. ownership
    def _confirm_ownership(self, tx: Tx, report: RecoveryReport) -> list[str]:
        """Death is confirmed by identity (same host: pid + start time, or a new boot id), never by a
        late heartbeat alone. Another host's expired lease is taken over only when configured."""
        dead: list[str] = []
        now = time.time()
        for w in tx.all("SELECT * FROM workers WHERE state = 'live'"):
            ident = ProcessIdentity(w["host_name"], w["boot_id"], int(w["pid"]), w["start_time"])
            alive = ident.is_alive_here()
            if alive is False:
                reason = "new boot" if w["boot_id"] != self.me.boot_id else "process gone"
            elif alive is None and w["lease_expires_at"] < now and self.allow_cross_host_takeover:
                reason = "lease expired on another host (takeover allowed)"
            else:
                continue
            self._charge_deaths(tx, c.mark_worker_dead(tx, w, reason), now, report)
            dead.append(w["worker_id"])
        # running attempts whose worker ended without releasing them (a crash during graceful stop)
        orphans = tx.all(
            "SELECT a.* FROM attempts a JOIN workers w ON a.worker_id = w.worker_id"
            " WHERE a.state = 'running' AND w.state != 'live'"
        )
        for a in orphans:
            tx.execute("UPDATE attempts SET state = 'dead', ended_at = ?, end_reason = 'worker ended' WHERE attempt_id = ?",
                       (now, a["attempt_id"]))
            c.bump_commit_point(tx, a["work_id"])
            c.lose_requests(tx, a["attempt_id"])
        self._charge_deaths(tx, orphans, now, report)
        return dead

    def _charge_deaths(self, tx: Tx, died: list[Row], now: float, report: RecoveryReport) -> None:
        """Attribute executor deaths to the work that ran, in the transaction that confirms them.

        Per dead worker, the attempts whose turn had a tool call in flight (a ``dispatched`` effect)
        are charged: a tool that kills or crashes its worker is in flight when the worker dies, and
        the other attempts on that worker died with it through no fault of their own. When no tool
        was in flight the death cannot be pinned on one item, and every attempt it ran is charged.
        A charge adds one to the item's consecutive-death counter and sets its growing backoff.
        """
        by_worker: dict[str, list[Row]] = {}
        for a in died:
            by_worker.setdefault(str(a["worker_id"]), []).append(a)
        for worker_id, attempts in by_worker.items():
            in_flight = [a for a in attempts if tx.one(
                "SELECT effect_id FROM effects WHERE turn_id = ? AND state = 'dispatched' LIMIT 1", (a["turn_id"],)
            ) is not None]
            for a in in_flight or attempts:
                work = c.get_work(tx, a["work_id"])
                deaths = int(work["recovery_attempts"]) + 1
                delay = recovery_backoff(deaths, self.recovery_backoff_s)
                tx.execute("UPDATE work_items SET recovery_attempts = ?, next_attempt_at = ? WHERE work_id = ?",
                           (deaths, now + delay if delay else 0, work["work_id"]))
                tx.execute("UPDATE attempts SET end_reason = COALESCE(end_reason, '') || ? WHERE attempt_id = ?",
                           (f"; charged: death {deaths} in a row", a["attempt_id"]))
                c.emit(tx, "recovery.charged", {"attempt_id": a["attempt_id"], "worker_id": worker_id,
                                                "recovery_attempts": deaths, "delay_s": delay},
                       session_id=work["session_id"], work_id=work["work_id"])
                report.charged[work["work_id"]] = worker_id

    def _unrecovered_attempts(self, tx: Tx) -> list[Row]:
        return tx.all(
            "SELECT a.* FROM attempts a LEFT JOIN recovery_decisions d ON d.decision_key = 'recover:' || a.attempt_id"
            " WHERE a.state = 'dead' AND (d.state IS NULL OR d.state = 'claimed') ORDER BY a.admitted_at"
        )

    # ------------------------------------------------------------------ 2. claim, repair, decide
    async def _recover_attempt(self, attempt: Row) -> str | None:
        key = f"recover:{attempt['attempt_id']}"
        claimed = await self.db.run(lambda tx: self._claim(tx, key, attempt))
        if not claimed:
            return None
        crash_point("recovery.after_claim")
        mode = await self.db.run(lambda tx: self._repair(tx, key, attempt))
        crash_point("recovery.after_decision")
        return mode

    def _claim(self, tx: Tx, key: str, attempt: Row) -> bool:
        """One recovery owner per work item; a dead claimant's claim is taken over, a live one's is not."""
        now = time.time()
        row = tx.one("SELECT * FROM recovery_decisions WHERE decision_key = ?", (key,))
        if row is None:
            work = c.get_work(tx, attempt["work_id"])
            tx.execute(
                "INSERT INTO recovery_decisions (decision_key, work_id, claimed_by, state, control_version, created_at,"
                " updated_at) VALUES (?, ?, ?, 'claimed', ?, ?, ?)",
                (key, attempt["work_id"], self.claimant, work["control_version"], now, now),
            )
            if work["desired_state"] == DesiredState.RUN:  # paused or stopped work keeps its phase and reason
                c.set_phase(tx, work, Phase.RECOVERING, ReasonCode.RECOVERED, "Recovering after an interruption.")
            return True
        if row["state"] != "claimed":
            return False
        if row["claimed_by"] != self.claimant:
            host, boot, pid, start = row["claimed_by"].split("|")
            other = ProcessIdentity(host, boot, int(pid), None if start == "None" else int(start))
            if other.is_alive_here() is not False:
                return False
            tx.execute("UPDATE recovery_decisions SET claimed_by = ?, updated_at = ? WHERE decision_key = ?",
                       (self.claimant, now, key))
        return True

    def _repair(self, tx: Tx, key: str, attempt: Row) -> str:
        """Merge real results, mark unknown outcomes with stable placeholders, record the interruption,
        and choose exactly one mode: resume from the safe checkpoint, or end the turn and start anew."""
        work = c.get_work(tx, attempt["work_id"])
        turn = tx.one("SELECT * FROM turns WHERE turn_id = ?", (attempt["turn_id"],))
        mode = "none"
        if turn is not None and turn["state"] == TurnState.RUNNING:
            unknown: list[Row] = []
            for eff in c.effects_of_turn(tx, turn["turn_id"]):
                if eff["state"] != EffectState.DISPATCHED:
                    continue
                effect_dir = self.state_dir / "effects" / eff["effect_id"]
                text = shell_result_text(effect_dir) if eff["tool"] == "shell" else None
                if text is not None:  # a real receipt: commit it as the result
                    c.set_effect_state(tx, eff, EffectState.COMMITTED, text)
                    c.append_item(tx, work["session_id"], ItemKind.TOOL_RESULT, "tool", text,
                                  item_id=f"result:{eff['call_id']}", work_id=work["work_id"], turn_id=turn["turn_id"],
                                  call_id=eff["call_id"], tool=eff["tool"], state=str(EffectState.COMMITTED))
                elif eff["tool"] == "shell" and shell_alive(effect_dir):
                    continue  # a live child process: the next attempt reconnects and waits
                else:
                    unknown.append(eff)
            for eff in unknown:
                c.set_effect_state(tx, eff, EffectState.UNKNOWN)
                c.append_item(tx, work["session_id"], ItemKind.TOOL_RESULT, "tool",
                              placeholder_text(eff["call_id"], eff["tool"]), item_id=f"repair:{eff['call_id']}",
                              work_id=work["work_id"], turn_id=turn["turn_id"], call_id=eff["call_id"], tool=eff["tool"],
                              state=str(EffectState.UNKNOWN))
            mode = "new_turn" if unknown else "resume_checkpoint"
            text = (
                "Interrupted: the executor died. "
                + ("Outcome unknown for: " + ", ".join(f"{e['tool']} ({e['call_id']})" for e in unknown)
                   + ". The turn ended; a new turn continues." if unknown else "Resuming from the last safe checkpoint.")
            )
            c.append_item(tx, work["session_id"], ItemKind.INTERRUPTION, "system", text,
                          item_id=f"interrupt:{attempt['attempt_id']}", work_id=work["work_id"], turn_id=turn["turn_id"],
                          meta={"attempt_id": attempt["attempt_id"], "mode": mode})
            if unknown:
                c.end_turn(tx, work, turn["turn_id"], TurnState.INTERRUPTED, "executor died with unknown outcomes")
        # the death was charged (or not) when it was confirmed; the decision records the outcome
        retry_at = float(work["next_attempt_at"] or 0)
        tx.execute(
            "UPDATE recovery_decisions SET state = 'decided', mode = ?, updated_at = ?, detail = ? WHERE decision_key = ?",
            (mode, time.time(), c.dumps({"recovery_attempts": int(work["recovery_attempts"]), "retry_at": retry_at,
                                         "end_reason": attempt["end_reason"]}), key),
        )
        c.emit(tx, "recovery.decided", {"attempt_id": attempt["attempt_id"], "mode": mode},
               session_id=work["session_id"], work_id=work["work_id"])
        return mode

    def _late_receipts(self, tx: Tx) -> list[str]:
        """Unknown shell effects whose exit file turned up later (e.g. a process of an earlier boot that
        finished): append the real result once as a reconciliation item; later requests use it in
        place of the placeholder, and the unknown-effect restriction no longer counts it."""
        done: list[str] = []
        for eff in tx.all("SELECT * FROM effects WHERE state = 'unknown' AND tool = 'shell' ORDER BY seq"):
            text = shell_result_text(self.state_dir / "effects" / eff["effect_id"])
            if text is not None and c.reconcile_effect(tx, eff, late_receipt_text(eff["call_id"], text)):
                done.append(eff["call_id"])
        return done

    # ------------------------------------------------------------------ 3+4. decide and admit
    def _facts(
        self, tx: Tx, work: Row, session: Row, now: float, models: dict[str, ReasonCode | None]
    ) -> RecoveryFacts:
        """Load one work item's facts. ``models`` caches model checks for one pass (a scripted model
        check parses its file; the admission loop runs every 100 ms)."""
        model = session["model"] or self.default_model
        if model not in models:
            models[model] = check_model(model)
        live = tx.all(
            "SELECT a.*, w.host_name AS w_host, w.lease_expires_at AS w_lease FROM attempts a"
            " LEFT JOIN workers w ON a.worker_id = w.worker_id WHERE a.work_id = ? AND a.state IN ('admitted', 'running')",
            (work["work_id"],),
        )
        owner = Owner.NONE
        for a in live:
            if a["state"] == "running" and a["w_host"] not in (None, self.me.host_name) and a["w_lease"] < now:
                owner = Owner.UNREACHABLE
            else:
                owner = Owner.LIVE
        turn = c.open_turn(tx, work)
        changed: list[str] = []
        if turn is not None:
            for eff in tx.all("SELECT tool, impl_digest FROM effects WHERE turn_id = ? AND state = 'planned'", (turn["turn_id"],)):
                spec = self.registry.get(eff["tool"])
                if spec is not None and eff["impl_digest"] and spec.digest != eff["impl_digest"]:
                    changed.append(eff["tool"])
        latest = tx.one("SELECT state, control_version FROM attempts WHERE work_id = ? ORDER BY admitted_at DESC LIMIT 1",
                        (work["work_id"],))
        interrupted = (latest is not None and latest["state"] == "dead"
                       and int(latest["control_version"]) == int(work["control_version"]))
        pending = tx.one("SELECT approval_id FROM approvals WHERE work_id = ? AND state = 'pending' LIMIT 1",
                         (work["work_id"],)) is not None
        held = self._budget_problem(tx, work, model, now)
        return RecoveryFacts(
            desired_state=DesiredState(work["desired_state"]),
            reason_code=work["reason_code"],
            owner=owner,
            interrupted=interrupted,
            auto_recover=bool(work["auto_recover"]),
            pending_approval=pending,
            goal_wait=goal_wait(tx, work["work_id"]) if work["kind"] == "goal" else None,
            dependency_wait=ReasonCode.AWAITING_SUBTASK if waits.open_wait_count(tx, work["work_id"]) else None,
            budget_problem=held.code if held else None,
            cwd_exists=os.path.isdir(session["cwd"]),
            model_problem=models[model],
            changed_tools=tuple(changed),
            recovery_attempts=int(work["recovery_attempts"]),
            max_recovery_attempts=self.max_recovery_attempts,
            retry_at=float(work["next_attempt_at"] or 0),
            now=now,
            has_open_turn=turn is not None,
            unknown_effects=tuple(u["call_id"] for u in c.unknown_effects(tx, work["work_id"])),
        )

    def _budget_problem(self, tx: Tx, work: Row, model: str, now: float) -> budget.Problem | None:
        """Hard budgets are rechecked before every admission, recovery included (never a default limit)."""
        problem = budget.admission_problem(tx, work, model, self.prices, now)
        if problem is not None:
            self._held[work["work_id"]] = problem
        return problem

    def _reconcile(self, tx: Tx, report: RecoveryReport) -> None:
        now = time.time()
        self._held.clear()
        rows = tx.all(
            "SELECT * FROM work_items WHERE phase NOT IN ('done', 'cancelled') ORDER BY created_at"
        )
        sessions: dict[str, Row] = {}
        models: dict[str, ReasonCode | None] = {}
        runnable: dict[str, tuple[Row, str, bool]] = {}  # session_id -> its first runnable work item
        busy: set[str] = set()
        for work in rows:
            sid = work["session_id"]
            session = sessions.get(sid) or c.get_session(tx, sid)
            sessions[sid] = session
            if work["phase"] == Phase.FAILED and work["desired_state"] == DesiredState.RUN:
                continue  # a persistent fault keeps its record until Retry / Pause / End
            if tx.one(
                "SELECT a.attempt_id FROM attempts a LEFT JOIN recovery_decisions d"
                " ON d.decision_key = 'recover:' || a.attempt_id WHERE a.work_id = ? AND a.state = 'dead'"
                " AND (d.state IS NULL OR d.state = 'claimed') LIMIT 1",
                (work["work_id"],),
            ):
                busy.add(sid)  # its recovery is not decided yet: recover() handles it first
                continue
            facts = self._facts(tx, work, session, now, models)
            d = decide(facts)
            report.decisions[work["work_id"]] = f"{d.action}:{d.reason_code}"
            if d.action == Action.KEEP:
                busy.add(sid)
            elif d.action == Action.CANCEL:
                c.finish_cancelled(tx, work)
            elif d.action == Action.DONE:
                c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED)
            elif d.action == Action.PAUSE:
                if d.reason_code == ReasonCode.AUTO_RECOVERY_DISABLED and work["desired_state"] != "paused":
                    tx.execute("UPDATE work_items SET desired_state = 'paused' WHERE work_id = ?", (work["work_id"],))
                    work["desired_state"] = "paused"
                c.set_phase(tx, work, Phase.PAUSED, d.reason_code)
            elif d.action == Action.FAIL:
                c.set_phase(tx, work, Phase.FAILED, d.reason_code, self._explain(work, d.reason_code, now))
            elif d.action == Action.WAIT:
                busy.add(sid)
                if (problem := self._held.pop(work["work_id"], None)) is not None and problem.code == d.reason_code:
                    budget.hold(tx, work, problem)  # the sentence says what is known, reserved and missing
                elif work["reason_code"] != d.reason_code or work["phase"] != Phase.WAITING:
                    c.set_phase(tx, work, Phase.WAITING, d.reason_code, self._explain(work, d.reason_code, now))
            elif d.action == Action.ADMIT:
                if sid in busy or sid in runnable:
                    if work["phase"] != Phase.QUEUED or work["reason_code"] != ReasonCode.WAITING_FOR_TURN:
                        c.set_phase(tx, work, Phase.QUEUED, ReasonCode.WAITING_FOR_TURN)
                    continue
                runnable[sid] = (work, d.mode, d.restricted)
        if not self.admission_open:
            return
        free = self.max_concurrent_turns - c.live_attempts(tx)
        # round-robin: the session admitted least recently goes first
        order = sorted(runnable.items(), key=lambda kv: (sessions[kv[0]]["last_admitted_at"], kv[1][0]["created_at"]))
        for _sid, (work, mode, restricted) in order:
            if free <= 0:
                break
            turn = c.open_turn(tx, work)
            try:
                c.admit(tx, work, mode=mode, turn_id=turn["turn_id"] if turn else None, restricted=restricted)
            except VersionConflict:
                continue
            tx.execute(
                "UPDATE recovery_decisions SET state = 'applied', updated_at = ? WHERE work_id = ? AND state = 'decided'",
                (now, work["work_id"]),
            )
            report.admitted.append(work["work_id"])
            free -= 1

    def _explain(self, work: Row, code: ReasonCode, now: float) -> str | None:
        """The sentence for people beside a crash-loop reason (None: the reason's standard sentence)."""
        deaths = int(work["recovery_attempts"])
        if code == ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED:
            return (f"The executor died {deaths} times in a row while this work ran (at most"
                    f" {self.max_recovery_attempts} recoveries); Retry, Pause or End it.")
        if code == ReasonCode.RECOVERY_BACKOFF:
            wait = max(0.0, float(work["next_attempt_at"] or 0) - now)
            return (f"The executor died while this work ran ({deaths} times in a row); recovery"
                    f" {deaths} of {self.max_recovery_attempts} starts in {wait:.1f} s.")
        return None

    # ------------------------------------------------------------------ explanations
    async def explain(self) -> list[dict[str, Any]]:
        """What ``decide()`` would do for every unfinished work item, and why (``recover --explain``)."""

        def run(tx: Tx) -> list[dict[str, Any]]:
            out = []
            now = time.time()
            models: dict[str, ReasonCode | None] = {}
            for work in tx.all("SELECT * FROM work_items WHERE phase NOT IN ('done', 'cancelled') ORDER BY created_at"):
                session = c.get_session(tx, work["session_id"])
                facts = self._facts(tx, work, session, now, models)
                d = decide(facts)
                out.append({
                    "work_id": work["work_id"], "session_id": work["session_id"], "phase": work["phase"],
                    "desired_state": work["desired_state"], "decision": d.action.value, "reason_code": d.reason_code.value,
                    "mode": d.mode, "restricted": d.restricted,
                    "facts": {k: (v.value if hasattr(v, "value") else v) for k, v in facts.__dict__.items()},
                })
            return out

        return await self.db.run(run, write=False)
