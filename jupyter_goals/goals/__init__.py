"""Goals: lifecycle rules (pure), state tools, acceptance, and the hooks the turn loop calls.

May import: the ground modules, ``store``, ``providers``, ``usage``. The turn loop (``runtime``) calls
these hooks, never the reverse.
"""
