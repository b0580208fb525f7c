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
import threading

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig
from metaq.zk.paths import ZkPaths, format_offset, parse_offset

from .failover_support import TOPIC, Ack, Group, async_system, first_ack_after, make_pair, put_one, request, wait_leads, wait_until
from .replication_support import wait_caught_up

PARTS = [(TOPIC, 0)]
CONSUMER_GROUP = "realigned"


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
    b_starts = {takeover_end + k * (len(written[0]) + 20) for k in range(len(written))}
    b_end = takeover_end + len(written) * (len(written[0]) + 20)
    # The group read (and committed) past records A acked and B never had: its position is a
    # record start of A's log that is inside a record of B's.
    position = next(x.offset for x in extra if takeover_end < x.offset < b_end and x.offset not in b_starts)
    offset_path = ZkPaths(zk_root).offset(CONSUMER_GROUP, TOPIC, "0-0")
    zk_client.create(offset_path, format_offset(-1, position).encode(), makepath=True)

    caplog.set_level(logging.WARNING, logger="metaq.client.consumer")
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000, request_timeout_s=5)
    seen: list[Message] = []
    lock = threading.Lock()

    def on_message(message: Message) -> None:
        with lock:
            seen.append(message)

    with MessageSessionFactory(config) as factory:
        consumer = factory.create_consumer(ConsumerConfig(group=CONSUMER_GROUP, recover_dir=str(tmp_path / "rec")))
        consumer.subscribe(TOPIC, 4096, on_message)
        consumer.complete_subscribe()
        wait_until(lambda: len(seen) >= len(written), 30, message="the consumer to read B's records")
        consumer.shutdown()

    # Every record B wrote since the divergence, once, in order; none of what came before it.
    assert [m.data for m in seen] == written
    assert [m.offset for m in seen] == sorted(b_starts)
    realigned = [r.getMessage() for r in caplog.records if "resuming at" in r.getMessage()]
    assert realigned == [
        f"{TOPIC}-0-0: no message starts at {position}" + realigned[0].split(f"no message starts at {position}", 1)[1]
    ] and realigned[0].endswith(
        f": the log changed under this position, e.g. an async failover took back records; "
        f"resuming at {takeover_end}, the start of epoch {epoch}"
    ), realigned
    # The group's next commit stored the new position (here at shutdown: past all of B's records).
    assert parse_offset(zk_client.get(offset_path)[0])[1] == b_end
