"""The HTTP gateway against the binary protocol, side by side in one run.

    python bench/http_bench.py [--rounds 5] [--size 100] [--singles 300] [--batches 100] [--batch 100]

Starts an embedded ZooKeeper, one broker process (group commit, unflushThreshold=0) and
one ``metaq http`` gateway process, then runs each operation over both transports in
alternating rounds (binary first in even rounds, HTTP first in odd ones, so neither
always runs on a warmer machine) and prints the median msgs/s of each and their ratio:

* produce, 1 message per request: the client's send_message vs one POST each (latency-bound);
* produce, ``--batch`` messages per request: send_batch vs one POST of a JSON batch;
* fetch, 256 KiB pages from offset 0: raw gets decoded with the consumer's codec vs
  GETs of JSON pages (base64 data, decoded by the caller, as a binary-safe client must).

One client at a time, sequential requests: the figures are per-request costs, the
overhead HTTP and JSON (and the gateway's extra hop) add to each.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from metaq.client import AsyncMessageSessionFactory, Message, MetaClientConfig  # noqa: E402
from metaq.client.codec import decode_messages  # noqa: E402
from metaq.client.message import Partition  # noqa: E402
from metaq.client.routing import choose_replica  # noqa: E402
from metaq.http.process import GatewayProcess  # noqa: E402
from metaq.protocol.messages import GetRequest  # noqa: E402
from metaq.tools.launcher import BrokerFactory  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402

TOPIC = "bench"
PAGE = 256 * 1024

Op = Callable[[], Awaitable[int]]  # runs once, returns the messages it moved


class Bench:
    def __init__(self, factory: AsyncMessageSessionFactory, session: aiohttp.ClientSession, url: str, args: argparse.Namespace) -> None:
        self.factory = factory
        self.producer = factory.create_producer()
        self.session = session
        self.url = url
        self.args = args
        self.data = b"x" * args.size

    # --- produce -------------------------------------------------------------------------

    async def binary_single(self) -> int:
        for _ in range(self.args.singles):
            result = await self.producer.send_message(Message(TOPIC, self.data))
            assert result.success, result.error_message
        return self.args.singles

    async def http_single(self) -> int:
        body = {"data": self.data.decode()}
        for _ in range(self.args.singles):
            async with self.session.post(f"{self.url}/topics/{TOPIC}/messages", json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()
        return self.args.singles

    async def binary_batches(self) -> int:
        for _ in range(self.args.batches):
            results = await self.producer.send_batch([Message(TOPIC, self.data) for _ in range(self.args.batch)])
            assert all(r.success for r in results)
        return self.args.batches * self.args.batch

    async def http_batches(self) -> int:
        text = self.data.decode()
        for _ in range(self.args.batches):
            body = {"messages": [{"data": text} for _ in range(self.args.batch)]}
            async with self.session.post(f"{self.url}/topics/{TOPIC}/messages", json=body) as response:
                assert response.status == 200, await response.text()
                assert all(r["success"] for r in (await response.json())["results"])
        return self.args.batches * self.args.batch

    # --- fetch ---------------------------------------------------------------------------

    async def binary_fetch(self) -> int:
        master = choose_replica(self.factory.cluster.snapshot.brokers[0], "master")
        conn = await self.factory.pool.get(master.host, master.port)
        offset = got = 0
        partition = Partition(0, 0)
        while got < self.args.fetch_messages:
            reply = await conn.request(GetRequest(topic=TOPIC, partition=0, offset=offset, max_size=PAGE).to_header())
            assert reply.ok, reply.header
            messages, offset = decode_messages(reply.body, offset, TOPIC, partition)
            got += len(messages)
        return got

    async def http_fetch(self) -> int:
        offset = got = 0
        while got < self.args.fetch_messages:
            url = f"{self.url}/topics/{TOPIC}/partitions/0-0/messages?offset={offset}&max_bytes={PAGE}"
            async with self.session.get(url) as response:
                assert response.status == 200, await response.text()
                page = await response.json()
            for message in page["messages"]:
                base64.b64decode(message["data_base64"])
            got += len(page["messages"])
            offset = page["next_offset"]
        return got


async def timed(op: Op) -> float:
    started = time.perf_counter()
    moved = await op()
    return moved / (time.perf_counter() - started)


async def run(args: argparse.Namespace, zk: EmbeddedZooKeeper, gateway: GatewayProcess) -> None:
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root="/meta")
    async with AsyncMessageSessionFactory(config) as factory, aiohttp.ClientSession() as session:
        bench = Bench(factory, session, gateway.url, args)
        await bench.producer.publish(TOPIC)
        ops: list[tuple[str, Op, Op]] = [
            ("produce, 1 msg/request", bench.binary_single, bench.http_single),
            (f"produce, {args.batch} msgs/request", bench.binary_batches, bench.http_batches),
            ("fetch, 256 KiB pages", bench.binary_fetch, bench.http_fetch),
        ]
        # Warm-up (connections, imports, the page cache) and enough data for the fetch rounds.
        await bench.binary_batches()
        await bench.http_batches()
        rates: dict[str, dict[str, list[float]]] = {name: {"binary": [], "http": []} for name, _, _ in ops}
        for round_no in range(args.rounds):
            for name, binary, http in ops:
                order = [("binary", binary), ("http", http)]
                for transport, op in order if round_no % 2 == 0 else reversed(order):
                    rates[name][transport].append(await timed(op))
        print(f"{'operation':<28} {'binary msg/s':>14} {'HTTP msg/s':>12} {'HTTP/binary':>12}")
        for name, by_transport in rates.items():
            binary, http = (statistics.median(by_transport[t]) for t in ("binary", "http"))
            print(f"{name:<28} {binary:>14,.0f} {http:>12,.0f} {http / binary:>12.2f}")
        print(f"medians of {args.rounds} alternating rounds; {args.size}-byte messages; "
              f"fetch reads the first {args.fetch_messages} messages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--singles", type=int, default=300, help="single-message requests per round")
    parser.add_argument("--batches", type=int, default=100, help="batch requests per round")
    parser.add_argument("--batch", type=int, default=100, help="messages per batch request")
    parser.add_argument("--fetch-messages", type=int, default=10_000, help="messages read per fetch round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="metaq-http-bench-") as tmp:
        work = Path(tmp)
        zk = EmbeddedZooKeeper(data_dir=work / "zk")
        zk.start()
        brokers = BrokerFactory(work, zk.connect_string, "/meta")
        gateway = None
        try:
            brokers(0, {TOPIC: 1}, system={"unflushThreshold": 0})
            gateway = GatewayProcess(zk.connect_string, "/meta", work / "gateway.log").start()
            asyncio.run(run(args, zk, gateway))
        finally:
            if gateway is not None:
                gateway.stop()
            brokers.stop_all()
            zk.stop()


if __name__ == "__main__":
    main()
