"""The throughput cost of transactions: the same messages sent plainly and in transactions.

    python bench/txn_bench.py [--rounds R] [--quick]

An embedded ZooKeeper and one master (``unflushThreshold=0``: every put is acked after
its fsync, group commit) on a topic of one partition; one asyncio client, one send at a
time (the latency-bound case, where a transaction's extra round trips show most). For
each transaction size N (1, 10, 100 messages of 100 B), R rounds of N messages each way:

    batch        plain: ``send_batch`` of N (one put)
                 txn:   ``begin_transaction``; ``send_batch`` of N; ``commit``
                        (start, put, end, commit_one_phase: 4 round trips and a COMMIT
                        marker fsynced, against 1 round trip)
    per message  plain: N x ``send_message``, each awaited (one put each)
                 txn:   ``begin_transaction``; N x ``send_message``; ``commit``

The plain producer is the default one (not idempotent: that is opt-in). The rounds interleave the four
cases. Prints msgs/s of each and the txn/plain ratio, side by side in the same run.

Then the read side's cost on a plain partition, in-process: what the broker adds to each
consumer fetch (the last stable offset and the aborted spans of the range), in us.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client import Message, MetaClientConfig  # noqa: E402
from metaq.config import TopicConfig  # noqa: E402
from metaq.record import encode_batch  # noqa: E402
from metaq.server.transactions import aborted_spans, stable_end  # noqa: E402
from metaq.server.partitions import Partitions  # noqa: E402
from metaq.store.manager import MessageStoreManager  # noqa: E402
from metaq.client.session import AsyncMessageSessionFactory  # noqa: E402
from metaq.tools.launcher import BrokerFactory  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402

TOPIC = "bench"
SIZES = (1, 10, 100)
PAYLOAD = b"x" * 100


async def measure(config: MetaClientConfig, n: int, rounds: int) -> dict[str, float]:
    batch = [Message(TOPIC, PAYLOAD) for _ in range(n)]
    async with AsyncMessageSessionFactory(config) as factory:
        plain = factory.create_producer()
        txn = factory.create_transactional_producer()

        async def plain_batch() -> None:
            results = await plain.send_batch(batch)
            assert all(r.success for r in results), results[0]

        async def plain_each() -> None:
            for message in batch:
                result = await plain.send_message(message)
                assert result.success, result

        async def txn_batch() -> None:
            await txn.begin_transaction()
            await txn.send_batch(batch)
            await txn.commit()

        async def txn_each() -> None:
            await txn.begin_transaction()
            for message in batch:
                await txn.send_message(message)
            await txn.commit()

        cases = {"plain batch": plain_batch, "txn batch": txn_batch, "plain each": plain_each, "txn each": txn_each}
        for case in cases.values():  # warm up: connections, metadata, producer ids
            await case()
        # Rounds interleave the cases, so that the load of a shared machine falls on all alike.
        spent = dict.fromkeys(cases, 0.0)
        for _ in range(rounds):
            for name, case in cases.items():
                start = time.perf_counter()
                await case()
                spent[name] += time.perf_counter() - start
    return {name: n * rounds / seconds for name, seconds in spent.items()}


def read_side_us(directory: Path, calls: int = 100_000) -> float:
    """Microseconds the fetch path spends on transactions for a plain partition of 10,000 messages."""
    store = MessageStoreManager({TOPIC: TopicConfig(name=TOPIC, num_partitions=1, data_path=str(directory))}, 1 << 20)
    store.open_existing()
    log = store.get_log(TOPIC, 0)
    for _ in range(1000):
        log.append(encode_batch([(PAYLOAD, None)] * 10))
    partitions = Partitions(store)
    partitions.open_all()  # as the broker's start does: each state loaded before serving
    end = log.log_end
    seconds = timeit.timeit(lambda: (stable_end(partitions, TOPIC, 0, end), aborted_spans(partitions, TOPIC, 0, 0, end)),
                            number=calls)
    partitions.close()
    store.close()
    return seconds / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="transactions per case and size (default 200)")
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
            print(f"{'N':>4} | {'plain batch':>11} {'txn batch':>10} {'ratio':>5} | {'plain each':>10} {'txn each':>9} {'ratio':>5}  (msgs/s)")
            for n in SIZES:
                r = asyncio.run(measure(config, n, rounds))
                print(f"{n:>4} | {r['plain batch']:>11,.0f} {r['txn batch']:>10,.0f} {r['txn batch'] / r['plain batch']:>5.2f} | "
                      f"{r['plain each']:>10,.0f} {r['txn each']:>9,.0f} {r['txn each'] / r['plain each']:>5.2f}", flush=True)
        finally:
            factory.stop_all()
            zk.stop()
        print(f"read side, plain partition: {read_side_us(Path(tmp) / 'read-side'):.1f} us per consumer fetch")


if __name__ == "__main__":
    main()
