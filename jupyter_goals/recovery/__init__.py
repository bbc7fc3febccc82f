"""Recovery: pure history repair and decisions, the Coordinator (the one recovery entry point), and the
takeover of a lost host's work (``takeover``), which ends its turns as recovery does (``interrupt``).

May import: the ground modules, ``store``, ``providers``, ``host``, ``usage``, ``goals``. Never
``runtime``: the turn loop uses ``repair``, and the Coordinator reads tool processes through ``host``.
"""
