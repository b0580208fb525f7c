"""Sync vs async replication, side by side in one run: produce throughput and per-put latency.

Starts its own embedded ZooKeeper and two broker groups as real processes on this machine,
with the same settings except ``replicationMode``:

* group 0: an **async** master and one slave;
* group 1: a **sync** master (``minSyncSlaves=1``, ``onSyncSlaveLoss=reject``) and one slave.

For each batch size (messages per put) it runs ``--rounds`` rounds, alternating which mode
goes first, each a ``--seconds`` stretch of pipelined puts (``--window`` puts in flight on one
connection, ``--size``-byte messages) to partition 0. Reported: the median over rounds of
messages/s, MB/s, and the median over rounds of each round's per-put latency p50/p99 (send to
ack). Throughput ratio = sync / async.

    python bench/sync_bench.py                       # batch sizes 1 10 100 1000
    python bench/sync_bench.py --batches 100 --rounds 5 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metaq.tools.launcher import BrokerProcess, wait_until  # noqa: E402

from metaq.client.connection import BrokerConnection
from metaq.protocol.messages import PutRequest
from metaq.record import encode_batch
from metaq.zk.embedded import EmbeddedZooKeeper

TOPIC = "bench"


async def run_round(address: tuple[str, int], batch: int, size: int, window: int, seconds: float) -> tuple[int, float, list[float]]:
    """Keep ``window`` puts in flight for ``seconds``; returns (messages acked, elapsed, latencies)."""
    conn = await BrokerConnection.open(*address)
    body = encode_batch([(b"x" * size, None)] * batch)
    latencies: list[float] = []
    acked = 0
    failures = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal acked, failures
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            reply = await conn.request(PutRequest(topic=TOPIC, partition=0).to_header(), body, timeout=60)
            if reply.code != 200:
                failures += 1
                if failures > 100:
                    raise RuntimeError(f"put failed: {reply.code} {reply.message}")
                await asyncio.sleep(0.01)
                continue
            latencies.append(time.perf_counter() - started)
            acked += batch

    began = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(window)))
    finally:
        conn.close()
    return acked, time.perf_counter() - began, latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_sync_set(zk_connect: str, broker_id: int, timeout: float = 30) -> None:
    import json

    from metaq.tools.launcher import zk_session
    from metaq.zk.paths import ZkPaths

    with zk_session(zk_connect) as client:
        path = ZkPaths("/meta").sync_set(broker_id)

        def ready() -> bool:
            return bool(client.exists(path)) and len(json.loads(client.get(path)[0])["slaves"]) >= 1

        wait_until(ready, timeout, interval=0.1, message=f"sync set of broker {broker_id}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--size", type=int, default=100, help="message size in bytes (default 100)")
    parser.add_argument("--window", type=int, default=32, help="puts in flight (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode and batch size (default 3)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one round (default 2)")
    parser.add_argument("--unflush-threshold", type=int, default=0, help="unflushThreshold for every broker (default 0: fsync before ack)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="metaq-sync-bench-"))
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    zk.start()
    processes: list[BrokerProcess] = []
    common = {"unflushThreshold": args.unflush_threshold, "maxTransferSize": 4 * 1024 * 1024}
    topics = {TOPIC: 1}
    try:
        groups: dict[str, BrokerProcess] = {}
        for broker_id, mode in ((0, "async"), (1, "sync")):
            system = dict(common, replicationMode=mode)
            if mode == "sync":
                system.update(minSyncSlaves=1, onSyncSlaveLoss="reject", syncSlaveTimeoutMs=2000)
            master = BrokerProcess(work, zk.connect_string, broker_id, topics, system)
            slave = BrokerProcess(work, zk.connect_string, broker_id, topics, dict(common), {"slaveId": 0})
            processes += [master, slave]
            master.start()
            slave.start()
            groups[mode] = master
        wait_sync_set(zk.connect_string, 1)

        results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for batch in args.batches:
            for round_no in range(args.rounds):
                order = ("async", "sync") if round_no % 2 == 0 else ("sync", "async")
                for mode in order:
                    acked, elapsed, lat = asyncio.run(
                        run_round(groups[mode].address, batch, args.size, args.window, args.seconds)
                    )
                    results.setdefault((mode, batch), []).append(
                        (acked / elapsed, percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000)
                    )
                    print(
                        f"  batch {batch:5d} round {round_no} {mode:5s}: {acked / elapsed:10.0f} msg/s"
                        f"  p50 {percentile(lat, 0.5) * 1000:7.2f} ms  p99 {percentile(lat, 0.99) * 1000:7.2f} ms",
                        file=sys.stderr,
                    )

        print()
        print(f"messages of {args.size} B, window {args.window} puts, {args.rounds} rounds x {args.seconds:g} s per mode, "
              f"unflushThreshold={args.unflush_threshold}; medians over rounds")
        print()
        print("| batch | async msg/s | sync msg/s | sync/async | async MB/s | sync MB/s | async p50 / p99 ms | sync p50 / p99 ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for batch in args.batches:
            a, s = results[("async", batch)], results[("sync", batch)]
            a_tp, s_tp = statistics.median(r[0] for r in a), statistics.median(r[0] for r in s)
            a50, a99 = statistics.median(r[1] for r in a), statistics.median(r[2] for r in a)
            s50, s99 = statistics.median(r[1] for r in s), statistics.median(r[2] for r in s)
            print(
                f"| {batch} | {a_tp:,.0f} | {s_tp:,.0f} | {s_tp / a_tp:.2f}x | {a_tp * args.size / 1e6:.1f} | "
                f"{s_tp * args.size / 1e6:.1f} | {a50:.2f} / {a99:.2f} | {s50:.2f} / {s99:.2f} |"
            )
    finally:
        for process in reversed(processes):
            process.stop()
        zk.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
