"""Durable stores: control.db (run intent, transcript, effects, events, outbox) and usage.db (ledger)."""
