"""The Coordinator: the one idempotent recovery and admission entry point (DESIGN §8).

``recover()`` is called at server start, when the supervisor sees a worker exit, on every reconcile
tick and by ``jupyter goals recover``. It (1) confirms executor ownership and fences the dead,
(2) claims each interrupted work item, repairs its context and records exactly one recovery mode
(in chunks of ``RECOVERY_CHUNK`` attempts: one transaction claims a chunk, a second repairs it),
(3) runs ``decide()`` for every unfinished work item without a live attempt and (4) admits runnable
work round-robin across sessions under ``max_concurrent_turns``. Repeating any step is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_goals.config import GoalsConfig
from jupyter_goals.faults import crash_point
from jupyter_goals.host.effect_files import (
    cancel_shell,
    cancelled_result_text,
    recovered_result_text,
    shell_alive,
    shell_result_text,
)
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.identity import ProcessIdentity
from jupyter_goals.models import (
    DesiredState,
    EffectState,
    ItemKind,
    Phase,
    ReasonCode,
    RecoveryMode,
    TurnState,
)
from jupyter_goals.recovery import takeover
from jupyter_goals.recovery.decide import Action, RecoveryFacts, decide
from jupyter_goals.recovery.facts import ToolLookup, load_facts
from jupyter_goals.recovery.interrupt import interrupt_turn, record_decision
from jupyter_goals.recovery.repair import late_receipt_text
from jupyter_goals.store import control as c
from jupyter_goals.store import hosts, waits
from jupyter_goals.store import recovery as rs
from jupyter_goals.store.db import Database, Row, Tx, VersionConflict
from jupyter_goals.usage import budget
from jupyter_goals.usage.prices import PriceTable

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    dead_workers: list[str] = field(default_factory=list)
    recovered: dict[str, RecoveryMode] = field(default_factory=dict)  # work_id -> mode
    decisions: dict[str, str] = field(default_factory=dict)  # work_id -> action/reason
    admitted: list[str] = field(default_factory=list)
    charged: dict[str, str] = field(default_factory=dict)  # work_id -> worker whose death it was charged with
    reconciled: list[str] = field(default_factory=list)  # call ids whose late receipt was appended
    notified: list[dict[str, Any]] = field(default_factory=list)  # missed wait notifications found
    cancelled: list[str] = field(default_factory=list)  # call ids of stopped tools the sweep is killing
    taken_over: list[str] = field(default_factory=list)  # work ids moved here (allow_cross_host_takeover)
    # the earliest durable retry time (wall clock) of waiting work: the next pass is due then
    next_due: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "reconciled": self.reconciled,
            "cancelled": self.cancelled,
            "notified": self.notified,
            "dead_workers": self.dead_workers,
            "recovered": self.recovered,
            "decisions": self.decisions,
            "admitted": self.admitted,
            "charged": self.charged,
            "taken_over": self.taken_over,
        }


RECOVERY_CHUNK = 200  # interrupted attempts claimed (then repaired) per transaction of a recovery pass


def _claim_key(attempt: Row) -> str:
    return f"recover:{attempt['attempt_id']}"


class _Prefetched:
    """Work items read for a whole chunk: each one's row as read the first time it comes up, a fresh
    ``c.get_work`` after (an earlier step of the same transaction may have changed it)."""

    def __init__(self, rows: dict[str, Row]) -> None:
        self.rows = rows
        self.seen: set[str] = set()

    def first(self, work_id: str) -> bool:
        return work_id not in self.seen

    def work(self, tx: Tx, work_id: str) -> Row:
        if work_id in self.seen or work_id not in self.rows:
            self.seen.add(work_id)
            return c.get_work(tx, work_id)  # NotFound for a missing one, as before
        self.seen.add(work_id)
        return self.rows[work_id]


def recovery_backoff(attempts: int, base: float, cap: float = 300.0) -> float:
    """No delay for the first recovery; growing delays for a work item that keeps killing workers."""
    return 0.0 if attempts <= 1 else float(min(cap, base * 2 ** (attempts - 2)))


class Coordinator:
    def __init__(self, db: Database, config: GoalsConfig, *, registry: ToolLookup, prices: PriceTable | None = None,
                 redactor: Redactor | None = None) -> None:
        """The Coordinator the server runs with ``config`` (its ``state_dir``, ``default_model``,
        ``max_concurrent_turns``, ``allow_cross_host_takeover``, ``max_recovery_attempts``,
        ``recovery_backoff_s``, ``cancel_grace_s``); the CLI builds the same one from the saved file.
        ``prices``: hard cost budgets quote the next request's reservation with it; ``redactor``: default
        this process's credentials and the server's ``secrets`` (a late receipt is tool output like any
        other: credentials never reach the transcript)."""
        self.db = db
        self.config = config
        self.registry = registry
        self.prices = prices
        self.redactor = redactor if redactor is not None else Redactor.from_environment(extra=config.secrets)
        self._cancelling: dict[str, asyncio.Task[None]] = {}  # effect_id → the sweep's kill in progress
        self._held: dict[str, budget.Problem] = {}  # this pass's budget problems, by work_id
        self._revoked: dict[str, str] = {}  # this pass's revoked-permission sentences, by work_id
        self.me = ProcessIdentity.current()
        self.claimant = takeover.claimant()
        self.host = self.me.host_name
        self._refused: dict[str, str] = {}  # hosts whose automatic takeover was refused: the reason, logged once
        self.admission_open = True

    # ------------------------------------------------------------------ entry point
    async def recover(self) -> RecoveryReport:
        # each step reads first and opens a write transaction only when it has something to change,
        # so a pass over idle work commits nothing (Database.run_write_if_needed)
        report = RecoveryReport()
        report.dead_workers = await self.db.run_write_if_needed(lambda tx: self._confirm_ownership(tx, report))
        interrupted = await self.db.run(lambda tx: rs.unrecovered_attempts(tx, self.host), write=False)
        for i in range(0, len(interrupted), RECOVERY_CHUNK):
            report.recovered.update(await self._recover_attempts(interrupted[i:i + RECOVERY_CHUNK]))
        report.cancelled = await self._cancel_condemned_tools()
        report.reconciled = await self.db.run_write_if_needed(self._late_receipts)
        report.notified = await self.db.run_write_if_needed(lambda tx: waits.reconcile_waits(tx, time.time()))
        if report.dead_workers or report.charged or report.recovered or report.reconciled or report.notified:
            # this pass has written already (deaths, claims, receipts): its decisions will too, so
            # they run once under the write lock instead of a read pass repeated when it meets a write
            await self.db.run(lambda tx: self._reconcile(tx, report))
        else:
            await self.db.run_write_if_needed(lambda tx: self._reconcile(tx, report))
        return report

    async def admit(self) -> RecoveryReport:
        """The cheap path after a new message or control: decide and admit, no ownership scan.
        Nothing to change: reads only."""
        report = RecoveryReport()
        await self.db.run_write_if_needed(lambda tx: self._reconcile(tx, report))
        return report

    # ------------------------------------------------------------------ 1. ownership
    def _confirm_ownership(self, tx: Tx, report: RecoveryReport) -> list[str]:
        """Death is confirmed by identity (this host's workers: pid + start time, or a new boot id), never
        by a late heartbeat alone; another host's workers are never judged here. Another host whose
        leases all expired is taken over only when configured (``allow_cross_host_takeover``)."""
        dead: list[str] = []
        now = time.time()
        for w in rs.live_workers(tx, self.host):
            ident = ProcessIdentity(w["host_name"], w["boot_id"], int(w["pid"]), w["start_time"])
            if ident.is_alive_here() is not False:
                continue
            reason = "new boot" if w["boot_id"] != self.me.boot_id else "process gone"
            self._charge_deaths(tx, c.mark_worker_dead(tx, w, reason), now, report)
            dead.append(w["worker_id"])
        if self.config.allow_cross_host_takeover:
            for host in hosts.expired_hosts(tx, self.host, now):
                report.taken_over += self._take_over_expired(tx, host, now)
        # running attempts whose worker ended without releasing them (a crash during graceful stop)
        orphans = rs.orphaned_attempts(tx, self.host)
        for a in orphans:
            rs.mark_orphan_dead(tx, a, now)
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
        flying = rs.turns_with_tool_in_flight(tx, [a["turn_id"] for a in died])
        works = _Prefetched(rs.works_by_id(tx, [a["work_id"] for a in died]))
        for worker_id, attempts in by_worker.items():
            in_flight = [a for a in attempts if a["turn_id"] in flying]
            for a in in_flight or attempts:
                work = works.work(tx, a["work_id"])
                deaths = int(work["recovery_attempts"]) + 1
                delay = recovery_backoff(deaths, self.config.recovery_backoff_s)
                rs.charge_death(tx, work, a["attempt_id"], worker_id, deaths, delay, now)
                report.charged[work["work_id"]] = worker_id

    def _take_over_expired(self, tx: Tx, host: str, now: float) -> list[str]:
        """``allow_cross_host_takeover``: the same takeover a person would run, by itself. A refusal (a
        session's folder missing here) moves nothing; the work keeps waiting and the reason is logged once."""
        try:
            moved = takeover.take_over(tx, from_host=host, to_host=self.host, by="allow_cross_host_takeover",
                                       claimant=self.claimant, now=now)
        except VersionConflict as exc:
            if self._refused.get(host) != str(exc):
                log.warning("automatic takeover of %s refused: %s", host, exc)
                self._refused[host] = str(exc)
            return []
        return moved.taken

    async def take_over(self, from_host: str, by: str, session_id: str | None = None) -> takeover.Takeover:
        """A person's takeover of ``from_host``'s work (of one session, when given) by this host."""
        return await self.db.run(lambda tx: takeover.take_over(
            tx, from_host=from_host, to_host=self.host, by=by, claimant=self.claimant, session_id=session_id))

    # ------------------------------------------------------------------ 2. claim, repair, decide
    async def _recover_attempts(self, attempts: list[Row]) -> dict[str, RecoveryMode]:
        """Claim a chunk of interrupted attempts in one transaction, then repair and decide the claimed
        ones in a second: two commits per chunk, not two per attempt. Each attempt keeps its own claim
        row (``recover:<attempt_id>``, one owner) and its own decision, so a crash between the two
        transactions, or a second pass over the same attempts, decides each of them exactly once."""
        claimed = await self.db.run(lambda tx: self._claim_chunk(tx, attempts))
        if not claimed:
            return {}
        crash_point("recovery.after_claim")
        modes = await self.db.run(lambda tx: self._repair_chunk(tx, claimed))
        crash_point("recovery.after_decision")
        return modes

    def _claim_chunk(self, tx: Tx, attempts: list[Row]) -> list[Row]:
        """``_claim`` of each attempt, its reads and its new claims a few statements for the whole chunk."""
        claims = rs.claims_by_key(tx, [_claim_key(a) for a in attempts])
        works = _Prefetched(rs.works_by_id(tx, [a["work_id"] for a in attempts if _claim_key(a) not in claims]))
        return [a for a in attempts if self._claim(tx, _claim_key(a), a, claims.get(_claim_key(a)), works)]

    def _claim(self, tx: Tx, key: str, attempt: Row, row: Row | None, works: _Prefetched) -> bool:
        """One recovery owner per work item; a dead claimant's claim is taken over, a live one's is not
        (the attempts here are of this host's work only, so another host's claim is one it lost). ``row``:
        the attempt's claim as the chunk read it."""
        now = time.time()
        if row is None:
            work = works.work(tx, attempt["work_id"])
            rs.claim_recovery(tx, key, work, self.claimant, now)
            if work["desired_state"] == DesiredState.RUN:  # paused or stopped work keeps its phase and reason
                c.set_phase(tx, work, Phase.RECOVERING, ReasonCode.RECOVERED, "Recovering after an interruption.")
            return True
        if row["state"] != "claimed":
            return False
        if row["claimed_by"] != self.claimant:
            host, boot, pid, start = row["claimed_by"].split("|")
            other = ProcessIdentity(host, boot, int(pid), None if start == "None" else int(start))
            # a claim of another host on work of this host: that host lost the work (a takeover), so
            # its claim is stale; a live claimant here keeps its claim
            if other.is_alive_here() is True:
                return False
            rs.take_over_claim(tx, key, self.claimant, now)
        return True

    def _repair_chunk(self, tx: Tx, claimed: list[Row]) -> dict[str, RecoveryMode]:
        """``_repair`` of each claimed attempt, the work items, turns and open calls read for the whole chunk."""
        works = _Prefetched(rs.works_by_id(tx, [a["work_id"] for a in claimed]))
        turns = rs.turns_by_id(tx, [a["turn_id"] for a in claimed])
        effects = rs.open_effects_by_turn(tx, [t for t, turn in turns.items() if turn["state"] == TurnState.RUNNING])
        modes: dict[str, RecoveryMode] = {}
        for a in claimed:
            if works.first(a["work_id"]):
                modes[a["work_id"]] = self._repair(tx, _claim_key(a), a, works.work(tx, a["work_id"]),
                                                   turns.get(a["turn_id"]), effects.get(a["turn_id"]))
            else:  # an earlier attempt of the same work item was repaired in this transaction: read afresh
                modes[a["work_id"]] = self._repair(tx, _claim_key(a), a)
        return modes

    def _repair(self, tx: Tx, key: str, attempt: Row, work: Row | None = None, turn: Row | None = None,
                open_effects: list[Row] | None = None) -> RecoveryMode:
        """Merge real results, mark unknown outcomes with stable placeholders, record the interruption,
        and choose exactly one mode: resume from the safe checkpoint, or end the turn and start anew.
        A call dispatched on another host (its attempt's worker ran there) is never judged from this
        host's state dir: its outcome is unknown here. ``work``, ``turn``, ``open_effects``: read for the
        chunk (``_repair_chunk``), else here."""
        if work is None:
            work = c.get_work(tx, attempt["work_id"])
            turn = rs.get_turn(tx, attempt["turn_id"])
        mode = RecoveryMode.NONE
        if turn is not None and turn["state"] == TurnState.RUNNING:
            here = attempt.get("w_host") in (None, self.me.host_name)
            unknown: list[Row] = []
            if open_effects is None:
                open_effects = c.open_effects_of_turn(tx, turn["turn_id"])
            for eff in open_effects:
                if eff["state"] != EffectState.DISPATCHED:
                    continue
                if not here:
                    unknown.append(eff)
                    continue
                effect_dir = self.config.state_dir / "effects" / eff["effect_id"]
                text = shell_result_text(effect_dir) if eff["tool"] == "shell" else None
                if text is not None:  # a real receipt: commit it as the result, credentials hidden as always
                    clean = self.redactor.redact(recovered_result_text(text))
                    c.set_effect_state(tx, eff, EffectState.COMMITTED, clean.text)
                    c.append_item(tx, work["session_id"], ItemKind.TOOL_RESULT, "tool", clean.text,
                                  item_id=f"result:{eff['call_id']}", work_id=work["work_id"], turn_id=turn["turn_id"],
                                  call_id=eff["call_id"], tool=eff["tool"], state=str(EffectState.COMMITTED),
                                  meta={"redacted": list(clean.names)} if clean.names else None)
                elif eff["tool"] == "shell" and shell_alive(effect_dir):
                    continue  # a live child process: the next attempt reconnects and waits
                else:
                    unknown.append(eff)
            mode = interrupt_turn(tx, work, turn, attempt, unknown)
        # the death was charged (or not) when it was confirmed; the decision records the outcome
        record_decision(tx, key, work, attempt, mode)
        return mode

    async def _cancel_condemned_tools(self) -> list[str]:
        """Running shell calls whose work was stopped (or that a person cancelled) and that no live
        worker's attempt owns any more — the worker or the server died between the stop's commit and the
        kill: find the process by its identity, kill its group (SIGTERM, SIGKILL after the grace), commit
        ``cancelled`` with its real exit status and output. Never re-runs anything; harmless to repeat."""
        started: list[str] = []
        for eff in await self.db.run(lambda tx: c.tools_to_cancel(tx, self.host), write=False):
            if eff["owned"] or eff["effect_id"] in self._cancelling:
                continue  # a live worker cancels its own calls; a kill of ours is under way

            async def cancel(eff: Row = eff) -> None:
                effect_dir = self.config.state_dir / "effects" / eff["effect_id"]
                cause = "stop" if eff["desired_state"] == DesiredState.CANCELLED else "tool"
                try:
                    signalled = await cancel_shell(effect_dir, self.config.cancel_grace_s)
                    clean = self.redactor.redact(cancelled_result_text(effect_dir, cause, signalled))
                    await self.db.run(lambda tx: c.commit_cancelled(tx, eff, clean.text, clean.names))
                finally:
                    self._cancelling.pop(eff["effect_id"], None)

            self._cancelling[eff["effect_id"]] = asyncio.create_task(cancel())
            started.append(eff["call_id"])
        return started

    def _late_receipts(self, tx: Tx) -> list[str]:
        """Unknown shell effects whose exit file turned up later (e.g. a process of an earlier boot that
        finished): append the real result once as a reconciliation item; later requests use it in
        place of the placeholder, and the unknown-effect restriction no longer counts it."""
        done: list[str] = []
        for eff in rs.unknown_shell_effects(tx, self.host):  # dispatched here: only this host has its files
            text = shell_result_text(self.config.state_dir / "effects" / eff["effect_id"])
            if text is None:
                continue
            clean = self.redactor.redact(late_receipt_text(eff["call_id"], text))
            if c.reconcile_effect(tx, eff, clean.text, clean.names):
                done.append(eff["call_id"])
        return done

    # ------------------------------------------------------------------ 3+4. decide and admit
    def _facts(
        self, tx: Tx, work: Row, session: Row, now: float, models: dict[str, ReasonCode | None],
        dead_workers: frozenset[str] = frozenset(), pending_approvals: set[str] | None = None,
        reads: rs.PassReads | None = None,
    ) -> RecoveryFacts:
        """One work item's facts (``recovery/facts.py``); its budget problem and revoked-permission
        sentence are kept for this pass's sentences."""
        found = load_facts(tx, work, session, config=self.config, registry=self.registry, prices=self.prices,
                           host_name=self.me.host_name, now=now, models=models, dead_workers=dead_workers,
                           pending_approvals=pending_approvals, reads=reads)
        if found.revoked is not None:
            self._revoked[work["work_id"]] = found.revoked
        if found.held is not None:
            self._held[work["work_id"]] = found.held
        return found.facts

    def _reconcile(self, tx: Tx, report: RecoveryReport) -> None:
        now = time.time()
        self._held.clear()
        self._revoked.clear()
        report.next_due = None
        rows = rs.unfinished_work(tx, self.host)  # each host admits, recovers and reconciles its own work
        sessions: dict[str, Row] = {}
        models: dict[str, ReasonCode | None] = {}
        runnable: dict[str, tuple[Row, RecoveryMode, bool]] = {}  # session_id -> its first runnable work item
        # one running item per session: an attempt still live (a paused item's last step, a stopped one's
        # kill, a death not yet confirmed) holds its session whatever became of its work item
        busy: set[str] = rs.sessions_with_live_attempts(tx)
        pending = rs.works_with_pending_approval(tx)  # one read for the pass, not one per work item
        reads = rs.pass_reads(tx, self.host)  # and the rest of the facts of all items, in a few statements
        sessions.update(reads.sessions)
        for work in rows:
            sid = work["session_id"]
            session = sessions.get(sid) or c.get_session(tx, sid)
            sessions[sid] = session
            if work["phase"] == Phase.FAILED and work["desired_state"] == DesiredState.RUN:
                continue  # a persistent fault keeps its record until Retry / Pause / End
            if work["work_id"] in reads.recovery_pending:
                busy.add(sid)  # its recovery is not decided yet: recover() handles it first
                continue
            facts = self._facts(tx, work, session, now, models, pending_approvals=pending, reads=reads)
            d = decide(facts)
            report.decisions[work["work_id"]] = f"{d.action}:{d.reason_code}"
            if facts.retry_at > now:  # a backoff ends then: no commit announces it
                report.next_due = min(report.next_due or facts.retry_at, facts.retry_at)
            if d.action == Action.KEEP:
                busy.add(sid)
            elif d.action == Action.CANCEL:
                if rs.live_attempts_of(tx, work["work_id"]):
                    # its worker cancels the running step and ends the turn itself (result, then the
                    # stop marker, in that order); a dead worker's attempt ends when its death is charged
                    busy.add(sid)
                else:
                    c.finish_cancelled(tx, work)
            elif d.action == Action.DONE:
                c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED)
            elif d.action == Action.PAUSE:
                if d.reason_code == ReasonCode.AUTO_RECOVERY_DISABLED and work["desired_state"] != "paused":
                    rs.pause_work(tx, work)
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
                runnable[sid] = (work, d.mode or RecoveryMode.FRESH, d.restricted)
        if not self.admission_open:
            return
        free = self.config.max_concurrent_turns - c.live_attempts(tx, self.host)
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
            rs.apply_recovery_decisions(tx, work["work_id"], now)
            report.admitted.append(work["work_id"])
            free -= 1

    def _explain(self, work: Row, code: ReasonCode, now: float) -> str | None:
        """The sentence for people beside a crash-loop reason (None: the reason's standard sentence)."""
        if code == ReasonCode.PERMISSION_REVOKED:
            return self._revoked.get(work["work_id"])
        deaths = int(work["recovery_attempts"])
        if code == ReasonCode.RECOVERY_ATTEMPTS_EXCEEDED:
            return (f"The executor died {deaths} times in a row while this work ran (at most"
                    f" {self.config.max_recovery_attempts} recoveries); Retry, Pause or End it.")
        if code == ReasonCode.RECOVERY_BACKOFF:
            wait = max(0.0, float(work["next_attempt_at"] or 0) - now)
            return (f"The executor died while this work ran ({deaths} times in a row); recovery"
                    f" {deaths} of {self.config.max_recovery_attempts} starts in {wait:.1f} s.")
        return None

    # ------------------------------------------------------------------ explanations
    async def explain(self) -> list[dict[str, Any]]:
        """What ``decide()`` would do for every unfinished work item, and why (``recover --explain``)."""

        def run(tx: Tx) -> list[dict[str, Any]]:
            out = []
            now = time.time()
            models: dict[str, ReasonCode | None] = {}
            # the deaths the next pass would confirm (by process identity), so the answer is that pass's
            dead = frozenset(w["worker_id"] for w in rs.live_workers(tx, self.host)
                             if ProcessIdentity(w["host_name"], w["boot_id"], int(w["pid"]),
                                                w["start_time"]).is_alive_here() is False)
            for work in rs.unfinished_work(tx, self.host):
                session = c.get_session(tx, work["session_id"])
                facts = self._facts(tx, work, session, now, models, dead)
                d = decide(facts)
                out.append({
                    "work_id": work["work_id"], "session_id": work["session_id"], "phase": work["phase"],
                    "desired_state": work["desired_state"], "decision": d.action.value, "reason_code": d.reason_code.value,
                    "mode": str(d.mode or ""), "restricted": d.restricted,
                    "facts": {k: (v.value if hasattr(v, "value") else v) for k, v in facts.__dict__.items()},
                })
            return out

        return await self.db.run(run, write=False)
