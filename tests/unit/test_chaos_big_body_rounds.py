"""Unit tests of how a big-body round is judged (chaos/rogue.py ``BigBodyFlood``), against fake
brokers on loopback: a broker that refuses late is not one that holds the bodies.

A round got through only if, ``refusal_bound_s`` after its bodies were sent, the broker still
held more of them than its budget allows (neither closed nor answered); a refusal after
``hold_s`` is late, counted with how late. A broker that holds a body keeps the connection
until a deadline (the login deadline, the body timeout) that lies past the bound, so however
slow the machine, late refusals never excuse it.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from chaos.rogue import BIG_BODY, LOGIN_TIMEOUT_S, REFUSAL_BOUND_S, BigBodyFlood

HOLD_S = 0.3
BOUND_S = 2.0
REFUSED = b"refused\n"  # what the fake answers: any reply or close counts as the broker's refusal


class FakeBroker:
    """A listening socket that takes its connections ``accept_after_s`` late (they wait in the
    kernel's accept queue, as behind another flood's burst on a loaded broker), then holds the
    first ``holds`` of them, reading every byte they send (buffering the body), and refuses the
    rest at their first read. Held ones are closed ``hold_for_s`` after they were taken (a
    deadline), or when the test ends."""

    def __init__(self, *, accept_after_s: float = 0.0, holds: int = 0, hold_for_s: float = 60.0) -> None:
        self.accept_after_s, self.holds, self.hold_for_s = accept_after_s, holds, hold_for_s
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.address = self.listener.getsockname()
        self.buffered = 0  # bytes of bodies the held connections read
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._serve = threading.Thread(target=self._accept_loop, daemon=True)
        self._serve.start()

    def _accept_loop(self) -> None:
        if self._halt.wait(self.accept_after_s):
            return
        self.listener.settimeout(0.05)
        taken = 0
        while not self._halt.is_set():
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            taken += 1
            target = self._hold if taken <= self.holds else self._refuse
            thread = threading.Thread(target=target, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _refuse(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(REFUSED)

    def _hold(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        deadline = time.monotonic() + self.hold_for_s
        with conn:
            while time.monotonic() < deadline and not self._halt.is_set():
                try:
                    data = conn.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.buffered += len(data)

    def close(self) -> None:
        self._halt.set()
        self._serve.join(5)
        for thread in self._threads:
            thread.join(5)
        self.listener.close()


@pytest.fixture
def fake_broker() -> Iterator[type[FakeBroker]]:
    made: list[FakeBroker] = []

    def make(**kwargs: float) -> FakeBroker:
        made.append(FakeBroker(**kwargs))  # type: ignore[arg-type]
        return made[-1]

    try:
        yield make  # type: ignore[misc]
    finally:
        for broker in made:
            broker.close()


def _flood(broker: FakeBroker, *, secure: bool) -> BigBodyFlood:
    return BigBodyFlood(broker.address, "chaos", secure=secure, running=lambda: 4242, source="127.0.0.1",
                        hold_s=HOLD_S, refusal_bound_s=BOUND_S)


def test_the_refusal_bound_lies_before_the_deadline_that_closes_a_held_body() -> None:
    # A secured broker that held a body closes it at its login deadline: never inside the bound.
    assert HOLD_S < BOUND_S and 1.5 < REFUSAL_BOUND_S < LOGIN_TIMEOUT_S


def test_a_broker_that_refuses_at_once_is_not_late(fake_broker) -> None:
    flood = _flood(fake_broker(), secure=True)
    flood.play_round()
    assert (flood.sent, flood.refused, flood.accepted, flood.late) == (6, 6, [], 0)


def test_a_broker_that_refuses_late_is_counted_late_not_as_holding_the_bodies(fake_broker) -> None:
    # The campaign's case: the round's connections waited in the accept queue past hold_s,
    # then the broker closed each at its first read, having buffered nothing.
    broker = fake_broker(accept_after_s=1.0)
    flood = _flood(broker, secure=True)
    flood.play_round()
    assert flood.accepted == [] and flood.refused == 6
    assert flood.late == 1 and 1.0 <= flood.latest_s < BOUND_S, flood.summary()
    assert flood.late_rounds and "refused after" in flood.late_rounds[0]
    assert broker.buffered == 0


def test_a_broker_that_reads_the_whole_body_still_gets_through(fake_broker) -> None:
    # Held (the body read as it comes) until a deadline past the bound: got through, however
    # patient the round. The same when it was also slow to take the connections.
    for accept_after_s in (0.0, 0.5):
        broker = fake_broker(accept_after_s=accept_after_s, holds=6, hold_for_s=BOUND_S + 2.0)
        flood = _flood(broker, secure=True)
        flood.play_round()
        assert flood.refused == 0 and len(flood.accepted) == 1, flood.summary()
        assert flood.accepted[0].startswith("6 of 6 big bodies held (at most 0)"), flood.accepted
        assert broker.buffered > 0


def test_security_off_a_late_503_past_the_budget_is_a_refusal(fake_broker) -> None:
    # The budget holds 4 bodies of 16 MiB; the other 2 are answered (late), the 4 stay open.
    flood = _flood(fake_broker(accept_after_s=0.8, holds=4), secure=False)
    assert flood.may_hold == 4 and BIG_BODY == 16 * 1024 * 1024
    flood.play_round()
    assert flood.accepted == [] and flood.refused == 2 and flood.late == 1, flood.summary()


def test_security_off_a_broker_past_its_budget_gets_through(fake_broker) -> None:
    flood = _flood(fake_broker(holds=6), secure=False)
    flood.play_round()
    assert len(flood.accepted) == 1 and flood.accepted[0].startswith("6 of 6 big bodies held (at most 4)"), flood.summary()


def test_a_round_the_runs_end_cuts_short_is_not_judged(fake_broker) -> None:
    flood = _flood(fake_broker(holds=6), secure=True)
    threading.Timer(0.3, flood._stop.set).start()
    flood.play_round()
    assert (flood.sent, flood.accepted) == (0, [])


def test_the_report_says_how_late_the_refusals_were() -> None:
    from chaos.hostile import late_refusals

    rows = [{"late": 0, "late_rounds": []},
            {"late": 2, "latest_s": 1.94, "late_after_s": 1.5, "late_rounds": ["round opened at 22:57:50,765: refused after 1.94 s"]}]
    assert late_refusals(rows) == ("; 2 rounds refused late (past 1.5 s), the latest after 1.94 s "
                                   "(first: round opened at 22:57:50,765: refused after 1.94 s)")
    assert late_refusals([{"late": 0}]) == ""
