"""Spark reads from a slave vs the plain client's read rate, in one run.

    python bench/spark_bench.py [--messages 1000000] [--size 100] [--partitions 2] [--rounds 2] [--secure]

Starts an embedded ZooKeeper, one master and one slave (real ``metaq broker`` processes,
async replication), produces ``--messages`` messages of ``--size`` bytes to the master with
pipelined batched puts (``BrokerConnection``, batches of 1000, spread over the
partitions), waits until the slave's committed offsets reach the master's, then measures
against the slave:

* client: raw ``BrokerConnection`` gets of 1 MiB (the broker's maxTransferSize), one get
  in flight while the previous chunk is decoded with ``metaq.client.codec.decode_messages``
  (CRC check, a Message per record) -- one process, one core, partitions one after the other;
* spark: ``spark.read.format("metaq")`` from the slave, every row materialised by the
  ``noop`` sink, local[2] (one task per partition, two cores).

With ``--secure`` the pair runs with security and TLS on (bench/security_bench.py's files)
and both readers log in over TLS (the client with ``Credentials``, Spark with the options
``user``/``passwordFile``/``tlsCa``).

Reported: rows/s and MB/s (log bytes: 20-byte header + payload), and the ratio of Spark's
rate per core to the client's (target >= 0.5). Spark's first query includes starting the
Python workers; the best of ``--rounds`` rounds is the figure, all rounds are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from metaq.client.codec import decode_messages  # noqa: E402
from metaq.client.connection import Credentials  # noqa: E402
from metaq.client.message import Partition  # noqa: E402
from metaq.protocol.messages import GetRequest, OffsetRequest, PutRequest  # noqa: E402
from metaq.protocol.replies import OffsetReply, PutReply  # noqa: E402
from metaq.tools.launcher import LocalCluster  # noqa: E402
from metaq.record import encode_batch  # noqa: E402

TOPIC = "bench"


async def produce(
    host: str, port: int, messages: int, size: int, partitions: int, creds: Credentials, batch: int = 1000, in_flight: int = 16
) -> dict[int, int]:
    conn = await creds.open(host, port)
    body = encode_batch([(bytes([i % 251]) * size, None) for i in range(batch)])
    ends: dict[int, int] = {}
    pending: list = []
    sent = 0
    try:
        n = 0
        while sent < messages:
            count = min(batch, messages - sent)
            payload = body if count == batch else encode_batch([(b"x" * size, None)] * count)
            pending.append(conn.send(PutRequest(topic=TOPIC, partition=n % partitions, count=count).to_header(), payload))
            sent += count
            n += 1
            if len(pending) >= in_flight:
                put = PutReply.of(await pending.pop(0))
                ends[put.partition] = max(ends.get(put.partition, 0), put.end_offset)
        for fut in pending:
            put = PutReply.of(await fut)
            ends[put.partition] = max(ends.get(put.partition, 0), put.end_offset)
    finally:
        conn.close()
    return ends


async def committed(host: str, port: int, partition: int, creds: Credentials) -> int:
    conn = await creds.open(host, port)
    try:
        reply = await conn.request(OffsetRequest(topic=TOPIC, partition=partition, offset=0).to_header())
        return OffsetReply.of(reply).max_offset
    finally:
        conn.close()


async def wait_committed(host: str, port: int, ends: dict[int, int], creds: Credentials, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        values = {p: await committed(host, port, p, creds) for p in ends}
        if all(values[p] >= end for p, end in ends.items()):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"slave did not catch up: {values} < {ends}")
        await asyncio.sleep(0.2)


async def client_read(host: str, port: int, ends: dict[int, int], creds: Credentials, fetch: int = 1 << 20) -> tuple[int, int]:
    """Every partition from 0 to its end: (messages, log bytes)."""
    conn = await creds.open(host, port)
    messages = total = 0
    try:
        for p, end in sorted(ends.items()):
            part = Partition(0, p)
            offset = fetch_at = 0
            carry = b""
            future = conn.send(GetRequest(topic=TOPIC, partition=p, offset=0, max_size=min(fetch, end)).to_header())
            while True:
                reply = await future
                assert reply.ok, reply.header
                body = reply.body
                fetch_at += len(body)
                if fetch_at < end:
                    future = conn.send(GetRequest(topic=TOPIC, partition=p, offset=fetch_at, max_size=min(fetch, end - fetch_at)).to_header())
                buf = carry + body if carry else bytes(body)
                decoded, decoded_end = decode_messages(buf, offset, TOPIC, part)
                consumed = decoded_end - offset
                carry = buf[consumed:]
                offset += consumed
                messages += len(decoded)
                if fetch_at >= end:
                    break
            total += end
    finally:
        conn.close()
    return messages, total


def spark_session():
    from metaq.spark.session import local_session

    return local_session("metaq-spark-bench", **{"spark.driver.memory": "1g"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--secure", action="store_true", help="security and TLS on; every reader logs in over TLS")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="metaq-spark-bench-") as work:
        system: dict[str, object] = {"unflushInterval": 100}
        creds, login = Credentials(), {}
        if args.secure:
            from bench.security_bench import PASSWORD, USER, security_files

            (Path(work) / "security").mkdir()
            scram, tls, ca_file = security_files(Path(work) / "security")
            system.update(line.split("=", 1) for line in (scram + tls).splitlines())
            password_file = Path(work) / "security" / "bench.password"
            password_file.write_text(PASSWORD + "\n")
            creds = Credentials(USER, PASSWORD, ca_file)
            login = {"user": USER, "passwordFile": str(password_file), "tlsCa": ca_file}
        cluster = LocalCluster(Path(work), slaves=1, topics={TOPIC: args.partitions}, system=system)
        with cluster:
            master, slave = cluster.masters[0], cluster.slaves[0][0]
            t0 = time.perf_counter()
            ends = asyncio.run(produce(master.host, master.port, args.messages, args.size, args.partitions, creds))
            produce_s = time.perf_counter() - t0
            asyncio.run(wait_committed(slave.host, slave.port, ends, creds))
            caught_up_s = time.perf_counter() - t0
            total_bytes = sum(ends.values())
            print(f"produced {args.messages:,} x {args.size} B to {args.partitions} partitions in {produce_s:.1f}s; "
                  f"slave caught up after {caught_up_s:.1f}s; {total_bytes / 1e6:.1f} MB of log")

            client_rounds = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                n, _b = asyncio.run(client_read(slave.host, slave.port, ends, creds))
                client_rounds.append(time.perf_counter() - t)
                assert n == args.messages, (n, args.messages)
            spark = spark_session()
            spark_rounds = []
            try:
                for _ in range(args.rounds):
                    df = (
                        spark.read.format("metaq")
                        .option("zkConnect", cluster.zk_connect)
                        .option("topic", TOPIC)
                        .options(**login)
                        .load()
                    )
                    t = time.perf_counter()
                    df.write.format("noop").mode("overwrite").save()
                    spark_rounds.append(time.perf_counter() - t)
                count = df.count()
                assert count == args.messages, (count, args.messages)
            finally:
                spark.stop()

    client_s, spark_s = min(client_rounds), min(spark_rounds)
    client_rate, spark_rate = args.messages / client_s, args.messages / spark_s
    cores = 2
    print(f"client (1 core):      {client_rate:>12,.0f} rows/s  {total_bytes / client_s / 1e6:7.1f} MB/s   rounds {[round(s, 2) for s in client_rounds]} s")
    print(f"spark local[2]:       {spark_rate:>12,.0f} rows/s  {total_bytes / spark_s / 1e6:7.1f} MB/s   rounds {[round(s, 2) for s in spark_rounds]} s")
    print(f"spark per core:       {spark_rate / cores:>12,.0f} rows/s  ratio to client per core {spark_rate / cores / client_rate:.2f}x (target >= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
