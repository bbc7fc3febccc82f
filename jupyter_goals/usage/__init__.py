"""Usage: what requests cost and whether one may be sent (the ledger's rules, not its statements).

Owns the versioned price table (``prices``), hard budgets (``budget``: a pure check and the reads
behind it), the one paid-request path (``paid``: reserve, call, settle) and the ledger's outbox loop
(``ledger``: control.db's operations applied to usage.db once, priced once with the table of the
moment). May import: the ground modules, ``store``, ``providers``. Never ``host``, ``goals``,
``recovery``, ``runtime``, ``server`` or ``clients``.
"""
