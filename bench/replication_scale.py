"""A sync pair's replication against its partition count: slave start, sync set, idle CPU, rejoin.

    python bench/replication_scale.py                          # 1,000 and 4,000 partitions
    python bench/replication_scale.py --partitions 2000 10000 --limit 120

For each count: an embedded ZooKeeper and a sync pair (``onSyncSlaveLoss=degrade``, default
flush policy, topics of 250 partitions), started by pid on loopback. Measured from outside:

* ``start``: from the slave's launch until every partition replicates (its ``replica`` stats
  rows all ``following``);
* ``put``: one message pipelined to every partition, acked in sync mode (seconds, and how many
  were acked within ``--limit``);
* ``idle CPU``: master and slave over 10 s with nothing to do (percent of one core);
* ``rejoin``: a clean restart of the slave (every partition now holds data) until ZooKeeper's
  sync set names it again.

A phase that does not finish within ``--limit`` seconds shows ``> limit``. The machine's other
load counts in the times; compare builds side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from metaq.client.connection import BrokerConnection
from metaq.record import encode_batch
from metaq.tools.launcher import BrokerProcess
from metaq.zk.embedded import EmbeddedZooKeeper
from metaq.zk.paths import ZkPaths

sys.path.insert(0, str(Path(__file__).resolve().parent))
from put_cpu import cpu_seconds  # noqa: E402

TOPIC_PARTITIONS = 250
SYSTEM = {"replicationMode": "sync", "onSyncSlaveLoss": "degrade", "unflushThreshold": 0}


def topics_of(partitions: int) -> dict[str, int]:
    full, rest = divmod(partitions, TOPIC_PARTITIONS)
    topics = {f"scale{n}": TOPIC_PARTITIONS for n in range(full)}
    if rest:
        topics[f"scale{full}"] = rest
    return topics


async def _ask(address: tuple[str, int], header: dict) -> object:
    conn = await BrokerConnection.open(*address)
    try:
        return await conn.request(header, timeout=30)
    finally:
        conn.close()


def following(slave: BrokerProcess, partitions: int) -> bool:
    try:
        reply = asyncio.run(_ask(slave.address, {"op": "stats"}))
    except OSError:
        return False
    lines = [line for line in reply.body.decode().splitlines() if line.startswith("replica ")]
    return len(lines) == partitions and all("state=following" in line for line in lines)


async def _put_everywhere(address: tuple[str, int], topics: dict[str, int], limit: float) -> int:
    conn = await BrokerConnection.open(*address)
    keys = [(topic, p) for topic, count in topics.items() for p in range(count)]
    acked = 0
    try:
        for start in range(0, len(keys), 500):
            futures = [conn.send({"op": "put", "topic": topic, "partition": p}, encode_batch([(b"x" * 100, None)]))
                       for topic, p in keys[start:start + 500]]
            done, _ = await asyncio.wait(futures, timeout=limit)
            acked += sum(1 for future in done if not future.exception() and future.result().ok)
    finally:
        conn.close()
    return acked


def waited(predicate, limit: float) -> float | None:  # noqa: ANN001
    """Seconds until ``predicate()`` holds, or None after ``limit``."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.2)
    return None


def idle_cpu(pids: list[int], seconds: float = 10.0) -> list[float]:
    before = [sum(cpu_seconds(pid)) for pid in pids]
    time.sleep(seconds)
    return [100 * (sum(cpu_seconds(pid)) - b) / seconds for pid, b in zip(pids, before)]


def measure(partitions: int, limit: float, work: Path) -> dict[str, str]:
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    zk.start()
    topics = topics_of(partitions)
    master = BrokerProcess(work, zk.connect_string, 0, topics, SYSTEM)
    slave = BrokerProcess(work, zk.connect_string, 0, topics, {"unflushThreshold": 0}, {"slaveId": 0})
    sync_set = ZkPaths("/meta").sync_set(0)
    row: dict[str, str] = {"partitions": f"{partitions:,}"}

    def show(seconds: float | None) -> str:
        return f"> {limit:.0f} s" if seconds is None else f"{seconds:.1f} s"

    try:
        from kazoo.client import KazooClient

        zk_client = KazooClient(hosts=zk.connect_string)
        zk_client.start()
        master.start(timeout=600)
        began = time.monotonic()
        slave.start(timeout=600)
        row["start"] = show(waited(lambda: following(slave, partitions), limit - (time.monotonic() - began)))

        def in_sync_set() -> bool:
            return zk_client.exists(sync_set) and json.loads(zk_client.get(sync_set)[0])["slaves"] == [0]

        row["in sync set"] = show(waited(in_sync_set, limit))
        began = time.monotonic()
        acked = asyncio.run(_put_everywhere(master.address, topics, limit))
        row["put to all"] = f"{acked:,} acked in {time.monotonic() - began:.1f} s"
        master_cpu, slave_cpu = idle_cpu([master.pid, slave.pid])
        row["idle CPU m / s"] = f"{master_cpu:.1f}% / {slave_cpu:.1f}%"
        slave.stop()
        began = time.monotonic()
        slave.start(timeout=600)
        row["rejoin after restart"] = show(waited(in_sync_set, limit - (time.monotonic() - began)))
        zk_client.stop()
    finally:
        slave.stop()
        master.stop()
        zk.stop()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--limit", type=float, default=90.0, help="seconds a phase may take (default 90)")
    args = parser.parse_args()
    rows = []
    for partitions in args.partitions:
        with tempfile.TemporaryDirectory(prefix="metaq-replication-scale-") as work:
            rows.append(measure(partitions, args.limit, Path(work)))
            print(rows[-1], flush=True)
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row.get(column, "-") for column in columns) + " |")
    print(f"(load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
