"""This machine: what runtime and recovery both need to know about processes and secrets here.

Owns a detached tool process's files and probes (``effect_files``: its real result, whether the same
process still runs, the kill of its group), the secrets policy (``secrecy``: a tool's environment,
redaction) and local wake-ups (``wake``: a datagram socket per listener, PostgreSQL LISTEN/NOTIFY
across hosts). May import: the ground modules and ``store`` (a PostgreSQL wake-up opens its own
connection). Never ``usage``, ``goals``, ``recovery``, ``runtime``, ``server`` or ``clients``.
"""
