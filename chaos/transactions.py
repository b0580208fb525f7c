"""Chaos with transactional producers: every transaction all or nothing, through faults.

    python -m chaos.transactions --scenario kill-master --seconds 15 --seed 1 --out DIR

The chaos topology (chaos/cluster.py: brokers and ZooKeeper behind fault proxies), a
seeded fault schedule (chaos/scenarios.py), and instead of the plain workload:

* ``WRITERS`` transactional producers (the real client, through the proxies) running
  transactions of 1-4 messages over the topic's partitions, three in four committed,
  one in four rolled back; every outcome recorded: committed (``commit`` returned),
  rolled back (``rollback`` returned, or ``commit`` raised ``TransactionRolledBack``),
  unknown (a step gave up);
* a reader scanning every replica (masters and slaves) read-committed every 0.1 s.

``TxnOutcomes.check`` then requires, of every scan of every replica: each partition's
share of a committed transaction whole or absent (a scan reads partitions one after
the other, and each partition's COMMIT marker lands on its own), no rolled-back
transaction, no message twice; and at the end, on every replica once settled, exactly
the committed transactions (an unknown one may be there or not, whole).

The same checker serves ``tests/integration/test_transactions_failover.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from metaq.client import Message, MetaClientConfig, TransactionError, TransactionRolledBack
from metaq.client.connection import BrokerConnection
from metaq.client.session import AsyncMessageSessionFactory
from metaq.protocol import commands as c
from metaq.protocol.replies import aborted_spans
from metaq.txn.reader import committed_records

WRITERS = 2


async def read_committed(address: tuple[str, int], topic: str, partition: int) -> list[bytes]:
    """Every message a read-committed consumer of the broker at ``address`` gets from ``partition`` now."""
    conn = await BrokerConnection.open(*address, timeout=5)
    found: list[bytes] = []
    offset = 0
    try:
        while True:
            reply = await conn.request({"op": "get", "topic": topic, "partition": partition, "offset": offset,
                                        "max_size": 1 << 20}, timeout=10)
            if reply.code != c.OK:
                if reply.code != c.NOT_FOUND:
                    raise ConnectionError(f"get at {offset}: {reply.code} {reply.message}")
                return found
            if "lso" in reply.header and offset + len(reply.body) > reply["lso"]:
                raise AssertionError(f"a reply past the last stable offset: {reply.header}")
            filtered = committed_records(reply.body, offset, aborted_spans(reply.header))
            found += [bytes(r.data) for r in filtered.records]
            if filtered.next_offset <= offset:
                raise AssertionError(f"no progress at {offset}: {reply.header}")
            offset = filtered.next_offset
    finally:
        conn.close()


def txn_of(message: bytes) -> str:
    """``w{w}-t{i}-{j}`` -> ``w{w}-t{i}``."""
    return message.decode().rpartition("-")[0]


class TxnOutcomes:
    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self.unknown: set[str] = set()
        #: transaction -> partition -> messages its acked puts stored there
        self.sent: dict[str, Counter[int]] = {}
        #: every scan: (replica, Counter of (transaction, partition))
        self.scans: list[tuple[str, Counter[tuple[str, int]]]] = []
        self.violations: list[str] = []

    def scan(self, messages: list[tuple[int, bytes]], where: str) -> None:
        counts = Counter(messages)
        twice = [m for m, n in counts.items() if n > 1]
        if twice:
            self.violations.append(f"{where}: messages seen twice: {twice[:3]}")
        self.scans.append((where, Counter((txn_of(m), p) for p, m in counts)))

    def final(self, messages: list[tuple[int, bytes]], where: str) -> None:
        """A scan once everything settled: exactly the committed transactions (unknown ones optional)."""
        self.scan(messages, f"{where} (final)")
        seen = {txn_of(m) for _p, m in messages}
        missing, extra = self.committed - seen, seen - self.committed - self.unknown
        if missing:
            self.violations.append(f"{where}: committed transactions not visible at the end: {sorted(missing)[:5]}")
        if extra:
            self.violations.append(f"{where}: visible transactions that were not committed: {sorted(extra)[:5]}")

    def check(self) -> list[str]:
        """After the writers stopped (every outcome known): the violations of every scan."""
        for where, seen in self.scans:
            for (name, partition), n in seen.items():
                if name in self.rolled_back:
                    self.violations.append(f"{where}: rolled-back transaction {name} visible in partition {partition}")
                elif name in self.committed and n != self.sent[name][partition]:
                    self.violations.append(f"{where}: transaction {name} partly visible in partition {partition}: "
                                           f"{n} of {self.sent[name][partition]}")
        return self.violations

    def summary(self) -> dict[str, Any]:
        return {"committed": len(self.committed), "rolled_back": len(self.rolled_back), "unknown": len(self.unknown),
                "scans": len(self.scans), "violations": self.violations[:20]}


async def transactional_writer(w: int, config: MetaClientConfig, topic: str, stop: threading.Event,
                               outcomes: TxnOutcomes) -> None:
    rng = random.Random(w)
    async with AsyncMessageSessionFactory(config) as factory:
        producer = factory.create_transactional_producer()
        i = 0
        while not stop.is_set():
            name, size = f"w{w}-t{i}", rng.randint(1, 4)
            i += 1
            sent = outcomes.sent[name] = Counter()
            try:
                await producer.begin_transaction(timeout_s=10)
                for j in range(size):
                    result = await producer.send_message(Message(topic, f"{name}-{j}".encode()))
                    assert result.partition is not None
                    sent[result.partition.partition] += 1
                if rng.random() < 0.25:
                    await producer.rollback()
                    outcomes.rolled_back.add(name)
                    continue
                await producer.commit()
                outcomes.committed.add(name)
            except TransactionRolledBack:
                outcomes.rolled_back.add(name)
            except TransactionError:
                outcomes.unknown.add(name)
                if producer.in_transaction:
                    try:
                        await producer.rollback()
                    except TransactionError:
                        pass


async def scan_all(replicas: dict[str, tuple[str, int]], topic: str, partitions: int) -> list[tuple[str, list[tuple[int, bytes]]]]:
    """One read-committed scan of each replica that answers: (name, [(partition, message), ...])."""
    found = []
    for name, address in replicas.items():
        try:
            messages = [(p, m) for p in range(partitions) for m in await read_committed(address, topic, p)]
        except (OSError, ConnectionError, asyncio.TimeoutError):
            continue  # down, cut off or not serving right now
        found.append((name, messages))
    return found


# --- the chaos run ----------------------------------------------------------------------------


def run(scenario: str, seconds: float, seed: int, out: Path, mode: str = "sync") -> dict[str, Any]:
    from .cluster import ChaosCluster
    from .scenarios import inject, schedule

    outcomes, stop = TxnOutcomes(), threading.Event()
    faults: list[dict[str, Any]] = []
    with ChaosCluster(out / "cluster", mode=mode) as cluster:
        config = MetaClientConfig(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root, zk_session_timeout_ms=5000,
                                  send_timeout_s=30, address_map=cluster.client_address_map)
        replicas = {b.name: (b.address, b.client_port) for b in cluster.brokers}
        topic, partitions = cluster.topic, cluster.partitions

        async def load() -> None:
            writers = [asyncio.ensure_future(transactional_writer(w, config, topic, stop, outcomes)) for w in range(WRITERS)]
            while not stop.is_set():
                for where, messages in await scan_all(replicas, topic, partitions):
                    outcomes.scan(messages, where)
                await asyncio.sleep(0.1)
            await asyncio.gather(*writers)

        loader = threading.Thread(target=lambda: asyncio.run(load()), daemon=True)
        loader.start()
        rng = random.Random(f"inject/{seed}")
        stop_at = time.monotonic() + seconds
        time.sleep(2)
        for number, step in enumerate(schedule(scenario, seed, 1, 1, cluster.session_ms / 1000)):
            if time.monotonic() >= stop_at:
                break
            target, details, heal = inject(cluster, step, rng)
            faults.append({"step": number, "kind": step.kind, "target": target, **details})
            time.sleep(step.hold_s)
            heal()
            cluster.wait_settled()
            time.sleep(step.gap_s)
        stop.set()
        loader.join(120)
        cluster.wait_settled()
        time.sleep(1)  # slaves' committed offsets catch up
        for where, messages in asyncio.run(scan_all(replicas, topic, partitions)):
            outcomes.final(messages, where)
    outcomes.check()
    result = {"scenario": scenario, "seed": seed, "faults": faults, **outcomes.summary()}
    (out / "transactions.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.transactions", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="kill-master")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", default="sync", choices=("sync", "async"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.scenario, args.seconds, args.seed, args.out, args.mode)
    print(json.dumps(result, indent=2))
    return 0 if not result["violations"] and result["committed"] else 1


if __name__ == "__main__":
    sys.exit(main())
