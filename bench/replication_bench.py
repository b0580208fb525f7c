"""Async replication benchmark: the cost of an attached slave, and replication lag.

    python bench/replication_bench.py [--messages N] [--rounds R] [--rate MSGS_PER_S] [--seconds S]

Starts an embedded ZooKeeper, one master and one slave (real `metaq broker`
processes, default flush settings, slaveMaxDelayInMills=500), then:

1. **Throughput, side by side.** Alternating rounds of N messages (100 B, batches
   of 100, 32 puts in flight on one connection) with the slave stopped ("alone")
   and with the slave running and caught up ("with slave"); each "with slave"
   round starts only after the slave caught up with the previous rounds, so
   catch-up copying is not counted. Reports each side's median msgs/s and the ratio.
2. **Replication lag under a steady load.** Produces at a fixed rate (default
   20,000 msgs/s as batches of 100 every 5 ms) for S seconds, while a watcher in
   the same process polls the slave's log end every 2 ms (``stats {topic}``,
   ``max_offset``; resolution ~2-3 ms). Lag of a put = time the slave's log end first covers
   the put's end offset minus the time its ack arrived (same clock). Reports
   p50/p99/max.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client.connection import BrokerConnection  # noqa: E402
from metaq.protocol.messages import PutRequest  # noqa: E402
from metaq.protocol.replies import PutReply, ReplyError, fetch_stats  # noqa: E402
from metaq.tools.launcher import BrokerFactory, wait_until  # noqa: E402
from metaq.record import encode_batch  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402

TOPIC = "bench"
PUT = PutRequest(topic=TOPIC, partition=0).to_header()
WINDOW = 32
SIZE = 100
BATCH = 100


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def put_retrying(conn: BrokerConnection, body: bytes) -> object:
    while True:
        reply = await conn.request(PUT, body, timeout=30)
        if reply.code != 503:
            if not reply.ok:
                raise RuntimeError(f"put failed: {reply.code} {reply.message}")
            return reply
        await asyncio.sleep(0.05)


async def produce_round(address: tuple[str, int], messages: int) -> float:
    conn = await BrokerConnection.open(*address)
    body = encode_batch([(b"x" * SIZE, None)] * BATCH)
    await put_retrying(conn, body)  # warm the connection
    try:
        puts = messages // BATCH
        started = time.perf_counter()
        in_flight: set[asyncio.Future] = set()
        for _ in range(puts):
            if len(in_flight) >= WINDOW:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    if not future.result().ok:
                        raise RuntimeError(future.result().message)
            in_flight.add(conn.send(PUT, body))
        for future in asyncio.as_completed(in_flight):
            reply = await future
            if not reply.ok:
                raise RuntimeError(reply.message)
        return puts * BATCH / (time.perf_counter() - started)
    finally:
        conn.close()


async def log_end(address: tuple[str, int]) -> int:
    conn = await BrokerConnection.open(*address)
    try:
        row = (await fetch_stats(conn, TOPIC)).row(f"{TOPIC}-0-0")
    finally:
        conn.close()
    return -1 if row is None else int(row["max_offset"])


def caught_up(master, slave) -> None:  # noqa: ANN001
    def same() -> bool:
        return asyncio.run(log_end(master.address)) == asyncio.run(log_end(slave.address))

    wait_until(same, 120, interval=0.1, message="the slave to catch up")


async def lag_run(master_addr: tuple[str, int], slave_addr: tuple[str, int], rate: int, seconds: float) -> dict:
    producer = await BrokerConnection.open(*master_addr)
    watcher = await BrokerConnection.open(*slave_addr)
    body = encode_batch([(b"l" * SIZE, None)] * BATCH)
    acks: list[tuple[int, float]] = []  # (end offset, ack time), in offset order
    covered: list[float] = []
    stop = asyncio.Event()
    start_offset = await log_end(slave_addr)

    async def watch() -> None:
        offset = start_offset
        index = 0
        while not (stop.is_set() and index >= len(acks)):
            # The slave's log end, from its stats (slaves refuse replica fetches): polled every 2 ms.
            row = (await fetch_stats(watcher, TOPIC, timeout=10)).row(f"{TOPIC}-0-0")
            now = time.perf_counter()
            if row is not None:
                offset = int(row["max_offset"])
            await asyncio.sleep(0.002)
            while index < len(acks) and acks[index][0] <= offset:
                covered.append(now - acks[index][1])
                index += 1
            if stop.is_set() and index < len(acks) and now - acks[-1][1] > 10:
                break

    watcher_task = asyncio.ensure_future(watch())
    interval = BATCH / rate
    pending: set[asyncio.Future] = set()
    started = time.perf_counter()
    sent = 0
    deadline = started + seconds

    def acked(future: asyncio.Future) -> None:
        try:
            acks.append((PutReply.of(future.result()).end_offset, time.perf_counter()))
        except ReplyError:
            pass  # a refused put is no ack

    while time.perf_counter() < deadline:
        future = producer.send(PUT, body)
        future.add_done_callback(acked)
        pending.add(future)
        sent += 1
        next_at = started + sent * interval
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        pending = {f for f in pending if not f.done()}
    await asyncio.gather(*pending)
    achieved = sent * BATCH / (time.perf_counter() - started)
    acks.sort()
    stop.set()
    await asyncio.wait_for(watcher_task, 60)
    producer.close()
    watcher.close()
    millis = [max(0.0, v) * 1000 for v in covered]
    return {
        "rate": achieved,
        "puts": len(acks),
        "p50": percentile(millis, 50),
        "p99": percentile(millis, 99),
        "max": max(millis),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000, help="messages per throughput round (default 200000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side (default 3)")
    parser.add_argument("--rate", type=int, default=20_000, help="msgs/s for the lag run (default 20000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the lag run (default 10)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="metaq-repl-bench-"))
    zk = EmbeddedZooKeeper(data_dir=tmp / "zk", tick_ms=200)
    zk.start()
    factory = BrokerFactory(tmp, zk.connect_string, "/meta")
    try:
        master = factory(0, {TOPIC: 1}, system={"autoFailover": False})
        slave = factory(0, {TOPIC: 1}, system={"autoFailover": False}, slave_props={"slaveId": 0, "slaveMaxDelayInMills": 500})
        alone: list[float] = []
        with_slave: list[float] = []
        for round_ in range(args.rounds):
            for side in ("alone", "with slave"):
                if side == "alone":
                    slave.stop()
                else:
                    slave.start()
                    caught_up(master, slave)
                rate = asyncio.run(produce_round(master.address, args.messages))
                (alone if side == "alone" else with_slave).append(rate)
                print(f"round {round_ + 1} {side:>10}: {rate:>10,.0f} msgs/s", flush=True)
        m_alone, m_with = statistics.median(alone), statistics.median(with_slave)
        print(f"median alone {m_alone:,.0f} msgs/s, with slave {m_with:,.0f} msgs/s, ratio {m_with / m_alone:.2f}x")

        caught_up(master, slave)
        lag = asyncio.run(lag_run(master.address, slave.address, args.rate, args.seconds))
        print(
            f"lag at {lag['rate']:,.0f} msgs/s for {args.seconds:.0f} s ({lag['puts']} puts): "
            f"p50 {lag['p50']:.2f} ms, p99 {lag['p99']:.2f} ms, max {lag['max']:.2f} ms (slaveMaxDelayInMills=500)"
        )
    finally:
        factory.stop_all()
        zk.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
