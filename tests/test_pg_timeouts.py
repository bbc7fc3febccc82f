"""A PostgreSQL control store that accepts connections but never answers (a hung server, a half-open
network path) is reported, not waited on forever: every connection the store opens carries libpq's
``connect_timeout`` (and TCP keepalives), so the first transaction answers ``StorageUnavailable`` within
seconds and the server can show ``storage_unavailable``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from jupyter_goals.store.db import Database, StorageUnavailable


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and then says nothing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in accepted:
            conn.close()
        server.close()


def test_a_postgresql_server_that_never_answers_is_storage_unavailable_within_seconds(silent_port: int) -> None:
    db = Database(f"postgresql://postgres@127.0.0.1:{silent_port}/test")
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            db.transact(lambda tx: tx.all("SELECT 1"), write=False)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=30)  # without connect_timeout the connect waits for the server forever
    assert not thread.is_alive(), "the first transaction still waits on a server that never answers"
    assert isinstance(outcome[0], StorageUnavailable), outcome
    assert time.monotonic() - started < 20
