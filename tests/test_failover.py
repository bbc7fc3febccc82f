"""Database failover (issue 30 item 6): PostgreSQL restarted under real ``jupyter server`` processes.

Each test runs its own throwaway PostgreSQL cluster (``pg_cluster``, ``tests/pgcluster.py``) and crashes
it with ``pg_ctl stop -m immediate`` (every connection cut mid-transaction, recovery from the WAL at the
next start), never the shared PostgreSQL on 127.0.0.1:5432. Chats are chains of shell steps, each
appending one line ``chat-NN:sK`` to ``out.txt``: "none twice" is counted in that file, "nothing
half-written" is read from the store (no attempt, call, claim, turn or request left in flight, each
receipt once in the ledger), and "converges by itself" means no request from the test after the database
is back but reads.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, FencedError
from tests.pgcluster import PrivateCluster
from tests.servers import ServerProcess, wait_for, write_script

pytestmark = pytest.mark.slow

CHATS = 20
STEPS = 3


def chain_rules(steps: int = STEPS, pause: float = 1.0) -> list[dict[str, Any]]:
    """Chat ``chat-NN:`` runs ``steps`` shell steps, the k-th appending ``chat-NN:sk`` after ``pause`` s;
    after an unknown outcome it answers without running anything (the restricted turn never repeats it)."""
    def step(k: int) -> dict[str, Any]:
        command = f'sleep {pause}; echo "$TAG"s{k} >> out.txt; echo did-"$TAG"s{k}'
        return {"text": f"step {k}.", "usage": {"input_tokens": 5, "output_tokens": 2},
                "tool_calls": [{"name": "shell", "arguments": {"command": command}}]}

    rules: list[dict[str, Any]] = []
    for i in range(CHATS):
        tag = f"chat-{i:02d}:"
        rules.append({"when": {"last_user_contains": tag, "tool_result_unknown": True},
                      "respond": {"text": f"{tag} an outcome is unknown; I will not run it again.",
                                  "usage": {"input_tokens": 3, "output_tokens": 1}}})
        rules.append({"when": {"last_user_contains": tag, "last_tool_result_contains": f"did-{tag}s{steps}"},
                      "respond": {"text": f"{tag} done.", "usage": {"input_tokens": 4, "output_tokens": 2}}})
        for k in range(steps, 1, -1):
            rules.append({"when": {"last_user_contains": tag, "last_tool_result_contains": f"did-{tag}s{k - 1}"},
                          "respond": _tagged(step(k), tag)})
        rules.append({"when": {"last_user_contains": tag}, "respond": _tagged(step(1), tag)})
    return rules


def _tagged(respond: dict[str, Any], tag: str) -> dict[str, Any]:
    call = respond["tool_calls"][0]
    command = call["arguments"]["command"].replace('"$TAG"', tag)
    return {**respond, "tool_calls": [{**call, "arguments": {"command": command}}]}


class Pool:
    """Servers (one per host name, each with its own state dir) on one control store and one ledger of a
    private cluster, all chats in one shared folder."""

    def __init__(self, tmp_path: Path, cluster: PrivateCluster, hosts: list[str], *, pause: float = 1.0,
                 quota: int = 4) -> None:
        self.cluster = cluster
        self.control_url = cluster.create_database("control")
        self.usage_url = cluster.create_database("usage")
        self.root = tmp_path / "root"
        self.root.mkdir()
        self.out = self.root / "out.txt"
        model = write_script(tmp_path / "script.json", chain_rules(pause=pause))
        args = [f"--GoalsApp.control_db_url={self.control_url}", f"--GoalsApp.usage_db_url={self.usage_url}",
                f"--GoalsApp.max_concurrent_turns={quota}"]
        self.servers = {host: ServerProcess(tmp_path / host / "state", self.root, model=model, extra=args,
                                            env={"JUPYTER_GOALS_HOST_NAME": host}) for host in hosts}
        for s in self.servers.values():
            s.state_dir.parent.mkdir(parents=True)

    def rows(self, sql: str, params: tuple[Any, ...] = (), *, ledger: bool = False) -> list[dict[str, Any]]:
        """Rows of the shared control store (or the ledger), read the way an operator would."""
        import psycopg
        from psycopg.rows import dict_row

        url = self.usage_url if ledger else self.control_url
        with psycopg.connect(url, row_factory=dict_row, connect_timeout=10) as conn:
            return [dict(r) for r in conn.execute(sql.replace("?", "%s"), params or None)]  # type: ignore[arg-type]

    def send_chats(self, server: ServerProcess, numbers: Iterable[int]) -> list[str]:
        sids = []
        cl = server.client()
        for i in numbers:
            snap = cl.create_session(title=f"chat {i}", cwd=str(self.root), permissions={"mode": "bypass"})
            sid = str(snap["session"]["session_id"])
            cl.send(sid, f"chat-{i:02d}: append your lines", client_request_id=f"c{i}")
            sids.append(sid)
        return sids

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def done(self) -> int:
        return int(self.rows("SELECT COUNT(*) AS n FROM work_items WHERE phase = 'done'")[0]["n"])

    def wait_all_done(self, n: int, timeout: float = 300) -> None:
        def finished() -> bool:
            try:
                return self.done() == n
            except Exception:  # noqa: BLE001 - the database coming back up
                return False

        wait_for(finished, timeout=timeout, what=f"all {n} chats done")

    def close(self) -> None:
        for s in self.servers.values():
            s.kill()


def storage_unavailable(server: ServerProcess) -> bool:
    """The server says the store is unavailable: health degraded with ``storage_unavailable`` naming the
    control store, and a read answered 503 ``storage_unavailable``."""
    headers = {"Authorization": f"token {server.token}"}
    try:
        health = httpx.get(f"{server.url}api/goals/health", headers=headers, timeout=10).json()
        if not (health["status"] == "degraded" and health["reason_code"] == "storage_unavailable"
                and health["databases"]["control"]["error"]["code"] == "storage_unavailable"):
            return False
        r = httpx.get(f"{server.url}api/goals/sessions", headers=headers, timeout=10)
    except (httpx.HTTPError, KeyError, TypeError):
        return False
    return r.status_code == 503 and r.json()["error"] == "storage_unavailable"


def healthy(server: ServerProcess) -> bool:
    try:
        return bool(server.client().health()["status"] == "ok")
    except Exception:  # noqa: BLE001
        return False


def assert_each_chat_ran_each_step_at_most_once(pool: Pool, sessions: list[str]) -> None:
    """No line twice; a chat none of whose calls was left unknown wrote every one of its lines."""
    lines = pool.lines()
    twice = sorted({ln for ln in lines if lines.count(ln) > 1})
    # what each call of a chat that wrote a line twice recorded, so that a failure says how it happened
    calls = [f"{r['title']} {r['effect_id']} {r['state']} {r['attempt_id']}: {(r['result'] or '')[:160]!r}"
             for r in pool.rows("SELECT s.title, e.effect_id, e.state, e.attempt_id, e.result FROM effects e"
                                " JOIN sessions s ON s.session_id = e.session_id ORDER BY e.created_at")
             if any(r["title"] == f"chat {int(ln[5:7])}" for ln in twice)]
    assert not twice, f"a step ran twice: {twice}; their calls: {calls}"
    unsure = {r["session_id"] for r in pool.rows("SELECT DISTINCT session_id FROM effects"
                                                  " WHERE state IN ('unknown', 'reconciled')")}
    titles = {r["session_id"]: r["title"] for r in pool.rows("SELECT session_id, title FROM sessions")}
    for sid in sessions:
        i = int(titles[sid].removeprefix("chat "))
        mine = [ln for ln in lines if ln.startswith(f"chat-{i:02d}:")]
        if sid not in unsure:
            assert sorted(mine) == [f"chat-{i:02d}:s{k}" for k in range(1, STEPS + 1)], (sid, mine)


def assert_nothing_half_written(pool: Pool) -> None:
    """Nothing stays in flight once the work converged, and each answered request is in the ledger once."""
    assert pool.rows("SELECT attempt_id, state FROM attempts WHERE state IN ('admitted', 'running')") == []
    assert pool.rows("SELECT turn_id FROM turns WHERE state = 'running'") == []
    assert pool.rows("SELECT effect_id, state FROM effects WHERE state IN ('planned', 'dispatched')") == []
    assert pool.rows("SELECT decision_key FROM recovery_decisions WHERE state = 'claimed'") == []
    assert pool.rows("SELECT request_id FROM requests WHERE state = 'sent'") == []
    calls = {r["call_id"] for r in pool.rows("SELECT call_id FROM transcript WHERE kind = 'tool_call'")}
    results = {r["call_id"] for r in pool.rows("SELECT call_id FROM transcript WHERE kind = 'tool_result'")}
    assert calls == results, f"calls without a result: {calls - results}"
    wait_for(lambda: not pool.rows("SELECT op_key FROM outbox WHERE state <> 'done'"), timeout=60,
             what="the usage outbox to drain")
    twice = pool.rows("SELECT request_id, COUNT(*) AS n FROM receipts GROUP BY request_id HAVING COUNT(*) > 1",
                      ledger=True)
    assert twice == []
    answered = {r["request_id"] for r in pool.rows("SELECT request_id FROM requests WHERE state = 'received'")}
    receipts = {r["request_id"] for r in pool.rows("SELECT request_id FROM receipts", ledger=True)}
    assert answered <= receipts


def test_postgresql_restarted_under_load_every_server_waits_and_all_chats_complete_once(
        tmp_path: Path, pg_cluster: PrivateCluster) -> None:
    pool = Pool(tmp_path, pg_cluster, ["host-a", "host-b"])
    try:
        a, b = (s.start() for s in pool.servers.values())
        sessions = pool.send_chats(a, range(0, CHATS // 2)) + pool.send_chats(b, range(CHATS // 2, CHATS))
        wait_for(lambda: len(pool.lines()) >= CHATS // 2, timeout=120, what="the chats under way")
        written = len(pool.lines())
        assert written < CHATS * STEPS and pool.done() < CHATS  # precondition: the crash lands under load

        pg_cluster.stop("immediate")  # the database crashes: every connection cut, transactions in flight lost
        for server in (a, b):  # every server says so, and serves no stale or half answer meanwhile
            wait_for(lambda server=server: storage_unavailable(server), timeout=60,
                     what=f"{server.url} to show storage_unavailable")
        pg_cluster.start()

        # nothing is asked of the servers from here: they converge by themselves
        pool.wait_all_done(CHATS)
        for server in (a, b):
            wait_for(lambda server=server: healthy(server), timeout=60, what="health ok again")
        assert_each_chat_ran_each_step_at_most_once(pool, sessions)
        assert_nothing_half_written(pool)
        assert len(pool.lines()) > written  # work went on after the restart
    finally:
        pool.close()


def test_postgresql_restarted_during_a_recovery_sweep_converges_by_itself(
        tmp_path: Path, pg_cluster: PrivateCluster) -> None:
    import psycopg

    pool = Pool(tmp_path, pg_cluster, ["host-a"])
    try:
        a = pool.servers["host-a"].start()
        sessions = pool.send_chats(a, range(CHATS))
        running = "SELECT attempt_id FROM attempts WHERE state = 'running'"
        wait_for(lambda: len(pool.rows(running)) >= 4 and len(pool.lines()) >= 4, timeout=120,
                 what="chats running")
        a.kill()  # the whole server: its attempts are left for the next start's recovery sweep
        interrupted = {r["attempt_id"] for r in pool.rows(running)}
        assert interrupted

        # hold the sweep inside its first claim: recovery_decisions locked against writes (reads pass)
        blocker = psycopg.connect(pool.control_url)
        blocker.execute("LOCK TABLE recovery_decisions IN EXCLUSIVE MODE")
        a.start(wait=False)
        waiting = ("SELECT pid FROM pg_stat_activity WHERE datname = 'control' AND wait_event_type = 'Lock'"
                   " AND query LIKE '%recovery_decisions%'")
        with psycopg.connect(pg_cluster.url(), autocommit=True) as watch:
            wait_for(lambda: bool(watch.execute(waiting).fetchall()),
                     timeout=120, what="the recovery sweep waiting inside its claim")
        pg_cluster.stop("immediate")  # the database crashes mid-sweep
        try:
            blocker.close()
        except psycopg.Error:
            pass
        wait_for(lambda: storage_unavailable(a), timeout=60, what="the server to show storage_unavailable")
        pg_cluster.start()

        pool.wait_all_done(CHATS)
        wait_for(lambda: healthy(a), timeout=60, what="health ok again")
        assert_each_chat_ran_each_step_at_most_once(pool, sessions)
        assert_nothing_half_written(pool)
        # each interrupted attempt was recovered once: one claim, decided and applied
        decided = pool.rows("SELECT decision_key, state FROM recovery_decisions WHERE decision_key LIKE 'recover:%'")
        keys = [d["decision_key"] for d in decided]
        assert len(keys) == len(set(keys))
        assert {f"recover:{x}" for x in interrupted} <= set(keys)
    finally:
        pool.close()


def test_rolling_restarts_and_a_database_crash_never_reuse_a_generation(
        tmp_path: Path, pg_cluster: PrivateCluster) -> None:
    """Each host restarted in turn (gracefully, kill -9, a worker alone) and the database crashed in
    between: every worker process that registers gets a generation above all earlier ones, and what an
    old generation writes is refused."""
    pool = Pool(tmp_path, pg_cluster, ["host-a", "host-b"])
    numbers = iter(range(CHATS))
    try:
        a, b = (s.start() for s in pool.servers.values())

        def more_work() -> list[str]:  # chats in flight at each restart: one more on each host
            return pool.send_chats(a, [next(numbers)]) + pool.send_chats(b, [next(numbers)])

        sessions = [*more_work(), *more_work(), *more_work()]
        wait_for(lambda: len(pool.lines()) >= 2, timeout=120, what="the chats under way")

        def generations(host: str | None = None) -> list[int]:
            sql = "SELECT generation FROM workers" + (" WHERE host_name = ?" if host else "")
            return [int(r["generation"]) for r in pool.rows(sql, (host,) if host else ())]

        def restarted(host: str, how: str) -> None:
            """Restart ``host`` (its server gracefully or with kill -9, or its worker alone, which its
            supervisor restarts); the host's new worker registers a generation above every earlier one."""
            server, before = pool.servers[host], max(generations())
            if how == "graceful":
                server.stop()
            elif how == "kill -9":
                server.kill()
            else:
                os.kill(server.workers()[0]["pid"], signal.SIGKILL)
            if server.proc is None:
                server.start()
            wait_for(lambda: max(generations(host)) > before, timeout=60, what=f"a new worker of {host} registered")
            sessions.extend(more_work())

        restarted("host-a", "graceful")
        restarted("host-b", "worker")
        restarted("host-b", "kill -9")
        pg_cluster.stop("immediate")
        wait_for(lambda: storage_unavailable(a) and storage_unavailable(b), timeout=60, what="both servers waiting")
        pg_cluster.start()
        restarted("host-a", "kill -9")  # and A again after the database crash

        pool.wait_all_done(len(sessions))
        workers = pool.rows("SELECT worker_id, generation, registered_at FROM workers ORDER BY registered_at")
        gens = [int(w["generation"]) for w in workers]
        assert len(gens) >= 6 and gens == sorted(gens) and len(set(gens)) == len(gens), gens
        assert pool.rows("SELECT a.attempt_id FROM attempts a JOIN workers w ON w.worker_id = a.worker_id"
                         " WHERE a.generation <> w.generation") == []
        assert pool.rows("SELECT decision_key FROM recovery_decisions WHERE decision_key LIKE 'recover:%'"), \
            "no restart met an attempt in flight"

        # an old generation's writes are refused: its heartbeat and a fenced write of its last attempt
        db = Database(pool.control_url)
        try:
            old = pool.rows("SELECT a.attempt_id, a.generation, a.worker_id FROM attempts a"
                            " WHERE a.generation < ? ORDER BY a.generation LIMIT 1", (max(gens),))
            assert old
            with pytest.raises(FencedError):
                db.transact(lambda tx: c.fence(tx, old[0]["attempt_id"], old[0]["generation"]))
            assert not db.transact(lambda tx: c.heartbeat_worker(tx, old[0]["worker_id"], old[0]["generation"], 3))
        finally:
            db.close()
        assert_each_chat_ran_each_step_at_most_once(pool, sessions)
        assert_nothing_half_written(pool)
    finally:
        pool.close()
