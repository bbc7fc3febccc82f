"""The terminal UI (``jupyter goals tui``, ``python -m jupyter_goals.clients.tui``): Textual on a running
server's durable sessions, through REST and the event stream only (no second control path, no state of its
own beyond the server's answers and the messages not yet acknowledged).

- ``render``: what is shown, as plain words (pure);
- ``link``: ``ServerLink`` (REST + the one event stream, the connection state), ``SessionState``, ``Outbox``;
- ``session``, ``approval``, ``picker``, ``panels``, ``keys``: the screens, the help screen and the palette;
- ``app``: ``GoalsTui``.

Layer: a client (imports ``clients.rest``, ``clients.events`` and the ground models only).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the Jupyter server's URL (default: found as GoalsClient finds it)")
    p.add_argument("--token", help="the Jupyter server's token")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--continue", dest="continue_last", action="store_true",
                       help="open the session with the most recent activity")
    which.add_argument("--resume", metavar="ID", help="open this session")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jupyter goals tui", description="Terminal UI for a running jupyter_goals server.")
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        from jupyter_goals.clients.tui.app import GoalsTui
        from jupyter_goals.clients.tui.link import ServerLink
    except ImportError as exc:  # the extra is not installed
        print(f"error: {exc}; install it with: pip install 'jupyter_goals[tui]'", file=sys.stderr)
        return 2
    from jupyter_goals.clients.rest import ServerNotFound, find_server

    try:
        address = find_server(args.url, args.token)
    except ServerNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    link = ServerLink(address.url, address.token)
    GoalsTui(link, resume=args.resume, continue_last=args.continue_last).run()
    return 0
