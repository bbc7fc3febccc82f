"""Execution: the turn loop, tools and permissions, the worker process and its supervisor.

May import everything below it (ground, ``store``, ``providers``, ``host``, ``usage``, ``goals``,
``recovery``); ``server`` starts workers through ``runtime.supervisor`` and never the reverse.
"""
