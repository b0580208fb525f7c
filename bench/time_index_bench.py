"""Time index benchmark: the cost of a lookup, and what writing the index costs batched puts.

    python bench/time_index_bench.py lookup [--log-mib 4096 --segment-mib 1024] [--quick]
    python bench/time_index_bench.py append --baseline DIR [--rounds 5] [--messages 200000] [--quick]

``lookup``: writes a partition log in-process (``PartitionLog``, batches of 100 records of
100 B, the msg id clock moving 1 ms per batch), closes it and opens it again (as a broker
after a restart: index files are read on first use), answers one ``offset_for_time`` per
segment (first use: reading and checking each index file), then 1,000 random times, and
prints p50/p99 of those 1,000 (twice: the second pass finds the log's pages in the page
cache) and, per lookup, the most index files bisected and log bytes
read. Every answer is checked against the record times.

``append``: the same batched produce (one pipelined connection, 32 puts in flight, batches of
100 records of 100 B, ``unflushInterval`` flushing) against a broker of this tree and a broker
of ``--baseline`` (a checkout without the time index, e.g. ``git worktree add ../base
COMMIT``), alternating, ``--rounds`` times each; prints the median msgs/s and the median
broker CPU microseconds per message of each, and their ratios (measured side by side in one run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq import record  # noqa: E402
from metaq.store import log as store_log  # noqa: E402
from metaq.store.log import PartitionLog  # noqa: E402
from metaq.store.msgid import MsgIdGenerator, msg_id_timestamp_ms  # noqa: E402
from metaq.store.timeindex import SegmentTimeIndex  # noqa: E402

from bench.broker_bench import BrokerUnderTest, produce  # noqa: E402
from bench.put_cpu import cpu_seconds  # noqa: E402

T0 = 1_795_000_000_000
BATCH = 100
SIZE = 100


def build_log(directory: Path, log_bytes: int, segment_bytes: int) -> list[int]:
    """A log of about ``log_bytes``; returns the first record time of every batch."""
    now = [T0]
    ids = MsgIdGenerator(1, clock_ms=lambda: now[0])
    log = PartitionLog(directory, max_segment_size=segment_bytes)
    template = bytes(record.encode_batch([(os.urandom(SIZE), None)] * BATCH))
    times = []
    started = time.perf_counter()
    while log.log_end < log_bytes:
        buf = bytearray(template)
        record.stamp_msg_ids(buf, ids.allocate(BATCH))
        times.append(now[0])
        log.append(buf)
        now[0] += 1
        if len(times) % 2000 == 0:
            log.flush()
    log.flush()
    log.close()
    print(f"wrote {log_bytes / 2**20:.0f} MiB in {segment_bytes / 2**20:.0f} MiB segments, "
          f"{len(times) * BATCH:,} records, in {time.perf_counter() - started:.1f} s")
    return times


def run_lookup(args: argparse.Namespace) -> None:
    log_bytes, segment_bytes = args.log_mib << 20, args.segment_mib << 20
    with tempfile.TemporaryDirectory(prefix="metaq-timeindex-", dir=args.dir) as tmp:
        directory = Path(tmp) / "t-0"
        batch_times = build_log(directory, log_bytes, segment_bytes)
        batch_bytes = len(record.encode_batch([(b"x" * SIZE, None)] * BATCH))
        log = PartitionLog(directory, max_segment_size=segment_bytes)
        read_bytes, brackets = [0], [0]
        segment_read = store_log.LogSegment.read
        bracket = SegmentTimeIndex.bracket

        def counting_read(self, offset: int, length: int) -> bytes:
            data = segment_read(self, offset, length)
            read_bytes[0] += len(data)
            return data

        def counting_bracket(self, time_ms: int):
            brackets[0] += 1
            return bracket(self, time_ms)

        store_log.LogSegment.read = counting_read  # type: ignore[method-assign]
        SegmentTimeIndex.bracket = counting_bracket  # type: ignore[method-assign]
        try:
            first_use = []
            for segment in log.segments:
                started = time.perf_counter()
                log.offset_for_time(segment.time_index.first_time(segment.read, segment.end) + 1)
                first_use.append(time.perf_counter() - started)
            rng = random.Random(1)
            batches = [rng.randrange(len(batch_times)) for _ in range(1000)]
            passes, most_read, most_files = [], 0, 0
            for _ in range(2):  # the second pass: the same times, their pages now in the page cache
                latencies, cpu = [], []
                for batch in batches:
                    read_bytes[0] = brackets[0] = 0
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    found = log.offset_for_time(batch_times[batch])
                    latencies.append(time.perf_counter() - started)
                    cpu.append(time.thread_time() - started_cpu)
                    most_read, most_files = max(most_read, read_bytes[0]), max(most_files, brackets[0])
                    assert found == batch * batch_bytes, (batch, found, batch * batch_bytes)
                passes.append((sorted(latencies), sorted(cpu)))
        finally:
            store_log.LogSegment.read = segment_read  # type: ignore[method-assign]
            SegmentTimeIndex.bracket = bracket  # type: ignore[method-assign]
            log.close()
        index_bytes = sum(p.stat().st_size for p in directory.glob("*.timeindex"))
    print(f"index files: {index_bytes / 2**20:.2f} MiB in all ({index_bytes / log_bytes * 100:.2f}% of the log)")
    print(f"first use of a segment's index (read and check the file): median {statistics.median(first_use) * 1000:.1f} ms, "
          f"max {max(first_use) * 1000:.1f} ms")
    for name, (latencies, cpu) in zip(("first pass", "second pass (same times)"), passes):
        print(f"lookup over 1,000 random times, {name}: p50 {statistics.median(latencies) * 1e6:.0f} us, "
              f"p99 {latencies[989] * 1e6:.0f} us wall clock; CPU p50 {statistics.median(cpu) * 1e6:.0f} us, "
              f"p99 {cpu[989] * 1e6:.0f} us")
    print(f"per lookup at most {most_files} index file(s) bisected and {most_read:,} log bytes read")


def run_append(args: argparse.Namespace) -> None:
    baseline = Path(args.baseline).resolve()
    if not (baseline / "metaq" / "__init__.py").exists():
        raise SystemExit(f"--baseline {baseline}: not a metaq checkout (no metaq/__init__.py)")
    import bench.broker_bench as broker_bench

    results: dict[str, list[tuple[float, float]]] = {"baseline": [], "time index": []}
    with tempfile.TemporaryDirectory(prefix="metaq-bench-") as tmp:
        for round_ in range(args.rounds):
            for name, tree in (("baseline", baseline), ("time index", REPO)):
                broker_bench.REPO = tree  # the broker process runs this tree's package
                with BrokerUnderTest(Path(tmp) / f"{round_}-{name.replace(' ', '-')}", unflush_threshold=1000) as broker:
                    assert broker.proc is not None
                    before = sum(cpu_seconds(broker.proc.pid))
                    figures = asyncio.run(produce(broker.port, args.messages, SIZE, BATCH))
                    cpu = sum(cpu_seconds(broker.proc.pid)) - before
                results[name].append((figures["msgs_per_s"], cpu / args.messages * 1e6))
                print(f"round {round_ + 1} {name}: {figures['msgs_per_s']:,.0f} msgs/s, {cpu / args.messages * 1e6:.2f} us CPU/msg")
    broker_bench.REPO = REPO
    medians = {name: (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)) for name, rows in results.items()}
    for name, (rate, cpu) in medians.items():
        print(f"{name}: median {rate:,.0f} msgs/s, {cpu:.2f} us broker CPU per message")
    (base_rate, base_cpu), (index_rate, index_cpu) = medians["baseline"], medians["time index"]
    print(f"time index / baseline: throughput {index_rate / base_rate:.3f}, broker CPU per message {index_cpu / base_cpu:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    lookup = sub.add_parser("lookup", help="lookup p50/p99 over 1,000 random times")
    lookup.add_argument("--log-mib", type=int, default=4096)
    lookup.add_argument("--segment-mib", type=int, default=1024)
    lookup.add_argument("--dir", help="where to write the log (default: the system's temporary directory)")
    append = sub.add_parser("append", help="batched produce with and without the time index, side by side")
    append.add_argument("--baseline", required=True, help="a checkout of the code without the time index")
    append.add_argument("--rounds", type=int, default=5)
    append.add_argument("--messages", type=int, default=200_000)
    for command in (lookup, append):
        command.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    if args.quick:
        args.log_mib, args.segment_mib, args.messages, args.rounds = 64, 16, 20_000, 1
    run_lookup(args) if args.what == "lookup" else run_append(args)


if __name__ == "__main__":
    main()
