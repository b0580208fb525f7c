"""The broker's log against real processes: restarts, kill -9 under group commit, torn tails.

Every broker here is a real `metaq broker` OS process registered in a real ZooKeeper;
the tests talk to it over the wire protocol with ``BrokerConnection``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from metaq import record
from metaq.client.connection import BrokerConnection, ConnectionClosed
from metaq.tools.launcher import BrokerProcess
from metaq.store.segment import segment_file_name

TOPIC = "t"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def connect(broker: BrokerProcess) -> BrokerConnection:
    return await BrokerConnection.open(broker.host, broker.port)


async def put(broker: BrokerProcess, messages: list[bytes], partition: int = 0) -> dict[str, Any]:
    """One batch put; retried while the broker answers 503 (registered but not yet taking writes)."""
    body = record.encode_batch([(m, None) for m in messages])
    async with await connect(broker) as conn:
        for _ in range(100):
            reply = await conn.request({"op": "put", "topic": TOPIC, "partition": partition}, body)
            if reply.code != 503:
                break
            await asyncio.sleep(0.05)
    assert reply.code == 200, reply.header
    return reply.header


async def read_all(broker: BrokerProcess, partition: int = 0, offset: int = 0) -> list[record.Record]:
    """Every record visible to a consumer from ``offset`` on."""
    out: list[record.Record] = []
    async with await connect(broker) as conn:
        while True:
            reply = await conn.request(
                {"op": "get", "topic": TOPIC, "partition": partition, "offset": offset, "max_size": 1 << 20}
            )
            if reply.code == 404:
                return out
            assert reply.code == 200, reply.header
            records = list(record.iter_records(reply.body, offset))
            assert records, f"a fetch at {offset} returned no whole record"
            out.extend(records)
            offset = records[-1].offset + records[-1].size


async def log_end(broker: BrokerProcess, partition: int = 0) -> int:
    async with await connect(broker) as conn:
        reply = await conn.request({"op": "get", "topic": TOPIC, "partition": partition, "offset": 0, "max_size": 1})
    return int(reply["log_end"])


def partition_dir(broker: BrokerProcess, partition: int = 0) -> Path:
    return broker.dir / "data" / f"{TOPIC}-{partition}"


# --- clean restart ---------------------------------------------------------------------


def test_put_and_get_across_a_clean_restart(broker_factory) -> None:
    broker = broker_factory(0, {TOPIC: 2}, system={"unflushThreshold": 0})
    first = run(put(broker, [f"before-{i}".encode() for i in range(50)], partition=1))
    before = run(read_all(broker, 1))
    assert [r.data for r in before] == [f"before-{i}".encode() for i in range(50)]

    assert broker.stop() == 0, "a clean stop exits 0"
    broker.start()

    after_restart = run(read_all(broker, 1))
    assert after_restart == before, "every record is back, at the same offsets with the same ids"
    second = run(put(broker, [b"after"], partition=1))
    assert second["offset"] == first["end_offset"], "appends continue at the old log end"
    assert second["msg_id"] > before[-1].msg_id, "msg ids keep increasing across the restart"
    assert run(read_all(broker, 1))[-1].data == b"after"
    assert run(read_all(broker, 0)) == [], "the other partition stays empty"


# --- kill -9 under group commit --------------------------------------------------------


async def produce_until_killed(broker: BrokerProcess, kill_after_acks: int) -> list[tuple[int, int, bytes]]:
    """Pipelined puts (batches of 1..5 messages, up to 64 in flight) until the broker is
    SIGKILLed after ``kill_after_acks`` acks; returns every acked (offset, msg_id, data)."""
    conn = await connect(broker)
    acked: list[tuple[int, int, bytes]] = []
    in_flight: set[asyncio.Future[Any]] = set()
    refused: list[dict[str, Any]] = []
    killed = False
    n = 0

    def on_reply(future: asyncio.Future[Any], messages: list[bytes]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        reply = future.result()
        if reply.code != 200:
            refused.append(reply.header)
            return
        offset, msg_id = reply["offset"], reply["msg_id"]
        for i, data in enumerate(messages):
            acked.append((offset, msg_id + i, data))
            offset += record.HEADER_SIZE + len(data)

    try:
        while not killed:
            while len(in_flight) < 64:
                messages = [f"m{n + i:07d}".encode() * (1 + (n + i) % 7) for i in range(1 + n % 5)]
                n += len(messages)
                try:
                    future = conn.send({"op": "put", "topic": TOPIC, "partition": 0}, record.encode_batch([(m, None) for m in messages]))
                except ConnectionClosed:
                    break
                future.add_done_callback(lambda f, m=messages: on_reply(f, m))
                in_flight.add(future)
                future.add_done_callback(in_flight.discard)
            if not in_flight:
                break
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            if len(acked) >= kill_after_acks:
                os.kill(broker.pid, signal.SIGKILL)  # while puts are still in flight
                killed = True
        if in_flight:
            await asyncio.wait(in_flight, timeout=10)
    finally:
        conn.close()
    assert killed, "the broker must be killed mid-stream"
    assert not refused, f"puts refused before the kill: {refused[:3]}"
    return sorted(acked)


def test_kill_9_during_pipelined_group_commit_puts_loses_no_acked_message(broker_factory) -> None:
    broker = broker_factory(0, {TOPIC: 1}, system={"unflushThreshold": 0})
    first = run(put(broker, [b"m-first"]))  # also waits until the broker takes writes
    acked = [(first["offset"], first["msg_id"], b"m-first")]
    acked += run(produce_until_killed(broker, kill_after_acks=3000))
    assert broker.kill() == -signal.SIGKILL
    assert len(acked) >= 3000

    broker.start()
    stored = run(read_all(broker))
    by_offset = {r.offset: r for r in stored}
    for offset, msg_id, data in acked:
        found = by_offset.get(offset)
        assert found is not None, f"acked message at offset {offset} is gone"
        assert (found.msg_id, found.data) == (msg_id, data), f"offset {offset} holds another message"
    # In order: the acked messages are a prefix of the log, back to back, no gaps between them.
    assert [r.offset for r in stored[: len(acked)]] == [a[0] for a in acked]
    ids = [r.msg_id for r in stored]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Unacked puts may or may not have survived, but only as whole, valid records.
    end = run(log_end(broker))
    assert end == (stored[-1].offset + stored[-1].size if stored else 0)
    reply = run(put(broker, [b"after-crash"]))
    assert reply["offset"] == end and reply["msg_id"] > ids[-1]


# --- torn tail --------------------------------------------------------------------------


def test_torn_tail_is_cut_moved_aside_and_puts_continue(broker_factory) -> None:
    broker = broker_factory(0, {TOPIC: 1}, system={"unflushThreshold": 0})
    run(put(broker, [f"whole-{i}".encode() for i in range(20)]))
    whole = run(read_all(broker))
    end = whole[-1].offset + whole[-1].size
    segment = partition_dir(broker) / segment_file_name(0)

    tails = {
        "half a record": record.encode_record(b"x" * 100, msg_id=12345)[:57],
        "garbage": bytes(range(256)) * 3,
        "a few header bytes": b"\x00\x00\x00",
    }
    for round_, (what, tail) in enumerate(tails.items(), start=1):
        assert broker.stop() == 0
        assert segment.stat().st_size == end
        with open(segment, "ab") as f:
            f.write(tail)
        broker.start()

        assert segment.stat().st_size == end, f"{what}: the tail was not cut"
        corrupt = sorted(partition_dir(broker).glob(f"{segment.name}.corrupt-*"))
        assert len(corrupt) == round_, f"{what}: expected one more .corrupt-* file, got {corrupt}"
        assert any(p.read_bytes() == tail for p in corrupt), f"{what}: the cut bytes were not moved aside whole"
        assert run(read_all(broker)) == whole, f"{what}: a whole record was lost"
        assert run(log_end(broker)) == end

        reply = run(put(broker, [f"next-{round_}".encode()]))
        assert reply["offset"] == end, f"{what}: new puts must continue at the end of the whole records"
        assert reply["msg_id"] > whole[-1].msg_id
        whole = run(read_all(broker))
        end = reply["end_offset"]
    assert [r.data for r in whole[-3:]] == [b"next-1", b"next-2", b"next-3"]


# --- segment files lost outside the broker ------------------------------------------------


async def put_reply(broker: BrokerProcess, messages: list[bytes], partition: int = 0) -> Any:
    """One batch put; the reply whatever its code."""
    body = record.encode_batch([(m, None) for m in messages])
    async with await connect(broker) as conn:
        return await conn.request({"op": "put", "topic": TOPIC, "partition": partition}, body)


async def get_reply(broker: BrokerProcess, partition: int = 0, offset: int = 0) -> Any:
    async with await connect(broker) as conn:
        return await conn.request({"op": "get", "topic": TOPIC, "partition": partition, "offset": offset, "max_size": 1 << 20})


def test_a_deleted_active_segment_refuses_puts_instead_of_acking_them(broker_factory) -> None:
    # Interval flushing: a put is acked right after its write, so only the check after
    # each write keeps an ack from covering bytes that live in an unlinked inode.
    broker = broker_factory(0, {TOPIC: 2})
    run(put(broker, [f"kept-{i}".encode() for i in range(20)]))
    active = partition_dir(broker) / segment_file_name(0)
    active.unlink()

    for attempt in range(2):
        reply = run(put_reply(broker, [f"lost-{attempt}".encode()]))
        assert reply.code == 500, f"a put into a deleted segment was answered {reply.code}: {reply.header}"
        assert str(active) in reply.message and "deleted" in reply.message
    assert run(put(broker, [b"other partition"], partition=1))["offset"] == 0, "the other partition keeps serving"
    lines = [line for line in broker.log_text().splitlines() if str(active) in line and "refuses puts" in line]
    assert len(lines) == 1, f"expected one log line naming the file, got {lines}"


def test_restart_after_the_active_segment_was_deleted_refuses_the_partition(broker_factory) -> None:
    broker = broker_factory(0, {TOPIC: 2}, system={"unflushThreshold": 0})
    acked = run(put(broker, [f"acked-{i}".encode() for i in range(20)]))
    assert broker.stop() == 0
    (partition_dir(broker) / segment_file_name(0)).unlink()  # the partition's only segment
    broker.start()

    reply = run(put_reply(broker, [b"would reuse offset 0"]))
    assert reply.code == 500, f"offset 0 would be reused: {reply.header}"
    assert "went backwards" in reply.message
    assert run(get_reply(broker)).code == 500, "nothing is served from the refused partition"
    assert not list(partition_dir(broker).glob("*.meta")), "no new segment over the lost offsets"
    assert run(put(broker, [b"other partition"], partition=1))["offset"] == 0, "the other partition keeps serving"
    (line,) = [line for line in broker.log_text().splitlines() if "is not served" in line]
    assert f"{TOPIC}-0" in line and f"offsets up to {acked['end_offset']} were flushed" in line
    assert "no segment files" in line and "restore" in line and "restart" in line
