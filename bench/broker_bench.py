"""Broker core benchmark: produce and fetch throughput against a real broker process.

    python bench/broker_bench.py [--messages N] [--quick]

For each flush mode (unflushInterval flushing vs. group commit), message size
(100 B, 1 KiB) and batch size (1, 100), it starts a fresh broker process
(``zk.zkEnable=false``: no ZooKeeper needed), produces N messages over one
pipelined connection, then fetches them all back. It prints msgs/s, MB/s,
per-put latency (p50/p99) and the ratios measured side by side in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client.connection import BrokerConnection  # noqa: E402
from metaq.protocol.messages import GetRequest, PutRequest  # noqa: E402
from metaq.record import encode_batch  # noqa: E402

from bench.common import fetch_sequentially  # noqa: E402

WINDOW = 32  # puts in flight on the connection


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerUnderTest:
    def __init__(self, workdir: Path, unflush_threshold: int, extra: str = "") -> None:
        self.port = free_port()
        self.dir = workdir / f"broker-{self.port}"
        self.dir.mkdir(parents=True)
        (self.dir / "server.ini").write_text(
            f"""[system]
brokerId=0
hostName=127.0.0.1
serverPort={self.port}
dataPath={self.dir / 'data'}
unflushThreshold={unflush_threshold}
unflushInterval=1000
maxSegmentSize=268435456
{extra}
[zookeeper]
zk.zkEnable=false
[topic=bench]
numPartitions=1
"""
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "BrokerUnderTest":
        log = open(self.dir / "broker.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "metaq", "broker", "-c", str(self.dir / "server.ini")],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not start: {(self.dir / 'broker.log').read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


Connect = Callable[[int], Awaitable[BrokerConnection]]


async def plain_connection(port: int) -> BrokerConnection:
    return await BrokerConnection.open("127.0.0.1", port)


async def produce(port: int, messages: int, size: int, batch: int, connect: Connect = plain_connection) -> dict[str, float]:
    conn = await connect(port)
    payload = encode_batch([(os.urandom(size), None)] * batch)
    puts = messages // batch
    latencies: list[float] = []
    failures = 0
    header = PutRequest(topic="bench", partition=0).to_header()
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    sent = acked = 0

    # A window of WINDOW puts in flight, refilled from the reply callbacks: no task or
    # coroutine per put, so the client process measures the broker rather than itself.
    def send_one() -> None:
        nonlocal sent
        sent += 1
        t0 = time.perf_counter()
        conn.send(header, payload).add_done_callback(lambda f: on_reply(f, t0))

    def on_reply(future: asyncio.Future, t0: float) -> None:
        nonlocal acked, failures
        latencies.append(time.perf_counter() - t0)
        acked += 1
        if future.cancelled() or future.exception() is not None or future.result().code != 200:
            failures += 1
            if failures == 1:
                error = None if future.cancelled() else future.exception()
                print(f"first failed put: {error or future.result().header}", file=sys.stderr)
        if sent < puts:
            send_one()
        elif acked == puts and not finished.done():
            finished.set_result(None)

    # The port opens before the broker takes writes (503 "starting"): one untimed
    # warm-up put that succeeds (the fetch below then reads one message more).
    for _ in range(100):
        if (await conn.request(header, payload)).code == 200:
            break
        await asyncio.sleep(0.05)
    start = time.perf_counter()
    for _ in range(min(WINDOW, puts)):
        send_one()
    await finished
    elapsed = time.perf_counter() - start
    conn.close()
    if failures:
        raise RuntimeError(f"{failures} puts failed")
    latencies.sort()
    return {
        "msgs_per_s": puts * batch / elapsed,
        "mb_per_s": puts * len(payload) / elapsed / 1e6,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


async def fetch(port: int, expected: int, decode: bool, connect: Connect = plain_connection) -> dict[str, float]:
    conn = await connect(port)
    # Consumers read up to the committed offset; with interval flushing the last puts
    # are committed by the next periodic flush. Wait for that outside the timed part,
    # so the figure is fetch throughput, not unflushInterval.
    while True:
        probe = await conn.request(GetRequest(topic="bench", partition=0, offset=0, max_size=1).to_header())
        if probe.get("committed") == probe.get("log_end"):
            break
        await asyncio.sleep(0.05)
    start = time.perf_counter()
    nbytes = await fetch_sequentially(conn, "bench", expected, decode)
    elapsed = time.perf_counter() - start
    conn.close()
    return {"msgs_per_s": expected / elapsed, "mb_per_s": nbytes / elapsed / 1e6}


def message_count(description: str | None) -> int:
    """``--messages N`` (default 200,000) or ``--quick`` (20,000) from the command line."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="20,000 messages per case (a smoke run)")
    args = parser.parse_args()
    return 20_000 if args.quick else args.messages


def main() -> None:
    messages = message_count(__doc__)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run

    results: dict[tuple[str, int, int], dict[str, float]] = {}
    fetches: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="metaq-bench-") as tmp:
        for mode, threshold in (("interval", 1000), ("group-commit", 0)):
            for size in (100, 1024):
                for batch in (1, 100):
                    count = messages if batch > 1 else max(messages // 10, 1000)
                    with BrokerUnderTest(Path(tmp), threshold) as broker:
                        results[(mode, size, batch)] = runner(produce(broker.port, count, size, batch))
                        if batch > 1:
                            fetches[(mode, size)] = {
                                "raw": runner(fetch(broker.port, count, decode=False)),
                                "decoded": runner(fetch(broker.port, count, decode=True)),
                            }
    print(f"produce ({messages} messages per batched case, 1/10 of that unbatched; window {WINDOW} puts in flight)")
    print(f"{'flush':<13}{'size':>6}{'batch':>7}{'msgs/s':>12}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for (mode, size, batch), r in results.items():
        print(f"{mode:<13}{size:>6}{batch:>7}{r['msgs_per_s']:>12,.0f}{r['mb_per_s']:>9.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}")
    print("\nfetch (1 MiB fetches, one connection)")
    print(f"{'flush':<13}{'size':>6}{'raw msgs/s':>14}{'raw MB/s':>10}{'decoded msgs/s':>16}")
    for (mode, size), r in fetches.items():
        print(f"{mode:<13}{size:>6}{r['raw']['msgs_per_s']:>14,.0f}{r['raw']['mb_per_s']:>10.1f}{r['decoded']['msgs_per_s']:>16,.0f}")
    print("\nratios (same run)")
    for size in (100, 1024):
        gc, iv = results[("group-commit", size, 100)], results[("interval", size, 100)]
        print(f"  group commit / interval flushing, {size} B, batch 100: {gc['msgs_per_s'] / iv['msgs_per_s']:.2f}")
        b1, b100 = results[("interval", size, 1)], results[("interval", size, 100)]
        print(f"  batch 100 / batch 1, {size} B, interval flushing:     {b100['msgs_per_s'] / b1['msgs_per_s']:.1f}")


if __name__ == "__main__":
    main()
