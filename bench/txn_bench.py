"""The throughput cost of transactions: the same messages sent plainly and in transactions.

    python bench/txn_bench.py [--rounds R] [--quick]

An embedded ZooKeeper and one master (``unflushThreshold=0``: every put is acked after
its fsync, group commit) on a topic of one partition; one asyncio client, one send at a
time (the latency-bound case, where a transaction's extra round trips show most). For
each transaction size N (1, 10, 100 messages of 100 B):

    plain   R times ``send_batch`` of N messages with the default producer (idempotent:
            one put per batch)
    txn     R times ``begin_transaction``; ``send_batch`` of N; ``commit``
            (start, put, end, commit_one_phase: 4 round trips and a COMMIT marker that is
            fsynced, against 1 round trip)
    txn/msg R times ``begin_transaction``; N x ``send_message``; ``commit`` (one put per message)

Prints msgs/s of each and the ratio to plain, side by side in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client import Message, MetaClientConfig  # noqa: E402
from metaq.client.session import AsyncMessageSessionFactory  # noqa: E402
from metaq.tools.launcher import BrokerFactory  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402

TOPIC = "bench"
SIZES = (1, 10, 100)
PAYLOAD = b"x" * 100


async def measure(config: MetaClientConfig, n: int, rounds: int) -> dict[str, float]:
    batch = [Message(TOPIC, PAYLOAD) for _ in range(n)]
    rates: dict[str, float] = {}
    async with AsyncMessageSessionFactory(config) as factory:
        plain = factory.create_producer()
        txn = factory.create_transactional_producer()
        await plain.send_batch(batch)  # warm up: connections, metadata, producer ids
        await txn.begin_transaction()
        await txn.send_batch(batch)
        await txn.commit()

        start = time.perf_counter()
        for _ in range(rounds):
            results = await plain.send_batch(batch)
            assert all(r.success for r in results), results[0]
        rates["plain"] = n * rounds / (time.perf_counter() - start)

        start = time.perf_counter()
        for _ in range(rounds):
            await txn.begin_transaction()
            await txn.send_batch(batch)
            await txn.commit()
        rates["txn"] = n * rounds / (time.perf_counter() - start)

        start = time.perf_counter()
        for _ in range(rounds):
            await txn.begin_transaction()
            for message in batch:
                await txn.send_message(message)
            await txn.commit()
        rates["txn/msg"] = n * rounds / (time.perf_counter() - start)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="transactions per case and size (default 300)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 rounds")
    args = parser.parse_args()
    rounds = 20 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="metaq-txn-bench-") as tmp:
        zk = EmbeddedZooKeeper(data_dir=Path(tmp) / "zk", tick_ms=200)
        zk.start()
        factory = BrokerFactory(Path(tmp), zk.connect_string, "/meta")
        try:
            factory(0, {TOPIC: 1}, {"unflushThreshold": 0})
            config = MetaClientConfig(zk_connect=zk.connect_string, zk_root="/meta")
            print(f"{'N':>4} {'plain msgs/s':>13} {'txn msgs/s':>11} {'ratio':>6} {'txn/msg msgs/s':>15} {'ratio':>6}")
            for n in SIZES:
                r = asyncio.run(measure(config, n, rounds))
                print(f"{n:>4} {r['plain']:>13,.0f} {r['txn']:>11,.0f} {r['txn'] / r['plain']:>6.2f} "
                      f"{r['txn/msg']:>15,.0f} {r['txn/msg'] / r['plain']:>6.2f}", flush=True)
        finally:
            factory.stop_all()
            zk.stop()


if __name__ == "__main__":
    main()
