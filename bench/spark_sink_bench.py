"""Spark's metaq sink (exactly once and plain) vs the client's batched producer, in one run.

    python bench/spark_sink_bench.py [--rows 1000000] [--size 100] [--partitions 2] [--rounds 3]

Starts an embedded ZooKeeper and one master (a real ``metaq broker`` process,
``unflushInterval=100``), then writes ``--rows`` rows of ``--size`` bytes to a topic of
``--partitions`` partitions, three ways, each ``--rounds`` times after one untimed warm-up
write of a tenth of the rows each (the JVM's JIT, the Python workers), the ways taking turns within
each round (the median round of each is reported, so load from elsewhere on the machine
falls on all three alike):

* client: ``AsyncMessageProducer.send_batch`` in batches of 10,000 messages (spread over
  the partitions round robin), one process;
* spark plain: ``df.write.format("metaq").option("exactlyOnce", "false")``, local[2];
* spark exactly once: the same with XA (the default).

Every round's rows are counted back (read committed, waiting for the flush) so a fast
round that lost or doubled rows cannot pass. Reported: rows/s and the ratio of Spark's rate
per core (``local[2]``: 2 cores) to the client's (one process, one core); and rows per
CPU-second of every process of the run (this one and its children: the JVM and its Python
workers, the broker, ZooKeeper), the same comparison whatever else loads the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from metaq.client import Message, MetaClientConfig  # noqa: E402
from metaq.client.session import AsyncMessageSessionFactory  # noqa: E402
from metaq.tools.launcher import LocalCluster  # noqa: E402

BATCH = 10_000


def tree_cpu() -> float:
    """CPU seconds used so far by this process and every process under it (the JVM, its Python
    workers, the broker, ZooKeeper), those that ended included."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


async def client_write(zk_connect: str, topic: str, rows: int, size: int) -> None:
    payload = b"x" * size
    async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect)) as factory:
        producer = factory.create_producer()
        for start in range(0, rows, BATCH):
            results = await producer.send_batch([Message(topic, payload) for _ in range(min(BATCH, rows - start))])
            assert all(r.success for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ways = ("client", "spark plain", "spark exactly once")
    topics = {f"t{w}{r}": args.partitions for w in range(len(ways)) for r in range(-1, args.rounds)}

    with tempfile.TemporaryDirectory(prefix="metaq-sink-bench-") as work:
        with LocalCluster(Path(work), topics=topics, system={"unflushInterval": 100}) as cluster:
            from pyspark.sql import functions as F

            from metaq.spark.session import local_session

            spark = local_session("metaq-sink-bench", **{"spark.driver.memory": "1g"})
            seconds: dict[str, list[float]] = {w: [] for w in ways}

            cpu: dict[str, list[float]] = {w: [] for w in ways}

            def write(way: str, topic: str, rows: int) -> float:
                t, used = time.perf_counter(), tree_cpu()
                if way == "client":
                    asyncio.run(client_write(cluster.zk_connect, topic, rows, args.size))
                else:
                    df = spark.range(0, rows, numPartitions=2).select(
                        F.concat(F.col("id").cast("string"), F.lit("x" * args.size)).substr(1, args.size).cast("binary").alias("value"))
                    (df.write.format("metaq").mode("append").option("zkConnect", cluster.zk_connect).option("topic", topic)
                     .option("exactlyOnce", "true" if way.endswith("once") else "false").save())
                cpu[way].append(tree_cpu() - used)
                return time.perf_counter() - t

            try:
                for w, way in enumerate(ways):  # warm-up, not counted: the JVM's JIT, the Python workers
                    write(way, f"t{w}-1", args.rows // 10)
                    cpu[way].clear()
                for r in range(args.rounds):
                    for w, way in enumerate(ways):
                        topic = f"t{w}{r}"
                        seconds[way].append(write(way, topic, args.rows))
                        # Readers see up to the flushed offset (unflushInterval): poll briefly.
                        deadline = time.monotonic() + 10
                        while (count := (spark.read.format("metaq").option("zkConnect", cluster.zk_connect)
                                         .option("topic", topic).option("readFrom", "master").load().count())) < args.rows:
                            assert time.monotonic() < deadline, (way, count, args.rows)
                            time.sleep(0.2)
                        assert count == args.rows, (way, count, args.rows)
            finally:
                spark.stop()

    rate = {way: args.rows / statistics.median(s) for way, s in seconds.items()}
    for way in ways:
        print(f"{way:<20} {rate[way]:>10,.0f} rows/s (median)   rounds {[round(s, 2) for s in seconds[way]]} s")
    for way in ways[1:]:
        print(f"{way} per core / client: {rate[way] / 2 / rate['client']:.2f}x")
    # The same comparison by CPU time instead of wall-clock time: what each way costs, whatever
    # else runs on the machine meanwhile.
    per_cpu = {way: args.rows / statistics.median(s) for way, s in cpu.items()}
    for way in ways:
        print(f"{way:<20} {per_cpu[way]:>10,.0f} rows per CPU-second (median; every process of the run: "
              f"client or Spark, broker, ZooKeeper)   rounds {[round(s, 2) for s in cpu[way]]} s")
    for way in ways[1:]:
        print(f"{way} per CPU-second / client: {per_cpu[way] / per_cpu['client']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
