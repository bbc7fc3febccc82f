"""The DDL of each database's versioned migrations, one module per database: ``control`` (control.db)
and ``usage`` (usage.db); ``store/schema.py`` applies them. Each migration is portable SQL (SQLite and
PostgreSQL: ``BIGINT``, ``DOUBLE PRECISION`` and ``TEXT`` only; JSON stored as TEXT), or SQL per
dialect where the two must differ. A migration, once released, never changes: a new one is appended.
"""

from __future__ import annotations

Migration = tuple[int, str, "str | dict[str, str]"]  # SQL, or SQL per dialect
