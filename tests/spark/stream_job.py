"""A Spark driver in its own OS process, for the driver-kill test (tests/spark/test_sink.py):
a stream from topic ``--source`` to topic ``--sink`` through the exactly-once sink, keyed by
the text before ':' in each payload, ``trigger(availableNow=True)`` cut into micro-batches
of about ``--max-messages`` records. Exits 0 once every record committed when it started is
through, 1 if the query failed. With ``--fail-first-attempts``, Spark retries a failed task
once (``local[2,2]``), and the first attempt of every task that meets a record numbered
``n % 100 == 50`` fails after its earlier rows went into its XA branch (a task failure and retry).

    python -m tests.spark.stream_job --zk HOST:PORT --zk-root /meta --source IN --sink OUT \\
        --checkpoint DIR --max-messages 100
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--zk", "--zk-root", "--source", "--sink", "--checkpoint"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--max-messages", type=int, required=True)
    parser.add_argument("--fail-first-attempts", action="store_true")
    args = parser.parse_args(argv)

    from metaq.spark.session import local_session

    master = "local[2,2]" if args.fail_first_attempts else None  # local[N, maxFailures]
    spark = local_session("metaq-stream-job", master=master, **{"spark.sql.shuffle.partitions": "2"})
    cluster = {"zkConnect": args.zk, "zkRoot": args.zk_root}
    stream = (spark.readStream.format("metaq").options(**cluster).option("topic", args.source)
              .option("readFrom", "master").option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", str(args.max_messages)).load())
    rows = stream.selectExpr("substring_index(CAST(data AS STRING), ':', 1) AS key", "data AS value")
    if args.fail_first_attempts:
        rows = rows.selectExpr("key", "value").withColumn("value", _failing_first_attempt()("value"))
    query = (rows
             .writeStream.format("metaq").options(**cluster).option("topic", args.sink)
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    failure = query.exception()
    spark.stop()
    if failure is not None:
        print(f"stream_job: the query failed: {failure}", file=sys.stderr)
        return 1
    return 0


def _failing_first_attempt():
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    @F.udf("binary")
    def value_or_failure(value: bytes) -> bytes:
        if TaskContext.get().attemptNumber() == 0 and int(bytes(value).split(b":")[1]) % 100 == 50:
            raise RuntimeError("stream_job: injected task failure (first attempt)")
        return value

    return value_or_failure


if __name__ == "__main__":
    sys.exit(main())
