"""Helpers for the Spark tests: produce with known offsets, wait for replicas, read stats."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass

from metaq.client.connection import Credentials
from metaq.tools.launcher import BrokerProcess
from metaq.record import encode_record
from metaq.protocol.replies import StatsReply
from metaq.spark.fetch import ReplicaSession
from metaq.client.routing import Replica


@dataclass(frozen=True)
class Produced:
    partition: str  # "{brokerId}-{n}"
    offset: int
    attribute: str | None
    digest: str  # sha256 of data
    end: int  # offset + record size: the next message's offset


def digest(data: bytes) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def produce(
    master: BrokerProcess, topic: str, partitions: int, count: int, size: int = 100, batch: int = 200, tag: str = "",
    credentials: Credentials = Credentials(),
) -> list[Produced]:
    """``count`` messages spread over ``partitions``, with attributes a0..a2; returns them with
    the offsets the master assigned (from the put replies)."""

    async def run() -> list[Produced]:
        conn = await credentials.open(master.host, master.port)
        produced: list[Produced] = []
        try:
            i = 0
            while i < count:
                n = min(batch, count - i)
                p = (i // batch) % partitions
                records, metas = [], []
                for k in range(i, i + n):
                    head = f"{tag}{k}:".encode()
                    data = head + bytes((k * 7 + j) % 251 for j in range(max(0, size - len(head))))
                    attribute = f"a{k % 3}" if k % 5 else None
                    records.append(encode_record(data, attribute))
                    metas.append((attribute, digest(data)))
                reply = await conn.request({"op": "put", "topic": topic, "partition": p, "count": n}, b"".join(records))
                assert reply.ok, reply.header
                offset = reply["offset"]
                for record, (attribute, dig) in zip(records, metas):
                    produced.append(Produced(f"{master.broker_id}-{p}", offset, attribute, dig, offset + len(record)))
                    offset += len(record)
                i += n
        finally:
            conn.close()
        return produced

    return asyncio.run(run())


def replica(broker: BrokerProcess) -> Replica:
    role = "master" if broker.slave_id is None else f"slave{broker.slave_id}"
    return Replica(broker.broker_id, role, broker.host, broker.port)


def committed(broker: BrokerProcess, topic: str, partition: int, credentials: Credentials = Credentials()) -> int:
    with ReplicaSession(replica(broker), credentials=credentials) as session:
        return session.offsets(topic, partition).committed


def wait_caught_up(
    brokers: list[BrokerProcess], topic: str, ends: dict[int, int], timeout: float = 30.0, credentials: Credentials = Credentials()
) -> None:
    """Until every broker's committed offset of each partition n reaches ends[n]."""
    deadline = time.monotonic() + timeout
    while True:
        lagging = [
            (b.name, n, at, end) for b in brokers for n, end in ends.items() if (at := committed(b, topic, n, credentials)) < end
        ]
        if not lagging:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas not caught up: {lagging}")
        time.sleep(0.1)


def partition_ends(produced: list[Produced]) -> dict[int, int]:
    """{partition number: end offset} of what was produced."""
    ends: dict[int, int] = {}
    for m in produced:
        n = int(m.partition.split("-")[1])
        ends[n] = max(ends.get(n, 0), m.end)
    return ends


def stats(broker: BrokerProcess) -> StatsReply:
    with ReplicaSession(replica(broker)) as session:
        return session.stats()


def get_counters(broker: BrokerProcess) -> tuple[int, int]:
    s = stats(broker)
    return int(s.get("get_requests")), int(s.get("get_bytes"))
