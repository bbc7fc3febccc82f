"""Clients of the REST API: they hold nothing canonical; a client restart loses nothing.

Owns the one Python client library (``rest``: ``GoalsClient``, ``AsyncGoalsClient``, finding the
server), the notebook side (``notebook``: magics, MIME cards, widgets), the command line (``cli``),
the ACP agent for editors (``acp``, also ``python -m jupyter_goals.acp``) and the offline crash
demonstration (``demo``). Clients talk to the server only over REST and the event
stream; ``cli`` also reads the state dir for what it shows while no server runs. May import anything
below; nothing in the package imports a client but ``testing`` (which drives servers through ``rest``).
"""
