"""Execution: the turn loop, tools, the worker process and its supervisor."""
