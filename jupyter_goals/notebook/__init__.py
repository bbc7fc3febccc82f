"""Notebook side: the REST client (Python Workflow API); magics and MIME cards build on it."""
