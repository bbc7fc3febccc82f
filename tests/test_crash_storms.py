"""Many sessions recovered together, and one that keeps killing its worker (issue 6 item 5, issue 2).

Real ``jupyter server`` processes on isolated state dirs, on each store (``backend``: SQLite, and the
control store and ledger in private PostgreSQL schemas), real SIGKILLs; only the model is scripted.
Ownership and fairness are read from the control store while the work runs, the way an operator would
check them: at most one live attempt per work item and per session at every sample, never more
running than ``max_concurrent_turns``, and admissions ordered round-robin by session.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import db_rows, new_session, sample_until, stored_server_env, write_script
from tests.storekit import Backend

pytestmark = pytest.mark.slow

CAP = 3  # --GoalsApp.max_recovery_attempts
BACKOFF = 0.5  # --GoalsApp.recovery_backoff_s
QUOTA = 4
# kills the process that spawned it (the worker) while poison.on exists; a new call each time it runs
POISON = 'if [ -f poison.on ]; then kill -9 $PPID; echo "killed my worker"; else echo healthy; fi'
RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "poison", "last_tool_result_contains": "healthy"},
     "respond": {"text": "Finished without crashing.", "usage": {"input_tokens": 4, "output_tokens": 2}}},
    {"when": {"last_user_contains": "poison"},
     "respond": {"text": "Running the tool.", "tool_calls": [{"name": "shell", "arguments": {"command": POISON}}],
                 "usage": {"input_tokens": 4, "output_tokens": 2}}},
    {"when": {"last_user_contains": "think"},
     "respond": {"text": "Thought about it.", "delay_s": 1.0, "usage": {"input_tokens": 3, "output_tokens": 1}}},
]


@pytest.fixture
def env(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    with stored_server_env(tmp_path, RULES, backend) as e:
        yield e


def phases(state: Path, sids: list[str]) -> dict[str, str]:
    marks = ",".join("?" * len(sids))
    rows = db_rows(state, f"SELECT session_id, phase FROM work_items WHERE session_id IN ({marks})", tuple(sids))
    return {r["session_id"]: r["phase"] for r in rows}


def poison_attempts(state: Path, sid: str) -> list[dict[str, Any]]:
    return db_rows(state, "SELECT * FROM attempts WHERE session_id = ? ORDER BY admitted_at", (sid,))


def test_work_that_kills_its_worker_every_run_fails_after_the_cap_while_others_finish(env: dict[str, Any]) -> None:
    """A work item that kills its worker every time it runs is retried with growing backoff up to
    ``max_recovery_attempts``, then fails with ``recovery_attempts_exceeded`` and Retry / Pause / End;
    ten other chats on the same worker finish meanwhile.

    The poison, honestly modelled: the scripted model answers every request of the poison chat with a
    fresh ``shell`` call (a new call id each time, so a new effect, never a re-run of an old one), and
    while ``poison.on`` exists the command runs ``kill -9 $PPID``, killing the worker that spawned it,
    as a segfaulting or memory-hungry tool would. The killed call's own outcome is real (the detached
    shell writes its exit file), so recovery resumes from the checkpoint and the next provider request
    brings the next fatal call: every run of the item kills its executor. Other chats running on that
    worker die with it; they are not blamed (no tool of theirs was in flight) and finish. Deleting
    ``poison.on`` stands for the user fixing the cause before the last Retry.
    """
    state, root = env["state"], env["root"]
    (root / "poison.on").write_text("")
    server = env["make"]([f"--GoalsApp.max_recovery_attempts={CAP}", f"--GoalsApp.recovery_backoff_s={BACKOFF}",
                          f"--GoalsApp.max_concurrent_turns={QUOTA}"]).start()
    cl = server.client()
    poison = new_session(server, root)
    others = [new_session(server, root) for _ in range(10)]
    poison_work = cl.send(poison, "poison: run the tool", client_request_id="p1")["work_id"]
    for i, sid in enumerate(others):
        cl.send(sid, "think hard", client_request_id=f"o{i}")

    def settled() -> bool:
        p = phases(state, [poison, *others])
        return p[poison] == "failed" and all(p[s] == "done" for s in others)

    samples = sample_until(state, QUOTA, settled, 120, "poison failed and the other chats done")
    assert samples > 20

    # what the user sees: failed, the reason, and Retry / Pause / End
    snap = cl.session(poison)
    assert snap["work"]["phase"] == "failed"
    assert snap["work"]["reason_code"] == "recovery_attempts_exceeded"
    assert f"died {CAP + 1} times in a row" in snap["work"]["reason"]
    actions = snap["actions"]
    assert (actions["can_retry"], actions["can_pause"], actions["can_end"], actions["can_resume"]) == (True, True, True, False)
    assert [i["kind"] for i in snap["transcript"]["items"]].count("interruption") == CAP + 1
    assert all(cl.session(s)["work"]["phase"] == "done" for s in others)

    # each death was charged to the poison, durably, with a growing backoff that really held it back
    attempts = poison_attempts(state, poison)
    assert [a["state"] for a in attempts] == ["dead"] * (CAP + 1)
    assert all("charged" in a["end_reason"] for a in attempts)
    events = cl.events(0, 100000)["events"]
    charged = [e["payload"] for e in events if e["kind"] == "recovery.charged" and e["work_id"] == poison_work]
    assert [ch["recovery_attempts"] for ch in charged] == [1, 2, 3, 4]
    assert [ch["delay_s"] for ch in charged] == [0.0, BACKOFF, 2 * BACKOFF, 4 * BACKOFF]
    for died, nxt, ch in zip(attempts, attempts[1:], charged, strict=False):
        assert nxt["admitted_at"] - died["ended_at"] >= ch["delay_s"] - 0.01
    waits = [e["payload"] for e in events if e["kind"] == "work.phase" and e["work_id"] == poison_work
             and e["payload"]["reason_code"] == "recovery_backoff"]
    assert len(waits) >= CAP - 1 and all(w["phase"] == "waiting" for w in waits)

    # no call ran twice: one effect per run, each spawned once, none with an unknown outcome
    effects = db_rows(state, "SELECT effect_id, state FROM effects WHERE session_id = ?", (poison,))
    assert len(effects) == CAP + 1
    assert all((state / "effects" / e["effect_id"] / "proc.json").exists() for e in effects)
    assert all(e["state"] in ("committed", "dispatched") for e in effects)

    # the other chats on the killed worker died with it, were not blamed, and finished
    collateral = db_rows(state, "SELECT attempt_id, worker_id, admitted_at, started_at, ended_at, end_reason FROM attempts"
                                " WHERE state = 'dead' AND session_id != ?", (poison,))
    assert collateral, "no other chat was running on the killed worker"
    blamed = [a for a in collateral if "charged" in (a["end_reason"] or "")]
    assert not blamed, f"other chats charged: {blamed}; the poison's attempts: {attempts}"
    assert server.workers()  # the supervisor brought the worker back each time

    # Retry re-admits it with the cap reset: another CAP + 1 deaths before it fails again
    assert cl.action(poison, "retry")["desired_state"] == "run"
    assert cl.session(poison)["work"]["phase"] != "failed"
    sample_until(state, QUOTA, lambda: len(poison_attempts(state, poison)) == 2 * (CAP + 1)
                 and phases(state, [poison])[poison] == "failed", 90, "the retried poison to fail again")
    events = cl.events(0, 100000)["events"]
    charged = [e["payload"] for e in events if e["kind"] == "recovery.charged" and e["work_id"] == poison_work]
    assert [ch["recovery_attempts"] for ch in charged] == [1, 2, 3, 4, 1, 2, 3, 4]
    assert cl.session(poison)["work"]["reason_code"] == "recovery_attempts_exceeded"

    # Pause keeps the failed work; the cause is fixed; Resume (a fresh count, like Retry) finishes it
    cl.action(poison, "pause")
    snap = cl.session(poison)
    assert (snap["work"]["phase"], snap["actions"]["can_resume"]) == ("paused", True)
    (root / "poison.on").unlink()
    cl.action(poison, "resume")
    snap = cl.wait(poison, timeout=60)
    assistant = [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"]
    assert assistant[-1] == "Finished without crashing."
    assert [i["kind"] for i in snap["transcript"]["items"]].count("user") == 1
    effects = db_rows(state, "SELECT effect_id, state FROM effects WHERE session_id = ?", (poison,))
    assert len(effects) == 2 * (CAP + 1) + 1 and all(e["state"] == "committed" for e in effects)


def test_twenty_sessions_continue_round_robin_after_restart_with_one_owner_per_item(env: dict[str, Any]) -> None:
    """20 chats, each with a running request and a queued one, when the server is killed: after the
    restart every session's interrupted request is admitted, least recently admitted first, before any
    session's next request, never more than ``max_concurrent_turns`` at a time, one owner per item."""
    state, root = env["state"], env["root"]
    slow = [{"when": {"last_user_contains": "think"}, "respond": {"text": "Still thinking.", "delay_s": 120}}]
    write_script(env["script"], slow)
    server = env["make"](["--GoalsApp.max_concurrent_turns=20"]).start()
    cl = server.client()
    sids = [new_session(server, root) for _ in range(20)]
    for i, sid in enumerate(sids):  # created s1a, s1b, s2a, s2b, ...: FIFO by creation would run s1b before s5a
        cl.send(sid, "think first", client_request_id=f"{i}a")
        cl.send(sid, "think second", client_request_id=f"{i}b")
    sample_until(state, 20, lambda: len(db_rows(state, "SELECT 1 FROM attempts WHERE state = 'running'")) == 20,
                 60, "20 running attempts")
    server.kill()
    before = db_rows(state, "SELECT session_id FROM attempts ORDER BY admitted_at")
    assert len(before) == 20
    write_script(env["script"], [{"when": {"last_user_contains": "think"},
                                  "respond": {"text": "Thought about it.", "delay_s": 0.3}}])
    restart = time.time()
    server = env["make"]([f"--GoalsApp.max_concurrent_turns={QUOTA}"]).start()
    sample_until(state, QUOTA, lambda: [r["n"] for r in db_rows(state, "SELECT COUNT(*) AS n FROM work_items WHERE phase = 'done'")] == [40],
                 120, "all 40 requests done")
    after = db_rows(state, "SELECT session_id, started_at, ended_at FROM attempts WHERE admitted_at > ? ORDER BY admitted_at",
                    (restart,))
    first = [a["session_id"] for a in after[:20]]
    assert first == [b["session_id"] for b in before]  # round-robin: least recently admitted first
    assert sorted(a["session_id"] for a in after[20:]) == sorted(sids)
    points = sorted([(a["started_at"], 1) for a in after] + [(a["ended_at"], -1) for a in after])
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak <= QUOTA
