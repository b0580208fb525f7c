from __future__ import annotations

import random

from metaq.client.routing import BrokerAddresses, Replica, choose_replica, departures

BOTH = BrokerAddresses(0, "meta://10.0.0.1:8123", ((1, "meta://10.0.0.2:8123"), (2, "meta://10.0.0.3:8123")))
MASTER_ONLY = BrokerAddresses(0, "meta://10.0.0.1:8123")
SLAVES_ONLY = BrokerAddresses(0, None, ((1, "meta://10.0.0.2:8123"),))


def roles(broker, read_from, avoid=None) -> set[str]:
    rng = random.Random(1)
    return {r.role if (r := choose_replica(broker, read_from, avoid, rng)) else None for _ in range(50)}


def test_master_rule_is_metaqs_master_if_present_else_a_slave() -> None:
    assert roles(BOTH, "master") == {"master"}
    assert roles(SLAVES_ONLY, "master") == {"slave1"}


def test_slave_never_reads_the_master() -> None:
    assert roles(BOTH, "slave") == {"slave1", "slave2"}
    assert roles(MASTER_ONLY, "slave") == {None}


def test_prefer_slave_falls_back_to_the_master() -> None:
    assert roles(BOTH, "prefer-slave") == {"slave1", "slave2"}
    assert roles(MASTER_ONLY, "prefer-slave") == {"master"}


def test_a_failed_replica_is_avoided_when_another_qualifies() -> None:
    slave1 = Replica(0, "slave1", "10.0.0.2", 8123)
    assert roles(BOTH, "slave", avoid=slave1) == {"slave2"}
    master = Replica(0, "master", "10.0.0.1", 8123)
    assert roles(BOTH, "master", avoid=master) == {"slave1", "slave2"}
    assert roles(MASTER_ONLY, "master", avoid=master) == {"master"}  # nothing else: keep trying it


def test_unknown_broker_has_no_replica() -> None:
    assert choose_replica(None, "master") is None


# --- departures: which brokers' requests in flight are abandoned -----------------------------


A, B, C = "meta://10.0.0.1:8123", "meta://10.0.0.2:8123", "meta://10.0.0.3:8123"


def test_a_master_whose_session_is_gone_departs() -> None:
    before = {0: BrokerAddresses(0, A, ((1, B),))}
    assert set(departures(before, {0: BrokerAddresses(0, B, ())})) == {A}  # B promoted: its connections stay
    assert "left ZooKeeper" in departures(before, {0: BrokerAddresses(0, None, ((1, B),))})[A]
    assert set(departures(before, {})) == {A, B}  # the whole group is gone


def test_a_demoted_master_still_registered_stays_and_a_vanished_slave_departs() -> None:
    before = {0: BrokerAddresses(0, A, ((1, B), (2, C)))}
    after = {0: BrokerAddresses(0, B, ((0, A),))}  # B leads, A (alive) rejoined as a slave, C vanished
    assert set(departures(before, after)) == {C}


def test_nothing_departs_when_nothing_changed_or_a_broker_joins() -> None:
    before = {0: BrokerAddresses(0, A, ((1, B),))}
    assert departures(before, before) == {}
    assert departures(before, {0: BrokerAddresses(0, A, ((1, B), (2, C)))}) == {}
