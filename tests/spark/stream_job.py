"""A Spark driver in its own OS process, for the driver-kill test (tests/spark/test_sink.py):
a stream from topic ``--source`` to topic ``--sink`` through the exactly-once sink, keyed by
the text before ':' in each payload, ``trigger(availableNow=True)`` cut into micro-batches
of about ``--max-messages`` records. Exits 0 once every record committed when it started is
through, 1 if the query failed.

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
    args = parser.parse_args(argv)

    from metaq.spark.session import local_session

    spark = local_session("metaq-stream-job", **{"spark.sql.shuffle.partitions": "2"})
    cluster = {"zkConnect": args.zk, "zkRoot": args.zk_root}
    stream = (spark.readStream.format("metaq").options(**cluster).option("topic", args.source)
              .option("readFrom", "master").option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", str(args.max_messages)).load())
    query = (stream.selectExpr("substring_index(CAST(data AS STRING), ':', 1) AS key", "data AS value")
             .writeStream.format("metaq").options(**cluster).option("topic", args.sink)
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    failure = query.exception()
    spark.stop()
    if failure is not None:
        print(f"stream_job: the query failed: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
