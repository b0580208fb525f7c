"""Which replica of a partition a consumer reads from: one function, so HA can refine it.

A master and its slaves expose the same partition names at the same byte offsets, so a
consumer may switch between them between two fetches without losing its place.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..addresses import parse_broker_url


@dataclass(frozen=True)
class BrokerAddresses:
    """Where broker group ``broker_id`` can be reached right now (from /brokers/ids/{id})."""

    broker_id: int
    master: str | None = None  # meta://host:port
    slaves: tuple[tuple[int, str], ...] = ()  # ((slave_id, url), ...) sorted by slave_id


@dataclass(frozen=True)
class Replica:
    broker_id: int
    role: str  # "master" or "slave{k}"
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _replica(broker_id: int, role: str, url: str) -> Replica:
    host, port = parse_broker_url(url)
    return Replica(broker_id, role, host, port)


def choose_replica(
    broker: BrokerAddresses | None,
    read_from: str,
    avoid: Replica | None = None,
    rng: random.Random | None = None,
) -> Replica | None:
    """The replica to fetch a partition of ``broker`` from, or None when none qualifies.

    * ``master``: the master if present, else a random slave (MetaQ's
      ``Cluster.getBrokerRandom`` since 2013).
    * ``slave``: a random slave; never the master (None while no slave is up).
    * ``prefer-slave``: a random slave if any, else the master.

    ``avoid`` is the replica whose last fetch failed: when another one qualifies, it is
    picked instead, so a consumer does not keep hammering a dead slave while a live one
    is registered (ZooKeeper only notices a dead broker after its session timeout).
    """
    if broker is None:
        return None
    rng = rng or random._inst  # type: ignore[attr-defined]
    slaves = [_replica(broker.broker_id, f"slave{k}", url) for k, url in broker.slaves]
    master = _replica(broker.broker_id, "master", broker.master) if broker.master else None
    if read_from == "master":
        candidates = [master] if master else slaves
    elif read_from == "slave":
        candidates = slaves
    elif read_from == "prefer-slave":
        candidates = slaves or ([master] if master else [])
    else:
        raise ValueError(f"unknown read_from {read_from!r}")
    if avoid is not None and len(candidates) > 1:
        candidates = [r for r in candidates if r != avoid] or candidates
    elif avoid is not None and read_from == "master" and candidates == [avoid] and slaves and avoid.role == "master":
        # The master is registered but failing: MetaQ would wait for ZK; we read a slave meanwhile.
        candidates = slaves
    return rng.choice(candidates) if candidates else None


def departures(before: dict[int, BrokerAddresses], after: dict[int, BrokerAddresses]) -> dict[str, str]:
    """Broker urls whose requests in flight cannot be answered as they were meant, with why.

    A master that ZooKeeper no longer names (a new master, or none: its session is gone)
    cannot ack a put any more, and a silent host never says so: waiting for its reply
    would last the whole request timeout. A slave that is no longer registered anywhere
    is gone too. A slave promoted to master keeps its connections: it is the same process.
    """
    registered_after = {url for group in after.values() for url in (group.master, *(u for _, u in group.slaves)) if url}
    gone: dict[str, str] = {}
    for broker_id, group in before.items():
        new_master = after[broker_id].master if broker_id in after else None
        if group.master and group.master != new_master:
            gone[group.master] = (f"ZooKeeper names {new_master} as master of broker group {broker_id}" if new_master
                                  else f"broker group {broker_id} has no master in ZooKeeper any more")
        for slave_id, url in group.slaves:
            if url not in registered_after and url not in gone:
                gone[url] = f"slave{slave_id} of broker group {broker_id} is no longer registered in ZooKeeper"
    return gone
