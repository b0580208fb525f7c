"""Helpers for the failover integration tests (tests/integration/test_failover_*.py).

Every test runs a broker group of real processes on the shared test ZooKeeper
(tick 200 ms) with a short ZK session (``SESSION_MS``), so that a killed or
stopped master is detected in about 1.5 s:

* ``A``: started without ``--slave`` (so it founds the group as master, and
  after a failover rejoins as a slave under the smallest free slave id, 0);
* ``B``: started with ``--slave`` and ``slaveId=1``.

Logs are read back two ways: over the wire (``get`` on the broker, which only
shows committed bytes) and straight from the segment files on disk (every byte
the process wrote, committed or not), so the tests can compare what was acked
with what each broker really holds.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kazoo.client import KazooClient

from metaq.client.connection import BrokerConnection
from metaq.protocol import commands as c
from metaq.tools.launcher import BrokerProcess, BrokerFactory, wait_until
from metaq.record import encode_batch, iter_records, record_ends
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.paths import ZkPaths

from .replication_support import assert_identical, bounds, request, run, stat

SESSION_MS = 1500
ZK_SETTINGS = {"zk.zkSessionTimeoutMs": SESSION_MS}
TOPIC = "fo"
GROUP = 0
SLAVE_B = 1

def sync_system(**overrides: Any) -> dict[str, Any]:
    return {
        "replicationMode": "sync",
        "onSyncSlaveLoss": "degrade",
        "unflushThreshold": 0,
        "syncSlaveTimeoutMs": 1000,
        **overrides,
    }


def async_system(**overrides: Any) -> dict[str, Any]:
    return {"replicationMode": "async", "unflushThreshold": 0, "autoFailover": True, **overrides}


# --- ZooKeeper view of a group --------------------------------------------------------


class Group:
    """What ZooKeeper says about broker group 0 (read with the test's own kazoo client)."""

    def __init__(self, client: KazooClient, root: str, broker_id: int = GROUP) -> None:
        self.client, self.paths, self.broker_id = client, ZkPaths(root), broker_id

    def _data(self, path: str) -> bytes | None:
        try:
            return self.client.get(path)[0]
        except Exception:
            return None

    def epoch(self) -> int:
        data = self._data(self.paths.epoch(self.broker_id))
        return int(json.loads(data)["epoch"]) if data else 0

    def master(self) -> str | None:
        data = self._data(self.paths.master(self.broker_id))
        return data.decode() if data else None

    def sync_set(self) -> set[int]:
        data = self._data(self.paths.sync_set(self.broker_id))
        return set(json.loads(data)["slaves"]) if data else set()

    def slaves(self) -> dict[int, str]:
        """slave id -> url of the registered ``slave{k}`` nodes."""
        found = {}
        try:
            children = self.client.get_children(self.paths.broker(self.broker_id))
        except Exception:
            return {}
        for child in children:
            if child.startswith("slave") and child[5:].isdigit():
                data = self._data(f"{self.paths.broker(self.broker_id)}/{child}")
                if data:
                    found[int(child[5:])] = data.decode()
        return found

    def slave_id_of(self, broker: BrokerProcess) -> int | None:
        for slave_id, url in self.slaves().items():
            if url == broker.url:
                return slave_id
        return None


def topics_reply(broker: BrokerProcess) -> dict[str, Any]:
    return request(broker, {"op": "topics"}).header


def wait_leads(broker: BrokerProcess, group: Group, above_epoch: int, timeout: float = 20) -> int:
    """Until ``broker`` is the registered master in an epoch > ``above_epoch``, and says so itself."""

    def leads() -> int | None:
        if group.master() != broker.url or group.epoch() <= above_epoch:
            return None
        try:
            reply = topics_reply(broker)
        except Exception:
            return None
        # Role "master" is claimed on winning; the take-over (fsync, epoch start, lease) ends
        # when ZooKeeper first confirms the lease.
        if reply.get("role") == "master" and reply.get("epoch") == group.epoch() and int(stat(broker, "ha_lease_ms") or 0) > 0:
            return int(reply["epoch"])
        return None

    return wait_until(leads, timeout, interval=0.05, message=f"{broker.name} to lead above epoch {above_epoch}")


def wait_follows(broker: BrokerProcess, master: BrokerProcess, group: Group, timeout: float = 25) -> int:
    """Until ``broker`` is registered as a slave (its url in a ``slave{k}`` node) following ``master``."""

    seen: list[Any] = [None]

    def follows() -> int | None:
        slave_id = group.slave_id_of(broker)
        master_url = group.master()
        try:
            state = stat(broker, "ha_state")
        except Exception as exc:
            state = repr(exc)
        seen[0] = (slave_id, master_url, state)
        if slave_id is None or master_url != master.url or state != "following":
            return None
        return (slave_id,)  # truthy also for slave id 0

    try:
        return wait_until(follows, timeout, interval=0.1, message=f"{broker.name} to follow {master.name}")[0]
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen (slave id, master, ha_state) = {seen[0]}; want {master.url}") from None


def wait_in_sync_set(group: Group, slave_id: int, timeout: float = 20) -> None:
    wait_until(lambda: slave_id in group.sync_set(), timeout, interval=0.05, message=f"slave {slave_id} in the sync set")


def make_pair(factory: BrokerFactory, system: dict[str, Any], group: Group, partitions: int = 1) -> tuple[BrokerProcess, BrokerProcess]:
    a = factory(GROUP, {TOPIC: partitions}, system, name="A", zookeeper=ZK_SETTINGS)
    b = factory(GROUP, {TOPIC: partitions}, system, {"slaveId": SLAVE_B}, name="B", zookeeper=ZK_SETTINGS)
    wait_follows(b, a, group)
    if system.get("replicationMode") == "sync":
        wait_in_sync_set(group, SLAVE_B)
    return a, b


# --- producing ------------------------------------------------------------------------


@dataclass
class Ack:
    partition: int
    offset: int
    payload: bytes


@dataclass
class PutStream:
    """Pipelined puts of one message each (``window`` in flight) on one connection, in a thread.

    Records every 200 (partition, offset, payload), every other reply, and the puts whose
    outcome is unknown (the connection died with them in flight). Stops by itself when the
    connection dies, or on ``stop()``.
    """

    address: tuple[str, int]
    tag: str = "s"
    partitions: int = 1
    window: int = 8
    size: int = 64
    acked: list[Ack] = field(default_factory=list)
    refused: list[tuple[int, str, bytes]] = field(default_factory=list)
    unknown: list[bytes] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.sent = 0
        self.done = threading.Event()

    def start(self) -> "PutStream":
        self._thread.start()
        return self

    def stop(self) -> "PutStream":
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "put stream did not stop"
        return self

    def wait_acked(self, count: int, timeout: float = 20) -> None:
        wait_until(lambda: len(self.acked) >= count or self.done.is_set(), timeout, message=f"{count} acks")
        assert len(self.acked) >= count, f"stream ended after {len(self.acked)} acks: {self.refused[-3:]}"

    def payload(self, n: int) -> bytes:
        return f"{self.tag}-{n:08d}".encode().ljust(self.size, b".")

    async def _run(self) -> None:
        try:
            conn = await BrokerConnection.open(*self.address, timeout=2)
        except Exception:
            self.done.set()
            return
        pending: deque[tuple[int, bytes, Any]] = deque()
        try:
            while not self._stop.is_set() or pending:
                while not self._stop.is_set() and len(pending) < self.window and conn.is_open:
                    payload = self.payload(self.sent)
                    partition = self.sent % self.partitions
                    try:
                        future = conn.send({"op": "put", "topic": TOPIC, "partition": partition}, encode_batch([(payload, None)]))
                    except Exception:
                        break
                    pending.append((partition, payload, future))
                    self.sent += 1
                if not pending:
                    break
                partition, payload, future = pending.popleft()
                try:
                    reply = await asyncio.wait_for(future, 15)
                except Exception:
                    self.unknown.append(payload)
                    continue
                if reply.code == 200:
                    self.acked.append(Ack(int(reply["partition"]), int(reply["offset"]), payload))
                    self.ack_times.append(time.monotonic())
                else:
                    self.refused.append((reply.code, reply.message, payload))
                    await asyncio.sleep(0.01)
        finally:
            conn.close()
            self.done.set()


async def _put_one(address: tuple[str, int], payload: bytes, partition: int = 0, timeout: float = 5) -> Any:
    conn = await BrokerConnection.open(*address, timeout=1)
    try:
        return await conn.request({"op": "put", "topic": TOPIC, "partition": partition}, encode_batch([(payload, None)]), timeout=timeout)
    finally:
        conn.close()


def put_one(broker: BrokerProcess, payload: bytes, partition: int = 0) -> Any:
    return run(_put_one(broker.address, payload, partition))


def put_once_term_published(broker: BrokerProcess, payload: bytes, timeout: float = 10) -> Any:
    """Put ``payload`` on a newly promoted sync master and return its first lasting answer.

    Until its term's sync set is published in ZooKeeper, a promoted sync master answers every put
    with a transient 503 ("not yet published"; nothing stored): that answer is retried, any other
    (an ack, or a refusal such as minSyncSlaves under reject) is returned.
    """

    def attempt() -> Any:
        reply = put_one(broker, payload)
        return None if reply.code == c.SERVICE_UNAVAILABLE and "not yet published" in reply.message else reply

    return wait_until(attempt, timeout, interval=0.02, message=f"{broker.name}'s sync set published")


def first_ack_after(broker: BrokerProcess, payload: bytes, timeout: float = 20) -> tuple[Any, float]:
    """Put ``payload`` on ``broker`` until it is acked; ``(reply, monotonic time of the ack)``."""

    def attempt() -> Any:
        try:
            reply = put_one(broker, payload)
        except Exception:
            return None
        return reply if reply.code == 200 else None

    reply = wait_until(attempt, timeout, interval=0.02, message=f"a put acked by {broker.name}")
    return reply, time.monotonic()


# --- reading logs back -------------------------------------------------------------------


async def _fetch_all(address: tuple[str, int], topic: str, partition: int, authenticator: Any) -> dict[int, bytes]:
    conn = await BrokerConnection.open(*address, timeout=2, authenticator=authenticator)
    found: dict[int, bytes] = {}
    offset = 0
    try:
        while True:
            reply = await conn.request(
                {"op": "get", "topic": topic, "partition": partition, "offset": offset, "max_size": 1 << 20}, timeout=10
            )
            if reply.code == 301:
                offset = int(reply["offset"])
                continue
            if reply.code != 200:
                return found
            records = list(iter_records(reply.body, offset))
            if not records:
                return found
            for record in records:
                found[record.offset] = bytes(record.data)
            offset = record_ends(reply.body, offset)[-1]
    finally:
        conn.close()


def fetch_all(broker: BrokerProcess, topic: str = TOPIC, partition: int = 0, authenticator: Any = None) -> dict[int, bytes]:
    """offset -> data of every record a ``get`` on ``broker`` returns (committed bytes only);
    ``authenticator``: log in first (a secured broker)."""
    return run(_fetch_all(broker.address, topic, partition, authenticator))


def partition_dir(broker: BrokerProcess, topic: str = TOPIC, partition: int = 0) -> Path:
    return broker.dir / "data" / f"{topic}-{partition}"


def disk_log(broker: BrokerProcess, topic: str = TOPIC, partition: int = 0) -> tuple[int, bytes]:
    """``(start offset, bytes)`` of a partition's segment files on disk, every byte written."""
    return broker.disk_log(topic, partition)


def disk_records(broker: BrokerProcess, topic: str = TOPIC, partition: int = 0) -> dict[int, bytes]:
    start, data = disk_log(broker, topic, partition)
    return {r.offset: bytes(r.data) for r in iter_records(data, start)}


def truncated_files(broker: BrokerProcess, topic: str = TOPIC, partition: int = 0) -> list[Path]:
    return sorted(partition_dir(broker, topic, partition).glob("truncated-*"))


def truncated_cut(path: Path) -> int:
    """The offset a ``truncated-{offset:020d}-{timestamp}.meta`` file starts at."""
    return int(path.name.split("-")[1])


def missing_acks(acks: list[Ack], records: dict[int, bytes]) -> list[Ack]:
    """Acks whose payload is not at the acked offset in ``records``."""
    return [a for a in acks if records.get(a.offset) != a.payload]


# --- ZooKeeper losing its data ------------------------------------------------------------


def restart_empty(server: EmbeddedZooKeeper, while_down: Callable[[], object] = lambda: None) -> float:
    """Stop ZooKeeper, empty its data directory, run ``while_down``, start it again; when it serves."""
    server.stop()
    assert server.data_dir is not None
    shutil.rmtree(server.data_dir / "data")
    while_down()
    server.start()
    return time.monotonic()
