"""Consumers move to a slave when the master goes and nobody takes over (issue: async
replication, client-side failover): MetaQ's rule, master if present, else a slave.

Async pair with autoFailover=false, so the slave stays a slave. A consumer group reading
with ``read_from=master`` gets half the topic from the master; the master is killed; the
consumer finishes the topic from the slave, at the same offsets (offsets are byte
positions, identical on every replica), without re-reading what it had.
"""

from __future__ import annotations

import threading
import time

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig

from .failover_support import TOPIC, Group, async_system, make_pair, put_one, wait_until


def test_consumer_finishes_the_topic_from_the_slave_after_the_master_dies(broker_factory, zk, zk_client, zk_root, tmp_path):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(autoFailover="false"), group)
    payloads = [f"m{i:04d}".encode() for i in range(200)]
    acked = {}
    for payload in payloads:
        reply = put_one(a, payload)
        assert reply.code == 200, reply.header
        acked[payload] = reply["offset"]
    # The slave has everything before the master goes (async: wait for it).
    wait_until(lambda: b_has(b, len(payloads)), 15, message="the slave to catch up")

    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, request_timeout_s=5)
    seen: list[Message] = []
    lock = threading.Lock()
    half = threading.Event()

    def on_message(message: Message) -> None:
        with lock:
            seen.append(message)
            if len(seen) >= len(payloads) // 2:
                half.set()
        if not half.is_set():
            time.sleep(0.005)  # slow enough that the master dies mid-topic
        elif a.alive:
            time.sleep(0.05)

    with MessageSessionFactory(config) as factory:
        consumer = factory.create_consumer(
            ConsumerConfig(group="to-the-slave", read_from="master", recover_dir=str(tmp_path / "rec"))
        )
        consumer.subscribe(TOPIC, 4096, on_message)
        consumer.complete_subscribe()
        assert half.wait(20), "the consumer did not get going"
        a.kill()
        wait_until(lambda: len({m.data for m in seen}) == len(payloads), 30, message="the consumer to finish from the slave")
        consumer.shutdown()

    by_payload: dict[bytes, list[int]] = {}
    for message in seen:
        by_payload.setdefault(message.data, []).append(message.offset)
    assert set(by_payload) == set(payloads)
    for payload, offsets in by_payload.items():
        assert set(offsets) == {acked[payload]}, (payload, offsets)
    # Nothing re-read beyond what an uncommitted position can explain (none here: the
    # consumer keeps its in-memory position when it switches replica).
    assert len(seen) == len(payloads), f"{len(seen) - len(payloads)} messages read twice"
    # The slave stayed a slave: no failover with autoFailover=false (once the dead
    # master's session has expired, nobody holds the lock).
    wait_until(lambda: group.master() is None, 10, message="the dead master's znode to expire")
    time.sleep(1.0)
    assert group.master() is None and group.slave_id_of(b) is not None


def b_has(b, count: int) -> bool:
    from .failover_support import fetch_all

    return len(fetch_all(b)) >= count
