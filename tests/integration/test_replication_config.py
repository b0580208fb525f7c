"""Config auto-sync and read visibility on a master/slave pair (real ZooKeeper, real processes)."""

from __future__ import annotations

from metaq.protocol import commands as c
from tests.integration.replication_support import (
    NO_FAILOVER,
    assert_identical,
    bounds,
    put,
    replica_rows,
    request,
    sleep,
    wait_caught_up,
    wait_for,
)


def test_topic_added_on_master_replicates_after_auto_sync(broker_factory):
    master = broker_factory(0, {"orders": 1}, system=NO_FAILOVER)
    synced = broker_factory(0, {"orders": 1}, system=NO_FAILOVER, slave_props={"slaveId": 0, "autoSyncMasterConfig": True})
    # A slave that keeps its own config: its file names no partition count for new topics,
    # so it uses its own [system] default (1) in its config, and the master's layout for logs.
    own = broker_factory(0, {"orders": 1}, system=NO_FAILOVER, slave_props={"slaveId": 1, "autoSyncMasterConfig": False})
    own_ini = own.config_path.read_bytes()
    put(master, "orders", 0, 100)
    wait_caught_up(master, synced, [("orders", 0)])
    wait_caught_up(master, own, [("orders", 0)])

    # MetaQ has no hot reload: rewrite the master's server.ini and restart it.
    with master.config_path.open("a") as ini:
        ini.write("[topic=audit]\nnumPartitions=3\nunflushThreshold=7\n\n")
    master.restart()
    for partition in range(3):
        put(master, "audit", partition, 50 + partition)
    parts = [("orders", 0)] + [("audit", p) for p in range(3)]
    wait_caught_up(master, synced, parts, timeout=25)
    wait_caught_up(master, own, parts, timeout=25)
    assert_identical(master, slaves=2)

    # The auto-syncing slave adopted the master's topic sections (a copy is kept beside its
    # own file); the other slave's server.ini is untouched and it has no master copy.
    master_copy = synced.config_path.with_name("server.ini.master")
    assert "[topic=audit]" in master_copy.read_text()
    assert own.config_path.read_bytes() == own_ini
    assert not own.config_path.with_name("server.ini.master").exists()
    # Both report the master's partitions; neither wrote anything of its own.
    assert {k for k in replica_rows(own) if k[0] == "audit"} == {("audit", p) for p in range(3)}
    assert all(row["state"] == "following" for row in replica_rows(synced).values())


def test_consumers_never_see_uncommitted_bytes(broker_factory):
    # Flushed only by the timer, 4 s after the put: until then nothing is committed.
    system = {**NO_FAILOVER, "unflushThreshold": 1000000, "unflushInterval": 4000}
    master = broker_factory(0, {"orders": 1}, system=system)
    slave = broker_factory(0, {"orders": 1}, system=system, slave_props={"slaveId": 0})
    sleep(4.5)  # let the first (empty) timer round pass, so the window below is long
    put(master, "orders", 0, 20)
    end = bounds(master, "orders", 0)[1]
    get = {"op": "get", "topic": "orders", "partition": 0, "offset": 0, "max_size": 65536}

    # A replica fetch reads up to the log end...
    epoch = request(master, {"op": "topics"}).get("epoch", 0)
    replica = request(master, {**get, "replica": {"slave_id": 0, "epoch": epoch, "log_end": 0}})
    assert replica.code == c.OK and len(replica.body) == end
    # ...for a slave ZooKeeper names only: a phantom slave id reads nothing.
    assert request(master, {**get, "replica": {"slave_id": 9, "epoch": epoch, "log_end": 0}}).code == c.FORBIDDEN
    # ...the slave has the bytes, but consumers of either broker get nothing yet.
    wait_for(lambda: bounds(slave, "orders", 0)[1] == end, 10, "the slave to copy the bytes")
    for broker in (master, slave):
        reply = request(broker, get)
        assert reply.code == c.NOT_FOUND, (broker.name, reply.header)
    assert replica_rows(slave)[("orders", 0)]["log_end"] == str(end)

    # Once the master flushed, consumers of both see exactly the same bytes.
    wait_for(lambda: request(master, get).code == c.OK, 10, "the master's flush")
    wait_for(lambda: request(slave, get).code == c.OK, 10, "the slave to learn the committed offset")
    assert bytes(request(slave, get).body) == bytes(request(master, get).body) == bytes(replica.body)
