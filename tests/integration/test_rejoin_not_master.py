"""A rejoining broker pointed at a broker that is not the master truncates nothing (real processes).

ZooKeeper names, as broker group 0's master in epoch 2, the address of a broker that is a
*slave* (of group 1, serving a topic of the same name with other messages): a stale
address, the case of a master node naming an address another broker now listens on. Group
0's former master R restarts and rejoins. Before, it asked that broker where its epoch ends,
got the slave's own history, found no byte in common and moved its whole log aside. Now the
slave refuses ``epoch_end`` (403, ``reason: not_master``, its ``role`` and
``serving_epoch``), R cuts nothing, says so once, and reads the master node again with a
growing wait; once ZooKeeper names no such master, R still holds every byte it took.
A new slave pointed there the same way says it once from its follower and asks ZooKeeper
again instead of fetching from it.
"""

from __future__ import annotations

from datetime import datetime

from metaq.tools.launcher import BrokerProcess, wait_until
from metaq.zk.paths import ZkPaths, encode_epoch

from .failover_support import truncated_files
from .replication_support import put, request

TOPIC = "fo"
SAID = "not as the acting master in epoch 2"
RETRIED = "is not the acting master of epoch 2; re-evaluating"


def name_another_groups_slave_as_master(broker_factory, zk_client, zk_root) -> BrokerProcess:  # type: ignore[no-untyped-def]
    """Group 1: a master and its slave, serving a topic of the same name with other messages;
    ZooKeeper then names that slave's address as group 0's master of epoch 2 (the test's session
    holds the node). Returns the slave."""
    other_master = broker_factory(1, {TOPIC: 1})
    put(other_master, TOPIC, 0, 10, size=77)
    slave = broker_factory(1, {TOPIC: 1}, slave_props={"slaveId": 0})
    wait_until(lambda: slave.disk_log(TOPIC, 0) == other_master.disk_log(TOPIC, 0), 30, message="group 1's slave to catch up")
    paths = ZkPaths(zk_root)
    if zk_client.exists(paths.epoch(0)):
        zk_client.set(paths.epoch(0), encode_epoch(2, slave.url, "another-broker"))
    else:
        zk_client.create(paths.epoch(0), encode_epoch(2, slave.url, "another-broker"), makepath=True)
    zk_client.create(paths.master(0), slave.url.encode(), ephemeral=True, makepath=True)
    return slave


def retry_gaps(text: str) -> list[float]:
    """Seconds between the coordinator's successive re-reads after a refusal."""
    times = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") for line in text.splitlines() if RETRIED in line]
    return [(b - a).total_seconds() for a, b in zip(times, times[1:])]


def test_a_rejoining_broker_pointed_at_a_slave_cuts_nothing_and_says_so_once(broker_factory, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    # Group 0: R founds it (epoch 1), takes 30 messages, stops cleanly.
    rejoining = broker_factory(0, {TOPIC: 1})
    put(rejoining, TOPIC, 0, 30, size=120)
    rejoining.stop()
    before = rejoining.disk_log(TOPIC, 0)
    assert len(before[1]) > 0

    slave = name_another_groups_slave_as_master(broker_factory, zk_client, zk_root)
    slave_log = slave.disk_log(TOPIC, 0)
    paths = ZkPaths(zk_root)

    rejoining.start(wait_zk=False)
    wait_until(lambda: SAID in rejoining.log_text(), 30, message="the rejoining broker to refuse the slave's answer")
    wait_until(lambda: rejoining.log_text().count(RETRIED) >= 6, 30, message="six reads of ZooKeeper")

    text = rejoining.log_text()
    said = [line for line in text.splitlines() if SAID in line]
    assert len(said) == 1 and "WARNING" in said[0] and "answers as slave0, serving epoch 1" in said[0], said
    # Bounded: the wait before each new read of ZooKeeper doubles (0.1 s to 2 s, plus the
    # coordinator's 0.2 s); it once stayed at 0.2 s, a log line and a connection each time.
    gaps = retry_gaps(text)
    assert gaps[4] >= 1.5, gaps  # the fifth wait is 1.6 s
    assert rejoining.disk_log(TOPIC, 0) == before, "nothing of group 0's log was cut"
    assert truncated_files(rejoining, TOPIC, 0) == []
    assert "truncated fo-0" not in text
    assert slave.disk_log(TOPIC, 0) == slave_log

    # ZooKeeper stops naming it: R answers at once (orphaned; group 0's lawful master is
    # gone, so nobody takes over) and still holds every byte it took.
    zk_client.delete(paths.master(0))
    wait_until(lambda: "following --master_gone--> orphaned" in rejoining.log_text(), 10, message="R to leave the named master")
    reply = request(rejoining, {"op": "offset", "topic": TOPIC, "partition": 0, "offset": 0})
    assert reply.code == 200 and reply["min_offset"] == before[0]
    assert rejoining.disk_log(TOPIC, 0) == before and truncated_files(rejoining, TOPIC, 0) == []


def test_a_new_slave_pointed_at_a_slave_says_it_once_and_asks_zookeeper_instead_of_fetching(broker_factory, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    """A new slave of group 0 (no log yet) follows the address ZooKeeper names: it adopts the
    topics the broker there lists, then asks each partition's epoch history before fetching.
    The broker there answers as group 1's slave0 in epoch 1: the follower says so once (not
    per partition or retry) and asks the coordinator to read ZooKeeper again; it never fetches
    from it. Before, it copied that slave's history and fetched, refused ``not the master``
    every ``slaveMaxDelayInMills``, silently."""
    name_another_groups_slave_as_master(broker_factory, zk_client, zk_root)
    newcomer = broker_factory(0, {}, slave_props={"slaveId": 0}, start=False)
    newcomer.start(wait_zk=False)
    asked_zookeeper = "not as the acting master in epoch 2 (ZooKeeper's); its answer is not used; asking ZooKeeper who leads"
    wait_until(lambda: asked_zookeeper in newcomer.log_text(), 30, message="the follower to refuse the epochs answer")
    wait_until(lambda: newcomer.log_text().count(RETRIED) >= 5, 30, message="five reads of ZooKeeper")

    text = newcomer.log_text()
    assert text.count(asked_zookeeper) == 1, text
    assert "answers as slave0, serving epoch 1" in text
    assert retry_gaps(text)[3] >= 0.8, retry_gaps(text)  # the fourth wait is 0.8 s: no tight loop
