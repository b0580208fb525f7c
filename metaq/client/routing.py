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
    """Broker urls that left ZooKeeper (their session is gone), with why: their requests in flight are abandoned.

    A broker whose session expired is dead or cut off, and a silent host never says so:
    waiting for its replies would last the whole request timeout. A master replaced
    while it stays registered (a hand-over, a demotion: it rejoins as a slave) is alive
    and answers what it was sent (an ack, or a refusal saying nothing was stored), so its
    requests are left to finish: abandoning them would resend puts it may have acked.
    """
    registered_after = {url for group in after.values() for url in _urls(group)}
    gone: dict[str, str] = {}
    for broker_id, group in before.items():
        for role, url in (("master", group.master), *((f"slave{k}", u) for k, u in group.slaves)):
            if url and url not in registered_after and url not in gone:
                new_master = after[broker_id].master if broker_id in after else None
                gone[url] = (f"{role} of broker group {broker_id} left ZooKeeper (its session is gone)"
                             + (f"; {new_master} is master now" if new_master else ""))
    return gone


def _urls(group: BrokerAddresses) -> list[str]:
    return [url for url in (group.master, *(u for _, u in group.slaves)) if url]
