"""Recovery: pure history repair and decisions, and the Coordinator, the one recovery entry point.

May import: the ground modules, ``store``, ``providers``, ``host``, ``usage``, ``goals``. Never
``runtime``: the turn loop uses ``repair``, and the Coordinator reads tool processes through ``host``.
"""
