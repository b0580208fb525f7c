"""Broker-wide connection slots and the request budget (metaq/server/admission.py), pure logic."""

from __future__ import annotations

from metaq.server.admission import ConnectionSlots, RequestBudget


class Conn:
    def __init__(self, host: str) -> None:
        self.peer_host = host
        self.evicted: str | None = None

    def evict(self, reason: str) -> None:
        self.evicted = reason


def test_a_newcomer_takes_the_slot_of_the_oldest_connection_not_logged_in() -> None:
    slots = ConnectionSlots(max_connections=3, max_per_address=10)
    oldest, logged, newer = Conn("a"), Conn("b"), Conn("a")
    for conn in (oldest, logged, newer):
        assert slots.admit(conn, logged_in=False) is None
    slots.logged_in(logged)
    newcomer = Conn("c")
    assert slots.admit(newcomer, logged_in=False) is None
    assert oldest.evicted and not newer.evicted and not logged.evicted
    assert slots.held == 3 and slots.not_logged_in == 2
    slots.release(oldest)  # its socket closes later: released once only
    assert slots.held == 3


def test_room_is_taken_from_the_address_with_the_most_connections_not_logged_in() -> None:
    slots = ConnectionSlots(max_connections=4, max_per_address=10)
    user = Conn("user")
    flood = [Conn("flood") for _ in range(3)]
    for conn in (user, *flood):  # the user's connection is the oldest
        assert slots.admit(conn, logged_in=False) is None
    assert slots.admit(Conn("other"), logged_in=False) is None
    assert flood[0].evicted and not user.evicted
    assert slots.not_logged_in == 4


def test_refused_only_past_the_address_cap_or_when_every_slot_logged_in() -> None:
    slots = ConnectionSlots(max_connections=2, max_per_address=1)
    first = Conn("a")
    assert slots.admit(first, logged_in=True) is None
    kind, reason = slots.admit(Conn("a"), logged_in=True)
    assert kind == "per_address" and "maxConnectionsPerAddress=1" in reason
    assert slots.admit(Conn("b"), logged_in=True) is None
    kind, reason = slots.admit(Conn("c"), logged_in=False)
    assert kind == "max_connections" and "maxConnections=2" in reason
    slots.release(first)
    assert slots.admit(Conn("a"), logged_in=True) is None


def test_the_budget_refuses_only_growth_past_its_limit() -> None:
    budget = RequestBudget(100)
    held = budget.move(0, 60)
    assert not budget.fits(0, 41) and budget.fits(0, 40)
    assert budget.fits(held, 100) and not budget.fits(held, 101)
    assert budget.fits(held, 10)  # shrinking always fits
    budget.move(held, 0)
    assert budget.held == 0
