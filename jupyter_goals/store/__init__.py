"""Persistence only: every SQL statement of the package, and nothing that decides, prices or waits.

control.db (sessions, run intent, transcript, effects, approvals, Goals, waits, recovery decisions,
outbox, the event log) and usage.db (the ledger of record), on SQLite or PostgreSQL (``db``), with
versioned migrations (``schema``, their DDL in ``migrations``). Each function runs inside its caller's
one transaction and writes its event in it. May import only the ground modules (``models``, ``identity``,
``faults``); a test (``tests/test_layers.py``) keeps every statement here and every import pointing down.
"""
