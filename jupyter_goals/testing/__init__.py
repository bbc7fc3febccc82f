"""Testing support shipped with jupyter_goals: real servers for process-level tests, benchmarks and demos.

- ``servers``: ``ServerProcess`` (one real ``jupyter server`` with the extension on an isolated state dir:
  start, ``kill()`` = kill -9 of its process group, restart on the same port), ``ServerFactory`` (servers
  on one state dir: the same installation restarted), ``write_script`` (a scripted model, DESIGN §11),
  ``wait_for``, ``full_passes`` (evidence that the Coordinator ran, never a fixed sleep);
- ``seed``: write sessions and long transcripts into a state dir through the real store functions;
- ``plugin``: pytest fixtures over them (``pytest_plugins = ["jupyter_goals.testing.plugin"]``).

Layer: on top of the package, beside the CLI; it starts servers as a person would (a subprocess) and talks
to them only through ``GoalsClient`` and the state dir's files. Nothing in the product imports it except
``jupyter goals demo``.
"""

from jupyter_goals.testing.servers import (
    ServerFactory,
    ServerProcess,
    free_port,
    full_passes,
    wait_for,
    write_script,
)

__all__ = ["ServerFactory", "ServerProcess", "free_port", "full_passes", "wait_for", "write_script"]
