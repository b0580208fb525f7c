"""Example Spark pipeline: read topic ``orders`` from slaves, enrich, write ``orders-enriched``
exactly once, then check the result (docs/spark.md, "Example pipeline").

An order is the payload ``order_id,customer,amount_cents`` with the region as MetaQ
attribute. The job reads every order committed so far (a stream with
``trigger(availableNow=True)`` over a checkpoint: run it again and it only takes new
orders), adds a size class and writes a JSON record per order, keyed by customer (a
customer's orders stay in one partition, in order), through the exactly-once sink. The
check reads both topics back (read committed) and fails unless every order is in
``orders-enriched`` exactly once.

    python examples/spark_orders_pipeline.py --zk 127.0.0.1:PORT --user app \\
        --password-file /tmp/metaq-demo/security/app.password --seed 1000 --checkpoint /tmp/orders-ckpt

``--spark-master local-cluster[2,1,1024]`` runs it with two executor JVMs (what
``tests/spark/test_cluster.py`` does); under ``spark-submit`` leave it out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

SIZE_CLASSES = "CASE WHEN amount_cents >= 10000 THEN 'large' WHEN amount_cents >= 1000 THEN 'medium' ELSE 'small' END"


def login_options(args: argparse.Namespace) -> dict[str, str]:
    options = {"zkConnect": args.zk, "zkRoot": args.zk_root}
    for option, value in (("user", args.user), ("passwordFile", args.password_file), ("tlsCa", args.tls_ca)):
        if value:
            options[option] = value
    return options


def seed_orders(options: dict[str, str], topic: str, count: int, first: int = 0) -> None:
    """``count`` orders ``first..first+count-1`` through the client's producer (as the job's user)."""
    from metaq.client import AsyncMessageSessionFactory, Message, MetaClientConfig
    from metaq.spark.login import SparkLogin

    config = MetaClientConfig(zk_connect=options["zkConnect"], zk_root=options["zkRoot"],
                              credentials=SparkLogin.parse(options).credentials())

    async def run() -> None:
        async with AsyncMessageSessionFactory(config) as factory:
            producer = factory.create_producer()
            messages = [Message(topic, f"{n},customer-{n % 17},{(n * 137) % 20000}".encode(),
                                attribute=("eu", "us", "apac")[n % 3]) for n in range(first, first + count)]
            results = [r for start in range(0, count, 200) for r in await producer.send_batch(messages[start:start + 200])]
            failed = [r for r in results if not r.success]
            if failed:
                raise SystemExit(f"{len(failed)} orders not sent, e.g. {failed[0].error_message}")

    asyncio.run(run())


def enrich(spark: Any, options: dict[str, str], source: str, target: str, checkpoint: str) -> None:
    """Every order committed in ``source`` not yet processed (per the checkpoint) -> ``target``, once."""
    orders = spark.readStream.format("metaq").options(**options).option("topic", source) \
        .option("readFrom", "slave").option("startingOffsets", "earliest").load()
    fields = "split(CAST(data AS STRING), ',')"
    enriched = orders.selectExpr(
        f"CAST({fields}[0] AS LONG) AS order_id", f"{fields}[1] AS customer",
        f"CAST({fields}[2] AS LONG) AS amount_cents", "attribute AS region",
        "partition AS source_partition", "offset AS source_offset",
    ).selectExpr("*", f"{SIZE_CLASSES} AS size")
    query = (enriched.selectExpr("customer AS key", "CAST(to_json(struct(*)) AS BINARY) AS value", "size AS attribute")
             .writeStream.format("metaq").options(**options).option("topic", target)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the pipeline failed: {query.exception()}")


def check(spark: Any, options: dict[str, str], source: str, target: str) -> int:
    """Every order of ``source`` exactly once in ``target`` (read committed, from the masters); returns the count."""

    def read(topic: str) -> Any:
        return spark.read.format("metaq").options(**options).option("topic", topic).option("readFrom", "master").load()

    orders = sorted(int(bytes(r.data).split(b",")[0]) for r in read(source).select("data").collect())
    written = [json.loads(bytes(r.data)) for r in read(target).select("data").collect()]
    got = sorted(row["order_id"] for row in written)
    if got != orders:
        missing, extra = sorted(set(orders) - set(got)), len(got) - len(set(got))
        raise SystemExit(f"{target}: {len(got)} rows for {len(orders)} orders; missing {missing[:10]}, duplicates {extra}")
    return len(got)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string of the cluster")
    parser.add_argument("--zk-root", default="/meta")
    parser.add_argument("--user"), parser.add_argument("--password-file"), parser.add_argument("--tls-ca")
    parser.add_argument("--source", default="orders"), parser.add_argument("--target", default="orders-enriched")
    parser.add_argument("--checkpoint", required=True, help="the stream's checkpoint directory (keep it between runs)")
    parser.add_argument("--seed", type=int, default=0, help="first produce this many new orders into --source")
    parser.add_argument("--spark-master", help="e.g. local[2] or local-cluster[2,1,1024] (default: spark-submit's)")
    args = parser.parse_args(argv)

    from metaq.spark.session import local_session

    options = login_options(args)
    if args.seed:  # order ids from the clock (microseconds): a later --seed run adds new orders, never repeats one
        seed_orders(options, args.source, args.seed, first=time.time_ns() // 1000)
    if args.spark_master:
        spark = local_session("metaq-orders-pipeline", master=args.spark_master)
    else:  # under spark-submit: its master and environment
        from pyspark.sql import SparkSession

        from metaq.spark import MetaQDataSource

        spark = SparkSession.builder.appName("metaq-orders-pipeline").getOrCreate()
        spark.dataSource.register(MetaQDataSource)
    try:
        enrich(spark, options, args.source, args.target, args.checkpoint)
        count = check(spark, options, args.source, args.target)
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        print(f"{args.target}: {count} orders, each exactly once ({executors or 'no separate'} executors)")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
