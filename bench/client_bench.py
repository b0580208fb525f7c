"""End-to-end client throughput vs the raw protocol, against one real broker.

    python bench/client_bench.py [--messages 200000] [--size 100] [--batch 1000] [--in-flight 8]

Starts an embedded ZooKeeper and one broker process (group commit, unflushThreshold=0),
then measures, in one run and against the same broker:

* raw produce: BrokerConnection puts of one prebuilt batch, ``--in-flight`` pipelined;
* raw consume: sequential 1 MiB gets, records only delimited with record_ends (the
  broker's cost alone); "raw consume+decode" also decodes them with record.iter_records,
  which is what any reader of the data must do at the least;
* client produce: AsyncMessageProducer.send_batch of Message objects, same batching;
* client consume: AsyncMessageConsumer, a listener called per message.

Each path writes its own topic, so every figure covers the same amount of data. The
ratio raw/client is the client's cost (target: at most 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from metaq.client import AsyncMessageSessionFactory, ConsumerConfig, Message, MetaClientConfig  # noqa: E402
from metaq.client.connection import BrokerConnection  # noqa: E402
from metaq.protocol.messages import PutRequest  # noqa: E402
from metaq.record import encode_batch  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper, free_port  # noqa: E402
from metaq.zk.paths import ZkPaths  # noqa: E402

from bench.common import fetch_sequentially  # noqa: E402

TOPICS = ("raw", "client")


def start_broker(workdir: Path, zk_connect: str, port: int) -> subprocess.Popen:
    topics = "".join(f"[topic={t}]\nnumPartitions=1\n\n" for t in TOPICS)
    ini = workdir / "server.ini"
    ini.write_text(
        "[system]\nbrokerId=0\nhostName=127.0.0.1\n"
        f"serverPort={port}\ndataPath={workdir / 'data'}\nunflushThreshold=0\n\n"
        f"[zookeeper]\nzk.zkConnect={zk_connect}\nzk.zkSessionTimeoutMs=10000\nzk.zkSyncTimeMs=0\n\n" + topics
    )
    log = open(workdir / "broker.log", "wb")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "metaq", "broker", "-c", str(ini)], stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_registered(zk_connect: str, timeout: float = 30) -> None:
    from metaq.zk.tls import make_kazoo_client

    client = make_kazoo_client(zk_connect)
    client.start(10)
    try:
        deadline = time.monotonic() + timeout
        while not all(client.exists(ZkPaths().topic_pub_node(t, 0)) for t in TOPICS):
            if time.monotonic() > deadline:
                raise SystemExit("broker did not register in ZooKeeper")
            time.sleep(0.1)
    finally:
        client.stop()
        client.close()


async def raw_produce(port: int, n: int, size: int, batch: int, in_flight: int) -> float:
    body = encode_batch([(b"x" * size, None)] * batch)
    conn = await BrokerConnection.open("127.0.0.1", port)
    sem = asyncio.Semaphore(in_flight)
    header = PutRequest(topic="raw", partition=0, count=batch).to_header()

    async def put() -> None:
        async with sem:
            reply = await conn.request(header, body)
            assert reply.ok, reply.header

    started = time.perf_counter()
    await asyncio.gather(*(put() for _ in range(n // batch)))
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


async def raw_consume(port: int, n: int, decode: bool = False) -> float:
    """Sequential gets; records only delimited (the broker's figure), or also decoded."""
    conn = await BrokerConnection.open("127.0.0.1", port)
    started = time.perf_counter()
    await fetch_sequentially(conn, "raw", n, decode, max_wait_ms=1000)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


async def client_produce(factory: AsyncMessageSessionFactory, n: int, size: int, batch: int, in_flight: int) -> float:
    producer = factory.create_producer()
    await producer.publish("client")
    payload = b"x" * size
    sem = asyncio.Semaphore(in_flight)

    async def send() -> None:
        async with sem:
            results = await producer.send_batch([Message("client", payload) for _ in range(batch)])
            assert all(r.success for r in results), results[0]

    started = time.perf_counter()
    await asyncio.gather(*(send() for _ in range(n // batch)))
    return time.perf_counter() - started


async def client_consume(factory: AsyncMessageSessionFactory, n: int, workdir: Path) -> float:
    done = asyncio.Event()
    count = 0

    def listener(message: Message) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    consumer = factory.create_consumer(ConsumerConfig(group="bench", fetch_size=1 << 20, recover_dir=str(workdir / "recover")))
    consumer.subscribe("client", 1 << 20, listener)
    started = time.perf_counter()
    await consumer.complete_subscribe()
    await done.wait()
    elapsed = time.perf_counter() - started
    await consumer.shutdown()
    return elapsed


async def measure(args: argparse.Namespace, zk_connect: str, port: int, workdir: Path) -> dict[str, float]:
    n = args.messages - args.messages % args.batch
    figures = {}
    figures["raw produce"] = n / await raw_produce(port, n, args.size, args.batch, args.in_flight)
    figures["raw consume"] = n / await raw_consume(port, n)
    figures["raw consume+decode"] = n / await raw_consume(port, n, decode=True)
    async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect)) as factory:
        figures["client produce"] = n / await client_produce(factory, n, args.size, args.batch, args.in_flight)
        figures["client consume"] = n / await client_consume(factory, n, workdir)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="metaq-client-bench-"))
    zk = EmbeddedZooKeeper(data_dir=workdir / "zk").start()
    port = free_port()
    broker = start_broker(workdir, zk.connect_string, port)
    try:
        wait_registered(zk.connect_string)
        coro = measure(args, zk.connect_string, port, workdir)
        if args.loop == "uvloop":
            import uvloop

            figures = uvloop.run(coro)
        else:
            figures = asyncio.run(coro)
    finally:
        broker.terminate()
        broker.wait(30)
        zk.stop()
    mb = args.size / 1e6
    print(f"{args.messages:,} messages of {args.size} B, batches of {args.batch}, {args.in_flight} in flight, {args.loop}, 1 broker (group commit)")
    print(f"{'path':<20}{'msgs/s':>12}{'MB/s':>9}")
    for name, rate in figures.items():
        print(f"{name:<20}{rate:>12,.0f}{rate * mb:>9.1f}")
    for client, raw in (("produce", "produce"), ("consume", "consume"), ("consume", "consume+decode")):
        ratio = figures[f"raw {raw}"] / figures[f"client {client}"]
        print(f"client {client} costs {ratio:.2f}x raw {raw} ({'within' if ratio <= 2 else 'OVER'} the 2x target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
