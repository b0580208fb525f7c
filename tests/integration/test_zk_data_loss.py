"""A broker group recovers from a ZooKeeper that lost its data, at any epoch.

docs/operations.md, "Losing ZooKeeper's data", run as written: a sync pair (A founds the
group, B is its slave) fails over once (A killed, B leads epoch 2 and acks alone), then
ZooKeeper is stopped, its data directory emptied and it is started again, and A (down
until now, its newest epoch 1, which it led) is started. Without a step from an operator
the broker that led the newest epoch (B, as its data dir says) re-seeds the group at an
epoch above every member's history while A yields to B's newer claim, A follows B and
truncates nothing acked, every acked message is readable on both, and writes resume
within ``RESUME_S``. Before the fix the old
master founded epoch 1 and failed ("epoch 1 is older than the latest one, 2") and the slave
waited for a sync set that was never published: no master, for good.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from metaq.server.producer_ids import RESEED_SKIP
from metaq.tools.launcher import BrokerFactory, wait_until
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.paths import ZkPaths
from tests.conftest import TEST_TICK_MS
from tests.harness import kazoo_client

from .failover_support import (
    Group,
    fetch_all,
    first_ack_after,
    make_pair,
    restart_empty,
    put_one,
    sync_system,
    wait_follows,
    wait_in_sync_set,
    wait_leads,
)

#: The bound the procedure promises (docs/operations.md): session expiry on reconnect, the
#: re-seed window (ha/election.py RESEED_WAIT_S) and the election, with room for a slow machine.
RESUME_S = 20.0


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[EmbeddedZooKeeper]:
    server = EmbeddedZooKeeper(data_dir=tmp_path / "zk", tick_ms=TEST_TICK_MS)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def acked_put(broker, payload: bytes) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    reply = put_one(broker, payload)
    assert reply.code == 200, f"{reply.code} {reply.message}"
    return int(reply["offset"]), payload


def served_through(broker, offset: int) -> dict[int, bytes] | None:  # type: ignore[no-untyped-def]
    """Every record ``broker`` serves, once it serves the one at ``offset``."""
    records = fetch_all(broker)
    return records if offset in records else None


def test_a_group_that_switched_over_recovers_from_an_emptied_zookeeper(own_zk: EmbeddedZooKeeper, tmp_path: Path) -> None:
    root = f"/meta-{uuid.uuid4().hex[:12]}"
    factory = BrokerFactory(tmp_path, own_zk.connect_string, root)
    try:
        with kazoo_client(own_zk.connect_string) as client:
            group = Group(client, root)
            a, b = make_pair(factory, sync_system(), group)
            acked = [acked_put(a, f"epoch1-{n}".encode()) for n in range(20)]

            # One failover: A is killed, B leads epoch 2 and acks alone (onSyncSlaveLoss=degrade),
            # so only B holds the epoch-2 messages. A stays down.
            a.kill()
            wait_leads(b, group, 1)
            first, _ = first_ack_after(b, b"epoch2-first")  # once B's sync set is published
            acked.append((int(first["offset"]), b"epoch2-first"))
            acked += [acked_put(b, f"epoch2-{n}".encode()) for n in range(20)]
            assert group.epoch() == 2

        # ZooKeeper loses everything: stopped, its data directory emptied, started again.
        back_at = restart_empty(own_zk)
        # A comes back now, as step 1 of the procedure says: a stale member (it led epoch 1,
        # the newest it knows) claiming beside B. Were A to re-seed, B would follow it and
        # cut the epoch-2 acks; A must yield to B's newer history.
        a.start(wait=False)

        with kazoo_client(own_zk.connect_string) as client:
            group = Group(client, root)
            _, acked_at = first_ack_after(b, b"after-the-loss", timeout=RESUME_S + 10)
            resumed_s = acked_at - back_at
            assert resumed_s < RESUME_S, f"writes resumed {resumed_s:.1f}s after ZooKeeper came back"
            assert group.epoch() > 2, "the group was re-seeded above every member's epoch history"
            wait_follows(a, b, group)
            wait_in_sync_set(group, group.slave_id_of(a))
            tail = acked_put(b, b"and-replicated")

            for broker in (b, a):
                records = wait_until(lambda: served_through(broker, tail[0]), 20, message=f"{broker.name} to serve the last ack")
                lost = [(offset, payload) for offset, payload in acked if records.get(offset) != payload]
                assert not lost, f"{broker.name} lost acked messages: {lost[:3]}"
            assert not list((a.dir / "data").glob("*/truncated-*")), "A truncated although it held nothing unacked"
            assert "knows a newer epoch" in a.log_text(), "A did not compare its history with B's claim"
            # The topic configuration went with the rest; the new master wrote back what it serves.
            config = json.loads(client.get(ZkPaths(root).topic_config(0))[0])
            assert config["topics"]["fo"]["numPartitions"] == "1", config
            # So did the producer id counter: it starts again past every id a log holds, so no
            # idempotent producer is given an id whose old sequence state would swallow its batches.
            assert int(client.get(ZkPaths(root).producer_ids(0))[0]) >= RESEED_SKIP
            print(f"writes resumed {resumed_s:.1f}s after ZooKeeper came back empty; epoch {group.epoch()}")
    except AssertionError as error:
        # Its own factory: the session's broker-log report does not reach these brokers.
        raise AssertionError(f"{error}\n{factory.log_report(last_lines=60)}") from None
    finally:
        factory.stop_all()


def test_when_the_last_master_is_gone_one_command_reseeds_from_the_newest_member(own_zk: EmbeddedZooKeeper, tmp_path: Path) -> None:
    """Step 3 of the procedure: the broker that led the newest epoch is gone for good, so
    nobody re-seeds by itself; `metaq promote --unclean` (it used to time out) elects the
    member with the newest history above it, and (a sync-set member) it holds every ack."""
    from metaq.cli.promote import promote

    root = f"/meta-{uuid.uuid4().hex[:12]}"
    factory = BrokerFactory(tmp_path, own_zk.connect_string, root)
    try:
        with kazoo_client(own_zk.connect_string) as client:
            a, b = make_pair(factory, sync_system(), Group(client, root))
            acked = [acked_put(a, f"epoch1-{n}".encode()) for n in range(10)]
        restart_empty(own_zk, while_down=a.kill)  # the master dies with ZooKeeper's data
        with kazoo_client(own_zk.connect_string) as client:
            group = Group(client, root)
            wait_until(lambda: "waiting for the broker that led epoch 1 to re-seed" in b.log_text(), 20,
                       message="B to wait for the broker that led epoch 1")
            assert group.master() is None
            lines = promote(client, root, 0, group.slave_id_of(b), unclean=True, timeout=15)
            assert "leads broker group 0 in epoch 2" in lines[-1], lines
            first_ack_after(b, b"after-promote", timeout=5)
            records = fetch_all(b)
            assert [(o, p) for o, p in acked if records.get(o) != p] == []
    finally:
        factory.stop_all()
