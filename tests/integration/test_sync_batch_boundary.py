"""Readers' bound never falls inside a batch, with real brokers in sync mode.

A sync master and its slave; idempotent puts of ~600 KiB (a BATCH header and 600
records) between small plain puts. The slave receives each batch in one fetch reply
and appends it in 256 KiB pieces, reporting its log end after each piece, so the
master hears positions inside the batch before the slave has all of it. Consumers
long-polling on the master and on the slave record every bound they are given (the
reply's ``lso``, else its ``committed``): none may fall strictly inside a batch of the
final log, and in the end both serve every acked byte.
"""

from __future__ import annotations

import asyncio
from typing import Any

from metaq.client import Message
from metaq.client.codec import encode_messages
from metaq.client.connection import BrokerConnection
from metaq.ha.replica import REPORT_PIECE_BYTES
from metaq.protocol import commands as c
from metaq.protocol.messages import InitProducerRequest, PutRequest
from metaq.record import record_ends
from metaq.txn.control import Kind, control_at

from .test_sync_replication import PIECE_REPORTING_SLAVE, TOPIC, on_disk, start_pair

RECORDS_PER_BATCH = 600
PAYLOAD = 1000
BATCHES = 12


def batch_spans(log: bytes) -> list[tuple[int, int]]:
    """[start, end) of every batch (BATCH header and its records) in a partition log."""
    spans, start = [], 0
    for end in record_ends(log):
        control = control_at(log, start)
        if control is not None and control.kind is Kind.BATCH:
            spans.append((start, end + control.data_bytes))
        start = end
    return spans


async def produce(address: tuple[str, int]) -> int:
    """Idempotent batches between plain puts, one at a time; returns the last acked end."""
    conn = await BrokerConnection.open(*address)
    try:
        reply = await conn.request(InitProducerRequest().to_header(), timeout=10)
        assert reply.code == c.OK, reply.message
        producer_id, sequence, end = int(reply["producer_id"]), 0, 0
        for n in range(BATCHES):
            payloads = [f"b{n}-{i}".encode().ljust(PAYLOAD, b".") for i in range(RECORDS_PER_BATCH)]
            body, _ = encode_messages([Message(TOPIC, p) for p in payloads])
            assert len(body) > 2 * REPORT_PIECE_BYTES  # the slave reports positions inside it
            header = PutRequest(topic=TOPIC, partition=0, count=len(payloads), producer_id=producer_id,
                                producer_epoch=0, sequence=sequence).to_header()
            reply = await conn.request(header, body, timeout=30)
            assert reply.code == c.OK and not reply.get("duplicate"), reply.header
            sequence += len(payloads)
            plain, _ = encode_messages([Message(TOPIC, f"plain-{n}".encode())])
            reply = await conn.request(PutRequest(topic=TOPIC, partition=0).to_header(), plain, timeout=30)
            assert reply.code == c.OK, reply.header
            end = reply["end_offset"]
        return end
    finally:
        conn.close()


async def watch_bounds(address: tuple[str, int], bounds: list[int], until: asyncio.Event) -> None:
    """Long-poll as a consumer from offset 0 on; record every readable bound a reply gives."""
    conn = await BrokerConnection.open(*address)
    offset = 0
    try:
        while not until.is_set():
            reply = await conn.request({"op": "get", "topic": TOPIC, "partition": 0, "offset": offset,
                                        "max_size": 1 << 20, "max_wait_ms": 200}, timeout=10)
            bound = reply.get("lso", reply.get("committed"))
            if bound is not None:
                bounds.append(bound)
            if reply.code == c.OK:
                offset += len(reply.body)
            else:
                assert reply.code == c.NOT_FOUND, reply.header
    finally:
        conn.close()


def test_consumers_on_master_and_slave_never_get_a_bound_inside_a_batch(broker_factory, zk_client, zk_root) -> None:
    # A slave that reports positions inside a large reply (a group-commit one waits for its fsync).
    master, (slave,) = start_pair(broker_factory, zk_client, zk_root, partitions=1, slave_system=PIECE_REPORTING_SLAVE)

    async def scenario() -> tuple[int, dict[str, list[int]]]:
        bounds: dict[str, list[int]] = {"master": [], "slave": []}
        done = asyncio.Event()
        watchers = [asyncio.ensure_future(watch_bounds(broker.address, bounds[name], done))
                    for name, broker in (("master", master), ("slave", slave))]
        try:
            end = await produce(master.address)
            # Until both have served everything acked (the slave learns committed by its next fetch).
            for _ in range(200):
                if all(b and b[-1] >= end for b in bounds.values()):
                    break
                await asyncio.sleep(0.05)
        finally:
            done.set()
            await asyncio.gather(*watchers)
        return end, bounds

    end, bounds = asyncio.run(scenario())
    log = on_disk(master, 0)
    spans = batch_spans(log)
    assert len(spans) == BATCHES
    for name, seen in bounds.items():
        assert seen and seen[-1] >= end, (name, seen[-5:], end)
        inside = [(b, span) for b in seen for span in spans if span[0] < b < span[1]]
        assert not inside, f"{name}: readers' bound inside a batch: {inside[:3]}"
        assert seen == sorted(seen), f"{name}: the readable bound went back"
    print(f"\nbounds seen: master {len(set(bounds['master']))}, slave {len(set(bounds['slave']))}, "
          f"{len(spans)} batches of {RECORDS_PER_BATCH} records")
