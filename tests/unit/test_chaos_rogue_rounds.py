"""Unit tests of how a hostile-peer round is judged (chaos/rogue.py): only a round during which
the broker ran all along, from before its sockets were opened, is judged."""
from __future__ import annotations

import socket
from typing import Iterator

import pytest

from chaos.rogue import _closed_by_broker


@pytest.fixture
def silent_listener() -> Iterator[tuple[str, int]]:
    """A listening socket nobody accepts on: connections queue in the kernel, as they do at a
    broker stopped by SIGSTOP, and nothing is ever closed or answered."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()
    finally:
        server.close()


def _connect(address: tuple[str, int], n: int) -> list[socket.socket]:
    return [socket.create_connection(address, timeout=2) for _ in range(n)]


def test_a_round_opened_while_the_broker_was_stopped_is_not_judged(silent_listener):
    sockets = _connect(silent_listener, 3)
    try:
        # Stopped when the sockets were opened (None), running again by the time they are watched.
        assert _closed_by_broker(sockets, 0.3, replies_close=True, running=lambda: 4242, token=None) is None
    finally:
        for sock in sockets:
            sock.close()


def test_a_round_the_broker_ran_through_is_judged_and_shows_what_it_held(silent_listener):
    sockets = _connect(silent_listener, 3)
    try:
        assert _closed_by_broker(sockets, 0.3, replies_close=True, running=lambda: 4242, token=4242) == {}
        # Without a token the round starts when it is watched: the same verdict.
        assert _closed_by_broker(sockets, 0.3, replies_close=True, running=lambda: 4242) == {}
    finally:
        for sock in sockets:
            sock.close()


def test_a_round_cut_by_a_restart_is_not_judged(silent_listener):
    sockets = _connect(silent_listener, 2)
    pids = iter([4242, 4243, 4243, 4243, 4243, 4243, 4243, 4243])
    try:
        assert _closed_by_broker(sockets, 0.5, replies_close=True, running=lambda: next(pids, 4243)) is None
    finally:
        for sock in sockets:
            sock.close()


def test_a_round_that_got_through_says_when_it_opened_as_the_broker_log_writes_times() -> None:
    import re
    import time

    from chaos.rogue import wall_clock

    at = time.mktime((2026, 12, 7, 18, 23, 16, 0, 0, -1)) + 0.176
    assert wall_clock(at) == "18:23:16,176"
    assert re.fullmatch(r"\d\d:\d\d:\d\d,\d{3}", wall_clock(time.time()))
