"""``jupyter goals status | recover [--explain] | stop-all | doctor`` (and ``acp``, ``tui``: clients of a running server): works on the stores directly,
so it also works while the server is down."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from jupyter_goals.config import GoalsConfig
from jupyter_goals.host.wake import ADMISSION, CONTROLS, Notifier
from jupyter_goals.identity import host_name
from jupyter_goals.recovery import takeover
from jupyter_goals.store import control as c
from jupyter_goals.store import known
from jupyter_goals.store.db import Database, MigrationFailed, StorageUnavailable, Tx, VersionConflict
from jupyter_goals.store.schema import current_version, migrate, quick_check


def _config(args: argparse.Namespace) -> tuple[Path, str, str]:
    from jupyter_goals.server.app import GoalsApp

    cfg = GoalsApp().service_config()
    state = Path(args.state_dir).absolute() if args.state_dir else cfg.state_dir
    control = args.control_db_url or (cfg.control_db_url if not args.state_dir else f"sqlite:///{state / 'control.db'}")
    usage = cfg.usage_db_url if not args.state_dir else f"sqlite:///{state / 'usage.db'}"
    return state, control, usage


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_status(db: Database) -> int:
    """Recent work; another host's work as views show it (``owner_host_unreachable`` with the host and
    since when, while that host is unreachable)."""
    me = host_name()

    def read(tx: Tx) -> list[dict[str, Any]]:
        return [takeover.owner_view(dict(r), takeover.owner_of(tx, r, me)) for r in c.recent_work(tx)]

    rows = db.transact(read, write=False)
    if not rows:
        print("No work yet.")
    for r in rows:
        where = f"[{r['owner_host']}] " if r.get("owner_host") else ""
        print(f"{r['work_id']}  {r['phase']:<11} {r['desired_state']:<9} {r['title'][:30]:<30} {where}{r['reason']}")
    return 0


def cmd_takeover(db: Database, from_host: str, session_id: str | None) -> int:
    """``jupyter goals takeover --from HOST [--session ID]``: this host takes over the lost host's work."""
    me = host_name()
    by = f"{getpass.getuser()} on {me} (jupyter goals takeover)"
    try:
        moved = db.transact(lambda tx: takeover.take_over(tx, from_host=from_host, to_host=me, by=by,
                                                          claimant=takeover.claimant(), session_id=session_id))
    except VersionConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not moved.taken:
        print(f"Nothing to take over: {from_host} has no unfinished work" + (f" in session {session_id}." if session_id else "."))
        return 0
    print(f"Took over {len(moved.taken)} work item(s) from {from_host} on {me}: {', '.join(moved.taken)}")
    if moved.unknown_calls:
        print(f"Calls running on {from_host} are unknown outcomes here (never run again without approval):"
              f" {', '.join(moved.unknown_calls)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jupyter goals", description="Durable AI-agent work for Jupyter.")
    p.add_argument("--state-dir", help="state dir (default: $JUPYTER_GOALS_STATE_DIR or the Jupyter data dir)")
    p.add_argument("--control-db-url", help="control database URL")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="list recent work items with state and reason")
    rec = sub.add_parser("recover", help="run the Coordinator's recovery entry point once")
    rec.add_argument("--explain", action="store_true", help="only print what recovery would decide, and why")
    sub.add_parser("stop-all", help="quit and stop all tasks: persist user stop intent for every running item")
    take = sub.add_parser("takeover", help="take over the work of a lost host (its leases expired) on this host:"
                                           " its running calls become unknown outcomes, its late writes are fenced")
    take.add_argument("--from", dest="from_host", required=True, metavar="HOST", help="the lost host's name")
    take.add_argument("--session", metavar="ID", help="only this session's work (default: all of HOST's work)")
    doc = sub.add_parser("doctor", help="check the stores (schema, integrity, write lock, free space, permissions)"
                                           " and explain what to do")
    doc.add_argument("--repair", action="store_true",
                     help="repair what can be repaired offline: a missing usage ledger rebuilt from control.db,"
                          " the state dir's permissions (the server must not be running)")
    doc.add_argument("--start-over", action="store_true",
                     help="the person's choice when the control store this state dir used is gone or replaced: begin"
                          " again with an empty history (or with the store there now); a waiting server goes on")
    demo = sub.add_parser("demo", help="offline: kill -9 a server while a chat's command runs, restart it, and watch"
                                       " the chat finish by itself with the command run exactly once")
    demo.add_argument("--dir", help="where to keep the demo's state and workspace (default: a new temp dir)")
    acp = sub.add_parser("acp", help="an ACP agent over stdio (Zed, Jupyter AI, any ACP client) on a running server's"
                                     " durable sessions; needs the 'acp' extra")
    from jupyter_goals.clients.acp import add_arguments as acp_arguments

    acp_arguments(acp)
    tui = sub.add_parser("tui", help="the terminal UI (Textual) on a running server's durable sessions; needs the"
                                     " 'tui' extra")
    from jupyter_goals.clients.tui import add_arguments as tui_arguments

    tui_arguments(tui)
    args = p.parse_args(argv)
    if args.command == "demo":
        from jupyter_goals.clients.demo import run_demo

        return run_demo(args.dir)
    if args.command == "acp":
        from jupyter_goals.clients.acp import run as run_acp

        return run_acp(args)
    if args.command == "tui":
        from jupyter_goals.clients.tui import run as run_tui

        return run_tui(args)
    state, control_url, usage_url = _config(args)
    if args.command == "doctor":
        if args.start_over:
            return start_over(state, control_url)
        return doctor(state, control_url, usage_url, repair=args.repair)
    if (lost := _control_lost(state, control_url)) is not None:  # never read or written as if it were ours
        print(f"error: {lost.message} {lost.action}", file=sys.stderr)
        return 2
    if control_url.startswith("sqlite:///") and not os.path.exists(control_url.removeprefix("sqlite:///")):
        print(f"error: no control database at {control_url} (has the server run with this state dir?)", file=sys.stderr)
        return 2
    db = Database(control_url)
    try:
        version = db.transact(current_version, write=False)
        if version == 0:
            print("error: the control database has no schema yet", file=sys.stderr)
            return 2
        if args.command == "status":
            return cmd_status(db)
        if args.command == "takeover":
            code = cmd_takeover(db, args.from_host, args.session)
            _wake_server(state, control_url)  # this host's server admits the work now
            return code
        if args.command == "stop-all":
            stopped = db.transact(c.stop_all)
            _wake_server(state, control_url)
            print(f"Stopped {len(stopped)} work item(s)." if stopped else "Nothing was running.")
            return 0
        if args.command == "recover":
            code = asyncio.run(recover(db, server_config(state, control_url, usage_url), args.explain))
            if not args.explain:
                _wake_server(state, control_url)
            return code
    except StorageUnavailable as exc:
        print(f"error: storage unavailable: {exc}", file=sys.stderr)
        return 3
    finally:
        db.close()
    return 0


def _wake_server(state: Path, control_url: str) -> None:
    """A running server's admission loop (every host's, on PostgreSQL) decides at once about what this
    command changed, and its workers' running calls look for a Stop."""
    notifier = Notifier(state, url=control_url)
    notifier.notify(ADMISSION)
    notifier.notify(CONTROLS)
    notifier.close()


def server_config(state: Path, control_url: str, usage_url: str) -> GoalsConfig:
    """The configuration the server last started with on this state dir (its default model, named
    models, trusted tools, price table and limits); the defaults when it never saved one."""
    from jupyter_goals.server.app import demo_model

    saved = GoalsConfig.load(state)
    if saved is None:
        return GoalsConfig(state_dir=state, control_db_url=control_url, usage_db_url=usage_url,
                           default_model=demo_model(), demo_model=demo_model())
    return saved.replace(control_db_url=control_url, usage_db_url=usage_url)


async def recover(db: Database, cfg: GoalsConfig, explain: bool) -> int:
    """The server's Coordinator, built from the server's configuration, on the same stores."""
    from jupyter_goals.recovery.coordinator import Coordinator
    from jupyter_goals.runtime.tools import ToolRegistry
    from jupyter_goals.server import catalog
    from jupyter_goals.usage.prices import PriceTableError, load_price_table

    try:
        prices = load_price_table(cfg.price_table or None)
    except PriceTableError:
        prices = None  # the server then quotes nothing either
    try:
        specs = catalog.parse_specs(cfg.models or {})
    except ValueError:
        specs = {}
    listed = catalog.ModelCatalog(cfg.default_model, specs, cfg.demo_model, prices or load_price_table(None))
    os.environ[catalog.NAMED_ENV] = listed.export_named()  # named models resolve as in the server's workers
    coord = Coordinator(db, cfg, registry=ToolRegistry(cfg.trusted_tools), prices=prices)
    if explain:
        _print(await coord.explain())
    else:
        coord.admission_open = False  # only the server's Coordinator admits; this repairs and decides
        _print((await coord.recover()).as_dict())
    return 0


def doctor(state: Path, control_url: str, usage_url: str, *, repair: bool = False) -> int:
    """Explain the state of the stores, one line each, and repair what can be repaired offline."""
    ok = True
    print(f"state dir: {state}")
    if state.exists():
        mode = state.stat().st_mode & 0o777
        if mode & 0o077:
            if repair:
                state.chmod(0o700)
                print(f"permissions: were {oct(mode)}; now 0o700 (repaired)")
            else:
                ok = False
                print(f"permissions: {oct(mode)}: others can read the records; `jupyter goals doctor --repair` sets 0o700")
        free = shutil.disk_usage(state).free
        if free < 100 * 1024 * 1024:
            ok = False
            print(f"free space: {free // (1024 * 1024)} MB: commits fail when it runs out (503 storage_full); free some")
        else:
            print(f"free space: {free // (1024 * 1024)} MB")
    lost = _control_lost(state, control_url)
    if lost is not None:
        ok = False
        print(f"control: MISSING: {lost.message} {lost.action}")
    for which, url in (("control", control_url), ("usage", usage_url)):
        if which == "control" and lost is not None:
            continue  # nothing is opened there (an empty SQLite file would be created)
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        if path is not None and not os.path.exists(path):
            if which == "usage" and os.path.exists(control_url.removeprefix("sqlite:///")):
                ok = _missing_ledger(control_url, usage_url, repair) and ok
            else:
                print(f"{which}: {url} does not exist yet (created at the next server start)")
            continue
        db = Database(url)
        try:
            v = db.transact(current_version, write=False)
            print(f"{which}: {url} schema v{v}")
            if path is not None:
                ok = _sqlite_checks(db, which, path) and ok
        except StorageUnavailable as exc:
            ok = False
            print(f"{which}: UNAVAILABLE ({exc.code}): {exc}")
        finally:
            db.close()
    try:
        for which, url in (("control", control_url), ("usage", usage_url)):
            if url.startswith("sqlite:///") and not os.path.exists(url.removeprefix("sqlite:///")):
                continue
            if which == "control" and lost is not None:
                continue
            db = Database(url)
            try:
                migrate_check(db, which)
            finally:
                db.close()
    except (MigrationFailed, StorageUnavailable) as exc:
        ok = False
        print(f"migration: FAILED: {exc}")
    print("ok" if ok else "problems found")
    return 0 if ok else 1


def _control_lost(state: Path, control_url: str) -> known.Lost | None:
    db = Database(control_url)
    try:
        return known.lost(state, db)  # never creates the file
    finally:
        db.close()


def start_over(state: Path, control_url: str) -> int:
    """``doctor --start-over``: the control store this state dir used is lost and the person chooses to
    begin again (an empty history, or the store there now). Exits 2 when nothing is lost: a store that
    is there is never given up by this command."""
    lost = _control_lost(state, control_url)
    if lost is None:
        print(f"nothing to do: the control store at {known.redact(control_url)} is the one this state dir used"
              " (or none is known yet)", file=sys.stderr)
        return 2
    known.forget(state, control_url)
    _wake_server(state, control_url)
    print(f"Starting over: the control store this state dir used at {known.redact(control_url)} is given up. The"
          " next start (a waiting server within seconds) uses the store there now: an empty history if there is none.")
    return 0


def _sqlite_checks(db: Database, which: str, path: str) -> bool:
    """Integrity (``PRAGMA quick_check``) and whether another process holds the write lock."""
    ok = True
    try:
        result = db.transact(quick_check, write=False)
    except StorageUnavailable as exc:  # a page so damaged that the check itself stops on it
        result = [str(exc)]
    if result == ["ok"]:
        print(f"{which}: integrity ok")
    else:
        ok = False
        backups = sorted(Path(path).parent.glob(Path(path).name + ".v*.bak"), key=lambda b: b.stat().st_mtime)
        hint = (f"the newest backup is {backups[-1]} (made before a migration; later records are not in it)"
                if backups else "there is no backup beside it")
        print(f"{which}: integrity FAILED: {'; '.join(result[:3])}. Keep the file; {hint}. "
              f"With the server stopped, `sqlite3 {Path(path).name} .recover` can save what is readable.")
    try:
        db.transact(lambda tx: None, lock_wait_ms=200)  # takes and releases the write lock, writes nothing
        print(f"{which}: write lock free")
    except StorageUnavailable as exc:
        ok = False
        print(f"{which}: write lock held by another process ({exc.code}): a running server holds it only for "
              "milliseconds; if none runs, find the holder with `fuser` on the file")
    return ok


def _missing_ledger(control_url: str, usage_url: str, repair: bool) -> bool:
    """usage.db is gone while control.db exists: the ledger can be rebuilt from control.db's record of
    every operation applied to it (the next server start does it by itself; ``--repair`` does it now)."""
    control = Database(control_url)
    try:
        n = control.transact(c.done_outbox_count, write=False)
        if not repair:
            print(f"usage: {usage_url} is missing; control.db recorded {n} ledger operation(s): the next server"
                  " start (or `jupyter goals doctor --repair`) rebuilds the ledger from them (active-time intervals"
                  " are not rebuilt)")
            return n == 0
        usage = Database(usage_url)
        try:
            migrate(usage, "usage")
        finally:
            usage.close()
        requeued = control.transact(c.requeue_done_outbox)
        print(f"usage: {usage_url} created; {requeued} ledger operation(s) queued again: the next server start"
              " applies them, once each (repaired)")
        return True
    finally:
        control.close()


def migrate_check(db: Database, which: str) -> None:
    from jupyter_goals.store.schema import MIGRATIONS

    v = db.transact(current_version, write=False)
    newest = MIGRATIONS[which][-1][0]
    if v > newest:
        raise MigrationFailed(f"{which} schema v{v} is newer than this code (v{newest})")
    if v < newest:
        print(f"{which}: will migrate v{v} -> v{newest} at next server start (a backup is made first)")
    _ = migrate  # migrations themselves run only in the server


if __name__ == "__main__":
    sys.exit(main())
