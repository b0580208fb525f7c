"""``offset_for_time`` against real broker processes (docs/storage.md, "Time index").

Every answer is checked against a walk of the partition's bytes on disk (the first record
whose msg id's time is >= T, below the readable end), on a master and on its slave, through
a kill -9 failover (the new master answers the same offsets for the same times), after the
returning old master's truncation, after a restart with every index file deleted, after a
corrupt range on the master was repaired from its slave, with security on (a fetch's ACL),
and for a topic deleted and re-created.

Group 0: A (master) and B (``--slave``, slaveId 1), 4 KiB segments so that the log has many
sealed segments (each with its own index file).
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import pytest

from chaos.corruption import flip_bit
from metaq.record import iter_records
from metaq.store.msgid import msg_id_timestamp_ms
from metaq.tools.launcher import BrokerProcess, wait_until

from .failover_support import (
    TOPIC,
    Group,
    PutStream,
    async_system,
    disk_log,
    make_pair,
    partition_dir,
    sync_system,
    truncated_files,
    wait_follows,
    wait_leads,
)
from .replication_support import bounds, put, request, stat, wait_caught_up
from .test_topics_cli import metaq
from .trust_support import SecuredGroup, request_as, run

PARTS = [(TOPIC, 0)]
SEGMENTS = {"maxSegmentSize": 4096}
#: An answer is readable on every replica within this once the bytes are there.
ANSWER_WITHIN_S = 10.0


def ask(broker: BrokerProcess, time_ms: int, topic: str = TOPIC, partition: int = 0) -> tuple[int, bool]:
    reply = request(broker, {"op": "offset_for_time", "topic": topic, "partition": partition, "time_ms": time_ms})
    assert reply.code == 200, reply.header
    return int(reply["offset"]), bool(reply["latest"])


def record_times(broker: BrokerProcess, topic: str = TOPIC, partition: int = 0) -> list[tuple[int, int]]:
    """``(offset, time ms)`` of every record of the partition's files on disk."""
    start, data = disk_log(broker, topic, partition)
    return [(r.offset, msg_id_timestamp_ms(r.msg_id)) for r in iter_records(data, start, verify=False)]


def expected(records: list[tuple[int, int]], time_ms: int, end: int) -> tuple[int, bool]:
    """What a walk of the log answers: the first record at or after the time below ``end``."""
    for offset, at in records:
        if offset >= end:
            break
        if at >= time_ms:
            return offset, False
    return end, True


def probe_times(records: list[tuple[int, int]], count: int = 40, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    stamps = [at for _, at in records]
    return sorted({0, stamps[0], stamps[-1], stamps[-1] + 1, stamps[-1] + 10**6,
                   *(rng.choice(stamps) + rng.choice((-1, 0, 1)) for _ in range(count))})


def answers(broker: BrokerProcess, times: list[int]) -> dict[int, tuple[int, bool]]:
    return {t: ask(broker, t) for t in times}


def walked(broker: BrokerProcess, times: list[int]) -> dict[int, tuple[int, bool]]:
    records = record_times(broker)
    end = bounds(broker, TOPIC, 0)[1]
    return {t: expected(records, t, end) for t in times}


def put_waves(broker: BrokerProcess, waves: int, count: int = 30) -> None:
    """Messages in waves a few ms apart, so their times differ."""
    for _ in range(waves):
        put(broker, TOPIC, 0, count, size=60, batch=10)
        time.sleep(0.02)


def same_everywhere(brokers: list[BrokerProcess], times: list[int]) -> dict[int, tuple[int, bool]]:
    """Wait until every broker answers what a walk of the first one's log answers; return it."""
    truth: dict[int, tuple[int, bool]] = {}

    def agree() -> bool:
        nonlocal truth
        truth = walked(brokers[0], times)
        return all(answers(broker, times) == truth for broker in brokers)

    wait_until(agree, ANSWER_WITHIN_S, interval=0.2, message="every replica to answer like a walk of the log")
    return truth


def test_master_and_slave_answer_alike_through_failover_truncation_and_lost_index_files(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(**SEGMENTS), group)
    put_waves(a, 8)
    wait_caught_up(a, b, PARTS)
    assert len(list(partition_dir(a).glob("*.timeindex"))) >= 3  # the sealed segments' (an active one is written later)
    times = probe_times(record_times(a))
    before = same_everywhere([a, b], times)
    assert any(not latest for _, latest in before.values()) and any(latest for _, latest in before.values())

    # B stops; A acks more that B never gets, then A is killed: B takes over at its log end.
    epoch = group.epoch()
    b.pause()
    try:
        put_waves(a, 2)
        a.kill()
    finally:
        b.resume()
    wait_leads(b, group, epoch, timeout=25)
    # The new master answers the same offsets for the same times (every time a record of the
    # replicated log answered; later times may now find A's last records, which B had too).
    found = {t: answer for t, answer in before.items() if not answer[1]}
    assert {t: ask(b, t) for t in found} == found
    put_waves(b, 3)
    new_times = probe_times(record_times(b), seed=1)

    # A returns as a slave: its divergent tail is cut (and its index with it), then it copies B's.
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    wait_caught_up(b, a, PARTS)
    assert truncated_files(a), "A had a divergent tail to cut"
    same_everywhere([b, a], new_times)

    # A restarts with every index file deleted: rebuilt on first use, logged and counted.
    a.stop()
    for path in partition_dir(a).glob("*.timeindex"):
        path.unlink()
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    wait_caught_up(b, a, PARTS)
    same_everywhere([b, a], new_times)
    assert int(stat(a, "time_index_rebuilds") or 0) >= 1
    assert "rebuilt from the segment" in a.log_text()


def test_a_repaired_corrupt_range_answers_as_before(broker_factory, zk_client, zk_root):
    """A flipped bit in a sealed segment of the master: the scrub finds it, the slave's bytes
    are put back, and the repaired segment's index is rebuilt from them."""
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(scrubIntervalMs=200, **SEGMENTS), group)
    stream = PutStream(a.address, tag="ti").start()
    stream.wait_acked(300)
    stream.stop()
    wait_caught_up(a, b, PARTS)
    times = probe_times(record_times(a), seed=2)
    before = same_everywhere([a, b], times)
    assert flip_bit(a.dir / "data", random.Random(3), TOPIC, sealed_only=True) is not None
    wait_until(lambda: int(stat(a, "scrub_corrupt_ranges") or 0) >= 1 and "restored from a replica" in a.log_text(),
               15, interval=0.1, message="A to find the flipped bit and put B's bytes back")
    assert answers(a, times) == before == answers(b, times)


def test_offset_for_time_needs_the_read_acl_of_a_fetch(broker_factory, tmp_path):
    secured = SecuredGroup(tmp_path / "security")
    master = broker_factory(0, {"t": 1, "other": 1}, {"unflushThreshold": 0, **secured.system})
    header = {"op": "offset_for_time", "topic": "t", "partition": 0, "time_ms": 0}
    allowed = run(request_as(master, "reader", header))
    assert allowed.code == 200 and allowed["latest"] is True, allowed.header
    refused = run(request_as(master, "reader", {**header, "topic": "other"}))
    assert refused.code == 403 and "no ACL rule" in refused.message, refused.header
    assert run(request_as(master, None, header)).code == 403


def test_a_deleted_and_recreated_topic_answers_from_its_new_log(broker_factory, zk, zk_root, zk_client, capsys):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(**SEGMENTS), group)
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "x", "--partitions", "1")
    assert code == 0, out
    put(a, "x", 0, 200, size=60, batch=10)
    wait_caught_up(a, b, [("x", 0)])
    late = max(at for _, at in record_times(a, "x"))
    assert ask(a, 0, "x") == (0, False)
    code, out = metaq(capsys, zk, zk_root, "topics", "delete", "--broker-id", "0", "--topic", "x")
    assert code == 0, out
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "x", "--partitions", "1")
    assert code == 0, out
    for broker in (a, b):
        wait_until(lambda broker=broker: ask(broker, 0, "x") == (0, True), 10, message="an empty new incarnation")
    put(a, "x", 0, 5, size=60, batch=5)
    wait_caught_up(a, b, [("x", 0)])
    for broker in (a, b):
        # The old incarnation's times are all earlier: the answer is the new log's first message.
        wait_until(lambda broker=broker: ask(broker, late - 1, "x") == (0, False), 10, message="the new log's answer")
        assert ask(broker, late + 10**6, "x") == (bounds(broker, "x", 0)[1], True)
    # metaq topics get --at: the first message at or after the time, from the same index.
    iso = datetime.fromtimestamp((late - 1) / 1000, timezone.utc).isoformat(timespec="milliseconds")
    code, out = metaq(capsys, zk, zk_root, "topics", "get", "--topic", "x", "--partition", "0-0", "--at", iso)
    assert code == 0 and out.startswith("x-0-0 offset 0 msg id "), out
    future = datetime.fromtimestamp((late + 10**6) / 1000, timezone.utc).isoformat()
    code, out = metaq(capsys, zk, zk_root, "topics", "get", "--topic", "x", "--partition", "0-0", "--at", future)
    assert code == 1 and "no message at or after" in out and "Traceback" not in out, out
    code, out = metaq(capsys, zk, zk_root, "topics", "get", "--topic", "x", "--partition", "0-0", "--at", "yesterday")
    assert code == 1 and "--at: expected ISO 8601" in out, out


def test_clients_offsets_for_times_and_seek_to_time(broker_factory, zk, zk_root, tmp_path):
    from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig, OffsetForTimeError, Partition

    from .test_client_basic import Collector

    broker = broker_factory(0, {"c": 1}, system={"unflushThreshold": 0, **SEGMENTS})
    client_config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)
    with MessageSessionFactory(client_config) as factory:
        producer = factory.create_producer()
        first = [producer.send_message(Message("c", f"early-{i}".encode())) for i in range(20)]
        time.sleep(0.05)
        late = [producer.send_message(Message("c", f"late-{i}".encode())) for i in range(20)]
        middle = msg_id_timestamp_ms(late[0].msg_id)
        assert msg_id_timestamp_ms(first[-1].msg_id) < middle
        want = {Partition(0, 0): middle}
        assert producer.offsets_for_times("c", want) == {Partition(0, 0): late[0].offset}
        assert producer.offsets_for_times("c", {"0-0": middle + 10**6}) == {Partition(0, 0): None}
        with pytest.raises(OffsetForTimeError, match="no broker 7 is registered"):
            producer.offsets_for_times("c", {"7-0": 0})

        received = Collector()
        config = ConsumerConfig(group="seek", commit_interval_s=0.5, recover_dir=str(tmp_path / "recover"), fetch_wait_ms=200)
        consumer = factory.create_consumer(config).subscribe("c", listener=received)
        consumer.complete_subscribe()
        received.wait_for(40)
        assert consumer.offsets_for_times("c", want) == {Partition(0, 0): late[0].offset}
        wait_until(lambda: consumer.owned_partitions("c") == [Partition(0, 0)], 10, message="the consumer to own 0-0")
        moved = consumer.seek_to_time(middle)
        assert moved == {("c", Partition(0, 0)): late[0].offset}
        received.wait_for(60)  # the 20 late messages again
        assert received.data()[40:] == [f"late-{i}".encode() for i in range(20)]
        consumer.shutdown()
    assert broker.log_text().count("Traceback") == 0
