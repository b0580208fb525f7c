"""Helpers for the replication integration tests (tests/integration/test_replication_*.py)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

from metaq.client.connection import BrokerConnection
from metaq.tools.verify import VerifyReport, log_bounds, verify_group
from metaq.tools.launcher import BrokerProcess, wait_until
from metaq.record import encode_batch

#: These tests are about replication, not failover: a stopped master must come back as master.
NO_FAILOVER = {"autoFailover": False}

_KV = re.compile(r"(\w+)=('[^']*'|\"[^\"]*\"|\S+)")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _put(address: tuple[str, int], topic: str, partition: int, count: int, size: int, batch: int) -> list[int]:
    conn = await BrokerConnection.open(*address)
    offsets = []
    try:
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            body = encode_batch([(f"{topic}-{partition}-{sent + i:08d}".encode().ljust(size, b"."), None) for i in range(n)])
            for _ in range(200):  # 503: a (re)starting master is not ready for writes yet
                reply = await conn.request({"op": "put", "topic": topic, "partition": partition}, body)
                if reply.code != 503:
                    break
                await asyncio.sleep(0.05)
            assert reply.ok, reply.header
            offsets.append(reply["offset"])
            sent += n
    finally:
        conn.close()
    return offsets


def put(broker: BrokerProcess, topic: str, partition: int, count: int, size: int = 100, batch: int = 50) -> list[int]:
    return run(_put(broker.address, topic, partition, count, size, batch))


async def _request(address: tuple[str, int], header: dict[str, Any], body: bytes = b"") -> Any:
    conn = await BrokerConnection.open(*address)
    try:
        return await conn.request(header, body, timeout=30)
    finally:
        conn.close()


def request(broker: BrokerProcess, header: dict[str, Any], body: bytes = b"") -> Any:
    return run(_request(broker.address, header, body))


def stats_lines(broker: BrokerProcess, item: str = "") -> list[str]:
    reply = request(broker, {"op": "stats", "item": item})
    return reply.body.decode().splitlines()


def stat(broker: BrokerProcess, name: str) -> str | None:
    for line in stats_lines(broker):
        key, _, value = line.partition(" ")
        if key == name:
            return value
    return None


def replica_rows(slave: BrokerProcess) -> dict[tuple[str, int], dict[str, str]]:
    """The slave's ``replica {topic}-{id}-{p} k=v ...`` stats lines, by (topic, partition)."""
    rows = {}
    for line in stats_lines(slave):
        if line.startswith("replica "):
            name = line.split(" ")[1]
            topic, _bid, partition = name.rsplit("-", 2)
            rows[(topic, int(partition))] = {k: v.strip("'\"") for k, v in _KV.findall(line)}
    return rows


async def _blocking_puts(address: tuple[str, int], topic: str, partition: int, count: int) -> list[float]:
    conn = await BrokerConnection.open(*address)
    seconds = []
    try:
        for seq in range(count):
            body = encode_batch([(f"{topic}-{partition}-{seq:08d}".encode().ljust(100, b"."), None)])
            started = time.perf_counter()
            reply = await conn.request({"op": "put", "topic": topic, "partition": partition}, body, timeout=30)
            seconds.append(time.perf_counter() - started)
            assert reply.ok, reply.header
    finally:
        conn.close()
    return seconds


def blocking_puts(broker: BrokerProcess, topic: str, partition: int, count: int) -> list[float]:
    """``count`` puts of one 100 B message, each sent once the one before is acked: their seconds."""
    return run(_blocking_puts(broker.address, topic, partition, count))


def bounds(broker: BrokerProcess, topic: str, partition: int) -> tuple[int, int] | None:
    async def go() -> Any:
        conn = await BrokerConnection.open(*broker.address)
        try:
            return await log_bounds(conn, topic, partition, broker.broker_id)
        finally:
            conn.close()

    return run(go())


def wait_caught_up(master: BrokerProcess, slave: BrokerProcess, partitions: list[tuple[str, int]], timeout: float = 20) -> None:
    def caught_up() -> bool:
        for topic, partition in partitions:
            m, s = bounds(master, topic, partition), bounds(slave, topic, partition)
            if m is None or s is None or m[1] != s[1]:
                return False
        return True

    wait_until(caught_up, timeout, interval=0.1, message=f"{slave.name} to catch up with {master.name}")


def verify(broker: BrokerProcess) -> VerifyReport:
    return run(verify_group(broker.zk_connect, broker.broker_id, broker.zk_root))


def assert_identical(broker: BrokerProcess, slaves: int = 1) -> VerifyReport:
    report = verify(broker)
    assert len(report.slaves) == slaves, report
    assert report.ok, "\n".join(f"{c.slave} {c.topic}-{c.partition}: {c.describe()}" for c in report.checks)
    return report


class BackgroundProducer:
    """Puts batches to a master from a thread until stopped; tolerates a vanished peer."""

    def __init__(self, master: BrokerProcess, topic: str, partitions: int, batch: int = 20, size: int = 100) -> None:
        self.master, self.topic, self.partitions, self.batch, self.size = master, topic, partitions, batch, size
        self.acked = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> "BackgroundProducer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        conn = None
        n = 0
        while not self._stop.is_set():
            try:
                if conn is None or not conn.is_open:
                    conn = await BrokerConnection.open(*self.master.address, timeout=1)
                body = encode_batch([(f"bg-{n + i:09d}".encode().ljust(self.size, b"-"), None) for i in range(self.batch)])
                reply = await conn.request({"op": "put", "topic": self.topic, "partition": n % self.partitions}, body, timeout=5)
                if reply.ok:
                    self.acked += self.batch
                    n += self.batch
                else:
                    self.errors += 1
            except Exception:
                self.errors += 1
                conn = None
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.005)
        if conn is not None:
            conn.close()


def wait_for(predicate: Any, timeout: float, message: str) -> Any:
    return wait_until(predicate, timeout, interval=0.1, message=message)


def sleep(seconds: float) -> None:
    time.sleep(seconds)
