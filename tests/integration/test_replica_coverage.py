"""A slave that does not replicate a partition is a health failure (real ZooKeeper, real processes).

An async pair: the master's log of one partition has a record whose bytes were flipped on disk
before the slave first copied it, so the slave's replica of that partition stops (a reply that
fails its CRC check is never appended) while the other partitions replicate. ``metaq cluster``
exits 1 naming the partition and the slave; the master, once ``notReplicatingAfterMs`` has
passed, logs it, counts it in ``metaq_partitions_not_replicated`` and lists it in its stats.
"""

from __future__ import annotations

import re
import urllib.request

from metaq import record

from .replication_support import put, replica_rows, stats_lines, wait_for
from .test_topics_cli import metaq

TOPIC = "t"
PARTITIONS = 3
BROKEN = 1


def _flip_first_payload_byte(broker, partition: int) -> None:
    path = broker.dir / "data" / f"{TOPIC}-{partition}" / "00000000000000000000.meta"
    with open(path, "r+b") as f:
        f.seek(record.HEADER_SIZE + 3)
        byte = f.read(1)[0]
        f.seek(record.HEADER_SIZE + 3)
        f.write(bytes([byte ^ 0x20]))


def _metric(master, name: str, slave_id: int) -> float | None:
    port = int(re.findall(r"metrics on http://[^:]+:(\d+)/metrics", master.log_text())[-1])
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(rf'^{name}{{slave="{slave_id}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_a_slave_that_does_not_replicate_a_partition_is_unhealthy_everywhere(broker_factory, zk, zk_root, capsys) -> None:
    system = {"unflushThreshold": 0, "notReplicatingAfterMs": 2000, "metricsPort": 0}
    master = broker_factory(0, {TOPIC: PARTITIONS}, system)
    for partition in range(PARTITIONS):
        put(master, TOPIC, partition, 5)
    _flip_first_payload_byte(master, BROKEN)
    slave = broker_factory(0, {TOPIC: PARTITIONS}, system, {"slaveId": 1})
    wait_for(lambda: (rows := replica_rows(slave)) and rows.get((TOPIC, BROKEN), {}).get("state") == "stopped", 20,
             "the slave's replica of the flipped partition to stop")
    for partition in range(PARTITIONS):
        put(master, TOPIC, partition, 5)  # the others go on replicating; the stopped one falls behind

    code, out = metaq(capsys, zk, zk_root, "cluster")
    assert code == 1, out
    assert f"slave1 ({slave.url}) stopped replicating 1 partition(s): {TOPIC}-0-{BROKEN}" in out, out

    # The master's own view, once notReplicatingAfterMs (2 s) passed and its 5 s check ran.
    wait_for(lambda: "not_replicated slave1" in "\n".join(stats_lines(master)), 30, "the master to count it")
    line = next(line for line in stats_lines(master) if line.startswith("not_replicated slave1"))
    assert "count=1" in line and f"{TOPIC}-0-{BROKEN}" in line, line
    assert _metric(master, "metaq_partitions_not_replicated", 1) == 1.0
    warning = next(line for line in master.log_text().splitlines() if "is not replicating" in line)
    assert f"slave1 is not replicating 1 of {PARTITIONS} partition(s): {TOPIC}-0-{BROKEN}" in warning, warning
