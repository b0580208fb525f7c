"""The throughput cost of the idempotent producer, end to end, side by side with the plain one.

    python bench/idempotence_bench.py [--rounds 3] [--messages 20000] [--mode sync]

Starts an embedded ZooKeeper and a broker group (``--mode sync``: a master and a sync
slave with group commit; ``single``: one master, threshold flush) as real processes,
then measures the same workloads with ``idempotence=True`` and ``idempotence=False``
in alternating rounds (idempotent first in odd rounds, plain first in even ones, so
drift on a shared machine hits both alike) and prints each round and the median ratio:

* ``per-message async``: ``send_message_async`` of every message, then wait for all
  (the accumulator batches them, one put in flight per partition);
* ``blocking send_message``: one message at a time on the caller's thread (the direct
  path, one round trip per message);
* ``send_batch x100``: batches of 100 messages, 8 batches in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client import AsyncMessageSessionFactory, Message, MessageSessionFactory, MetaClientConfig  # noqa: E402
from metaq.tools.launcher import LocalCluster  # noqa: E402

TOPIC = "idem"
PARTITIONS = 4


async def per_message_async(config: MetaClientConfig, n: int, payload: bytes) -> float:
    async with AsyncMessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        await producer.publish(TOPIC)
        await producer.send_message(Message(TOPIC, payload))  # connections and the producer id: not timed
        started = time.perf_counter()
        futures = [producer.send_message_async(Message(TOPIC, payload)) for _ in range(n)]
        results = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
    assert all(r.success for r in results), next(r for r in results if not r.success)
    return n / elapsed


async def batches_async(config: MetaClientConfig, n: int, payload: bytes, batch: int = 100, in_flight: int = 8) -> float:
    async with AsyncMessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        await producer.publish(TOPIC)
        await producer.send_message(Message(TOPIC, payload))
        sem = asyncio.Semaphore(in_flight)

        async def send() -> None:
            async with sem:
                results = await producer.send_batch([Message(TOPIC, payload)] * batch)
                assert all(r.success for r in results), results[0]

        started = time.perf_counter()
        await asyncio.gather(*(send() for _ in range(n // batch)))
        return n // batch * batch / (time.perf_counter() - started)


def blocking_one_by_one(config: MetaClientConfig, n: int, payload: bytes) -> float:
    with MessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        producer.publish(TOPIC)
        producer.send_message(Message(TOPIC, payload))
        started = time.perf_counter()
        for _ in range(n):
            result = producer.send_message(Message(TOPIC, payload))
            assert result.success, result.error_message
        elapsed = time.perf_counter() - started
        producer.close()
    return n / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000, help="per workload and round (blocking: a tenth)")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--mode", choices=("sync", "single"), default="sync")
    args = parser.parse_args()
    payload = b"x" * args.size
    if args.mode == "sync":
        system: dict[str, Any] = {"replicationMode": "sync", "unflushThreshold": 0, "onSyncSlaveLoss": "degrade"}
        slaves = 1
    else:
        system, slaves = {}, 0
    workloads: dict[str, Callable[[MetaClientConfig], float]] = {
        "per-message async": lambda cfg: asyncio.run(per_message_async(cfg, args.messages, payload)),
        "blocking send_message": lambda cfg: blocking_one_by_one(cfg, args.messages // 10, payload),
        "send_batch x100": lambda cfg: asyncio.run(batches_async(cfg, args.messages, payload)),
    }
    figures: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="metaq-idem-bench-") as tmp:
        with LocalCluster(tmp, masters=1, slaves=slaves, topics={TOPIC: PARTITIONS}, system=system) as cluster:
            for round_ in range(1, args.rounds + 1):
                order = (True, False) if round_ % 2 else (False, True)
                for name, workload in workloads.items():
                    for idempotence in order:
                        config = MetaClientConfig(zk_connect=cluster.zk_connect, idempotence=idempotence)
                        rate = workload(config)
                        figures.setdefault((name, idempotence), []).append(rate)
                        print(f"round {round_} {name:24s} {'idempotent' if idempotence else 'plain':10s} {rate:10.0f} msgs/s",
                              flush=True)
    print(f"\nmode {args.mode}, {args.rounds} rounds, {args.messages} messages of {args.size} bytes, {PARTITIONS} partitions")
    print(f"{'workload':24s} {'plain msgs/s':>14s} {'idempotent msgs/s':>18s} {'ratio':>7s}")
    for name in workloads:
        plain = statistics.median(figures[(name, False)])
        idem = statistics.median(figures[(name, True)])
        ratios = [i / p for i, p in zip(figures[(name, True)], figures[(name, False)])]
        print(f"{name:24s} {plain:14.0f} {idem:18.0f} {statistics.median(ratios):7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
