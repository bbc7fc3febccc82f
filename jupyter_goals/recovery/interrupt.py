"""The end of a dead attempt's turn, shared by the Coordinator's recovery of its own host's deaths and
by a takeover of another host's work: unknown outcomes get stable placeholders, the interruption is
recorded, and exactly one recovery mode is decided (``recover:<attempt_id>``)."""

from __future__ import annotations

from jupyter_goals.models import EffectState, ItemKind, RecoveryMode, TurnState
from jupyter_goals.recovery.decide import repair_mode
from jupyter_goals.recovery.repair import placeholder_text
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery as rs
from jupyter_goals.store.db import Row, Tx


def interrupt_turn(tx: Tx, work: Row, turn: Row, attempt: Row, unknown: list[Row],
                   cause: str = "the executor died") -> RecoveryMode:
    """Keep the answer the attempt was streaming (its last durable draft, ``meta.interrupted =
    "restart"``), mark ``unknown`` calls' outcomes unknown (placeholders, never run again without
    approval), append the interruption marker, and end the turn ``interrupted`` when some outcome is
    unknown. The mode: a new (restricted) turn after unknown outcomes, else resume from the last safe
    checkpoint. Every item has a stable id: a repeated recovery adds nothing."""
    c.partial_answer(tx, work, turn["turn_id"], "restart", attempt_id=attempt["attempt_id"])
    for eff in unknown:
        c.set_effect_state(tx, eff, EffectState.UNKNOWN)
        c.append_item(tx, work["session_id"], ItemKind.TOOL_RESULT, "tool",
                      placeholder_text(eff["call_id"], eff["tool"]), item_id=f"repair:{eff['call_id']}",
                      work_id=work["work_id"], turn_id=turn["turn_id"], call_id=eff["call_id"], tool=eff["tool"],
                      state=str(EffectState.UNKNOWN))
    mode = repair_mode(turn_running=True, unknown_outcomes=bool(unknown))
    text = (
        f"Interrupted: {cause}. "
        + ("Outcome unknown for: " + ", ".join(f"{e['tool']} ({e['call_id']})" for e in unknown)
           + ". The turn ended; a new turn continues." if unknown else "Resuming from the last safe checkpoint.")
    )
    c.append_item(tx, work["session_id"], ItemKind.INTERRUPTION, "system", text,
                  item_id=f"interrupt:{attempt['attempt_id']}", work_id=work["work_id"], turn_id=turn["turn_id"],
                  meta={"attempt_id": attempt["attempt_id"], "mode": mode})
    if unknown:
        c.end_turn(tx, work, turn["turn_id"], TurnState.INTERRUPTED, f"{cause.removeprefix('the ')} with unknown outcomes")
    return mode


def record_decision(tx: Tx, key: str, work: Row, attempt: Row, mode: RecoveryMode) -> None:
    """The claim's one recovery mode, with the death's charge state, and ``recovery.decided``."""
    retry_at = float(work["next_attempt_at"] or 0)
    rs.record_recovery_decision(tx, key, mode, {"recovery_attempts": int(work["recovery_attempts"]),
                                                 "retry_at": retry_at, "end_reason": attempt["end_reason"]})
    c.emit(tx, "recovery.decided", {"attempt_id": attempt["attempt_id"], "mode": mode},
           session_id=work["session_id"], work_id=work["work_id"])
