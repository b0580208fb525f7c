"""A consumer group whose position an async failover left inside a record (docs/client.md,
"Realigning a position"; docs/guarantees.md A3), with real broker processes.

Group 0: A (master) and B (``--slave``), ``replicationMode=async``. A acks records B never
gets, then dies; B takes over and writes records of other sizes over that range. The group
had read past the taken-back records (its stored position is one of A's record starts, which
falls inside a record of B's log): its consumer must resume at the start of B's epoch (the
divergence point), deliver every record B wrote, say so once at WARNING and commit the new
position, instead of retrying a fetch it cannot decode forever.
"""

from __future__ import annotations

import logging

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig
from metaq.client.connection import Credentials
from metaq.record import HEADER_SIZE, encode_record
from metaq.zk.paths import ZkPaths, format_offset, parse_offset

from .failover_support import (
    GROUP, TOPIC, Ack, Group, async_system, first_ack_after, make_pair, put_one, request, wait_leads, wait_until,
)
from .replication_support import wait_caught_up
from .trust_support import PASSWORDS, SecuredGroup, request_as, run

PARTS = [(TOPIC, 0)]
CONSUMER_GROUP = "realigned"
SECURED_TOPIC = "t"  # the one the security file's "reader" may consume


def _put_many(broker, tag: str, count: int, size: int) -> list[Ack]:
    acks = []
    for i in range(count):
        payload = f"{tag}-{i:06d}".encode().ljust(size, b".")
        reply = put_one(broker, payload)
        assert reply.code == 200, reply.header
        acks.append(Ack(int(reply["partition"]), int(reply["offset"]), payload))
    return acks


def test_a_group_position_inside_a_record_after_an_async_failover_resumes_at_the_new_epochs_start(
        broker_factory, zk, zk_client, zk_root, tmp_path, caplog):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group)
    epoch_before = group.epoch()
    _put_many(a, "rep", 30, 48)
    wait_caught_up(a, b, PARTS)
    b.pause()
    try:
        extra = _put_many(a, "extra", 25, 48)  # acked by A alone: the lag a failover takes back
        a.kill()
    finally:
        b.resume()

    epoch = wait_leads(b, group, epoch_before, timeout=25)
    takeover_end = request(b, {"op": "epochs", "topic": TOPIC, "partition": 0})["entries"][-1][1]
    first, _ = first_ack_after(b, b"new-first".ljust(100, b"."))
    assert first["offset"] == takeover_end
    written = [b"new-first".ljust(100, b".")] + [x.payload for x in _put_many(b, "new", 20, 100)]
    b_starts = {takeover_end + k * (HEADER_SIZE + len(written[0])) for k in range(len(written))}
    b_end = takeover_end + len(written) * (HEADER_SIZE + len(written[0]))
    # The group read (and committed) past records A acked and B never had: its position is a
    # record start of A's log that is inside a record of B's.
    position = next(x.offset for x in extra if takeover_end < x.offset < b_end and x.offset not in b_starts)
    _consume_and_check(zk, zk_client, zk_root, tmp_path, caplog, MetaClientConfig(
        zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, request_timeout_s=5),
        position, written, sorted(b_starts), takeover_end, epoch)


def test_with_security_on_a_reader_realigns_at_the_epoch_a_master_restart_began(broker_factory, zk, zk_client, zk_root,
                                                                                 tmp_path, caplog):
    """A secured async master (no slave) restarted: its log has epochs 1 and 2. A reader with
    only ``consume`` on the topic realigns a position inside a record of epoch 2 to its start;
    an unauthenticated ``offset`` with ``realign`` is refused as any consume request."""
    security = SecuredGroup(tmp_path / "security")
    master = broker_factory(GROUP, {SECURED_TOPIC: 1}, async_system(**security.system))

    def put(payload: bytes):
        reply = run(request_as(master, "app", {"op": "put", "topic": SECURED_TOPIC, "partition": 0}, encode_record(payload)))
        return reply if reply.code == 200 else None

    for i in range(10):
        assert put(f"old-{i}".encode().ljust(48, b"."))
    master.restart(kill=True)

    def epochs():
        reply = run(request_as(master, "ops", {"op": "epochs", "topic": SECURED_TOPIC, "partition": 0}))
        return reply["entries"] if reply.code == 200 and len(reply["entries"]) >= 2 else None

    epoch, restart_end = wait_until(epochs, 30, message="the restarted master's new epoch")[-1]
    written = [f"new-{i}".encode().ljust(100, b".") for i in range(10)]
    starts = [wait_until(lambda p=p: put(p), 20, message="a put acked after the restart")["offset"] for p in written]
    assert starts[0] == restart_end
    position = starts[3] + 7  # inside a record of epoch 2
    refused = run(request_as(master, None, {"op": "offset", "topic": SECURED_TOPIC, "partition": 0, "offset": position,
                                             "realign": True}))
    assert refused.code == 403, refused.header

    credentials = Credentials("reader", PASSWORDS["reader"])
    _consume_and_check(zk, zk_client, zk_root, tmp_path, caplog, MetaClientConfig(
        zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, request_timeout_s=5,
        credentials=credentials), position, written, starts, restart_end, epoch, topic=SECURED_TOPIC)


def _consume_and_check(zk, zk_client, zk_root, tmp_path, caplog, config: MetaClientConfig, position: int,
                       written: list[bytes], starts: list[int], epoch_start: int, epoch: int, topic: str = TOPIC) -> None:
    """The group's stored position is ``position``: its consumer resumes at ``epoch_start``,
    delivers ``written`` (at ``starts``) once and in order, warns once, and commits past them."""
    offset_path = ZkPaths(zk_root).offset(CONSUMER_GROUP, topic, "0-0")
    zk_client.create(offset_path, format_offset(-1, position).encode(), makepath=True)
    caplog.set_level(logging.WARNING, logger="metaq.client.consumer")
    seen: list[Message] = []  # appended on the consumer's one loop thread
    with MessageSessionFactory(config) as factory:
        consumer = factory.create_consumer(ConsumerConfig(group=CONSUMER_GROUP, recover_dir=str(tmp_path / "rec")))
        consumer.subscribe(topic, 4096, seen.append)
        consumer.complete_subscribe()
        wait_until(lambda: len(seen) >= len(written), 30, message="the consumer to read the new master's records")
        consumer.shutdown()

    # Every record written since the divergence, once, in order; none of what came before it.
    assert [m.data for m in seen] == written
    assert [m.offset for m in seen] == starts
    realigned = [r.getMessage() for r in caplog.records if "resuming at" in r.getMessage()]
    assert len(realigned) == 1 and realigned[0].startswith(f"{topic}-0-0: no message starts at {position} ("), realigned
    assert realigned[0].endswith(
        f"): the log changed under this position, e.g. an async failover took back records; "
        f"resuming at {epoch_start}, the start of epoch {epoch}"
    ), realigned
    # The group's next commit stored the new position (here at shutdown: past all of the records).
    last = seen[-1]
    assert parse_offset(zk_client.get(offset_path)[0])[1] == last.offset + HEADER_SIZE + len(last.data)
