"""The ACP agent (``jupyter goals acp``, ``python -m jupyter_goals.acp``): Agent Client Protocol v1 over
stdio for Zed, Jupyter AI and any ACP client, on the durable sessions of a running jupyter_goals server.

- ``updates``: durable records → ACP updates (pure; one path for replayed and live updates);
- ``agent``: ``GoalsAgent`` (the ACP methods over REST and the event stream) and ``SessionFeed``.

stdout carries only JSON-RPC; logs go to stderr. The agent holds nothing canonical: kill it at any
moment and a client that loads the session again gets the whole conversation and every pending
approval back. Layer: a client (imports ``clients.rest`` and the ground models only).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jupyter goals acp",
                                description="ACP agent over stdio for a running jupyter_goals server.")
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the Jupyter server's URL (default: found as GoalsClient finds it)")
    p.add_argument("--token", help="the Jupyter server's token")
    p.add_argument("--log-level", default="WARNING", help="log level on stderr (default WARNING)")


def run(args: argparse.Namespace) -> int:
    try:
        from acp import run_agent

        from jupyter_goals.clients.acp.agent import GoalsAgent
    except ImportError as exc:  # the extra is not installed
        print(f"error: {exc}; install it with: pip install 'jupyter_goals[acp]'", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = GoalsAgent(args.url, args.token)

    async def serve() -> None:
        try:
            # session/resume and session/close are routed by the SDK (0.11, 0.12) only with the unstable flag
            await run_agent(agent, observers=[agent.observe], use_unstable_protocol=True)
        finally:
            await agent.close()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0
