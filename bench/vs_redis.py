"""metaq-py vs Redis Streams, side by side in one run, on the paths client users take.

    python bench/vs_redis.py                    # 3 rounds, ~3 min
    python bench/vs_redis.py --rounds 1 --scale 0.2   # a smoke run

Starts, on loopback, by pid:

* an embedded ZooKeeper and two metaq broker pairs (master + one slave, default flush
  policy, topic ``bench`` with one partition): group 0 replicates async, group 1 sync
  (``minSyncSlaves=1``);
* ``redis-server`` (Debian's package) as a master and a replica, ``appendonly yes``,
  ``appendfsync everysec``; messages are stream entries ``XADD key * d <data>``.

One Python client process (this one) drives both, 100-byte messages, with the client
APIs an application uses (redis-py with hiredis; metaq's blocking facade, and asyncio for
the per-message async sends). Every workload runs ``--rounds`` times, alternating which
system goes first; the table shows medians, the ratio metaq / Redis of the medians, and
the median of each round's ratio (both systems measured back to back):

* batches of 100, one in flight: ``send_batch`` vs a pipeline of 100 ``XADD``
  (sync replication: + ``WAIT 1``);
* per-message ``send_message_async`` with 1,000 outstanding (Redis has no counterpart);
* blocking per-message ``send_message`` vs ``XADD`` (+ ``WAIT 1``) per message, with each
  send's latency (a second table: p50 and p99 per round, medians over the rounds);
* consuming everything back from the slave / the replica: a consumer iterating the
  messages (``for message in consumer``) and one with a batch listener, vs ``XREAD
  COUNT 1000`` on the replica.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from metaq.client import (  # noqa: E402
    AsyncMessageSessionFactory,
    ConsumerConfig,
    Message,
    MessageSessionFactory,
    MetaClientConfig,
    NoPartitionAvailable,
    Partition,
)
from metaq.client.connection import BrokerConnection  # noqa: E402
from metaq.protocol.messages import OffsetRequest  # noqa: E402
from metaq.record import HEADER_SIZE  # noqa: E402
from metaq.tools.launcher import BrokerProcess, wait_until  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper, free_port  # noqa: E402

TOPIC = "bench"
CONSUME_TOPIC = "consume"
READERS = ("iterator", "batch listener", "listener per message")


def consume_row(reader: str) -> str:
    return f"consume all from the slave: {reader} vs XREAD COUNT 1000"


# --- Redis ---------------------------------------------------------------------------------


class RedisPair:
    """A redis-server master and replica (AOF, fsync every second), stopped by pid."""

    def __init__(self, work: Path) -> None:
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server not found: apt-get install -y redis-server")
        self.work = work
        self.master_port, self.replica_port = free_port(), free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, port: int, *extra: str) -> None:
        directory = self.work / name
        directory.mkdir(parents=True, exist_ok=True)
        log = open(directory / "redis.log", "wb")
        self.processes.append(subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no", *extra],
            stdout=log, stderr=subprocess.STDOUT,
        ))

    def start(self) -> "RedisPair":
        import redis

        self._start("redis-master", self.master_port)
        self._start("redis-replica", self.replica_port, "--replicaof", "127.0.0.1", str(self.master_port))
        self.master = redis.Redis(port=self.master_port)
        self.replica = redis.Redis(port=self.replica_port)

        def linked() -> bool:
            try:
                return self.master.info("replication").get("connected_slaves", 0) >= 1
            except redis.ConnectionError:
                return False

        wait_until(linked, 30, interval=0.1, message="redis replica connected")
        # The replica's first acknowledgement comes after its initial sync (seconds): not a WAIT to time.
        self.master.set("warm-up", b"1")
        self.master.execute_command("WAIT", 1, 0)
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def redis_batches(r, key: str, n: int, payload: bytes, wait: bool) -> float:
    started = time.perf_counter()
    for _ in range(n // 100):
        pipe = r.pipeline(transaction=False)
        for _ in range(100):
            pipe.xadd(key, {"d": payload})
        if wait:
            pipe.execute_command("WAIT", 1, 0)
        pipe.execute()
    return (n // 100 * 100) / (time.perf_counter() - started)


def redis_per_message(r, key: str, seconds: float, payload: bytes, wait: bool) -> Measured:
    def send() -> None:
        r.xadd(key, {"d": payload})
        if wait:
            r.execute_command("WAIT", 1, 0)

    return timed_one_by_one(send, seconds)


class Measured(NamedTuple):
    """A rate and, for one-at-a-time sends, each send's latency in seconds."""

    rate: float
    latencies: list[float]


def timed_one_by_one(send: Callable[[], None], seconds: float) -> Measured:
    """Call ``send`` back to back for ``seconds``: the rate, and every call's own duration."""
    latencies: list[float] = []
    clock = time.perf_counter
    started = now = clock()
    deadline = started + seconds
    while now < deadline:
        send()
        done = clock()
        latencies.append(done - now)
        now = done
    return Measured(len(latencies) / (now - started), latencies)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Clock:
    """Times a read from its first batch on, so that neither side's start-up (a consumer
    joining its group, the first round trip) counts: messages after the first batch / time."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.counted = 0

    def batch(self, size: int) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        else:
            self.counted += size

    def rate(self) -> float:
        assert self.started is not None
        return self.counted / (time.perf_counter() - self.started)


def redis_consume(replica, key: str, n: int) -> float:
    got, last = 0, "0"
    clock = Clock()
    while got < n:
        reply = replica.xread({key: last}, count=1000)
        if not reply:
            continue
        entries = reply[0][1]
        for _entry_id, fields in entries:
            fields[b"d"]  # what a reader looks at
        clock.batch(len(entries))
        got += len(entries)
        last = entries[-1][0]
    return clock.rate()


# --- metaq ---------------------------------------------------------------------------------


class MetaqPairs:
    def __init__(self, work: Path, command_prefix: list[str] | None = None, replication_stream: bool = False) -> None:
        self.work = work
        #: The sync master pushes puts to its caught-up slave (``replicationStream=true``).
        self.replication_stream = replication_stream
        self.zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
        self.processes: list[BrokerProcess] = []
        #: Run each broker through this (``bench/put_calls.py``: under cProfile).
        self.command_prefix = command_prefix or []

    def start(self) -> "MetaqPairs":
        self.zk.start()
        topics = {TOPIC: 1, CONSUME_TOPIC: 1}
        for broker_id, mode in ((0, "async"), (1, "sync")):
            system = {"replicationMode": mode}
            if mode == "sync":
                system.update(minSyncSlaves=1, onSyncSlaveLoss="reject")
                if self.replication_stream:
                    system["replicationStream"] = "true"
            master = BrokerProcess(self.work, self.zk.connect_string, broker_id, topics, system,
                                   command_prefix=self.command_prefix)
            slave = BrokerProcess(self.work, self.zk.connect_string, broker_id, topics, {}, {"slaveId": 0},
                                  command_prefix=self.command_prefix)
            self.processes += [master, slave]
            master.start()
            slave.start()
        return self

    def config(self) -> MetaClientConfig:
        return MetaClientConfig(zk_connect=self.zk.connect_string)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.zk.stop()


def with_selector(broker_id: int):
    """A selector that sends to partition 0 of one broker group (async or sync)."""

    wanted = Partition(broker_id, 0)

    class OneGroup:
        per_message = False

        def select(self, topic, partitions, message):
            if wanted not in partitions:
                raise NoPartitionAvailable(f"{wanted} has no master")
            return wanted

    return OneGroup()


def metaq_batches(factory: MessageSessionFactory, broker_id: int, n: int, payload: bytes) -> float:
    with factory.create_producer(with_selector(broker_id)) as producer:
        producer.publish(TOPIC)
        started = time.perf_counter()
        for _ in range(n // 100):
            results = producer.send_batch([Message(TOPIC, payload) for _ in range(100)])
            assert results[-1].success, results[-1]
        return (n // 100 * 100) / (time.perf_counter() - started)


def metaq_per_message(factory: MessageSessionFactory, broker_id: int, seconds: float, payload: bytes) -> Measured:
    with factory.create_producer(with_selector(broker_id)) as producer:
        producer.publish(TOPIC)

        def send() -> None:
            result = producer.send_message(Message(TOPIC, payload))
            assert result.success, result

        return timed_one_by_one(send, seconds)


async def metaq_async_per_message(config: MetaClientConfig, broker_id: int, n: int, payload: bytes, outstanding: int) -> float:
    """``send_message_async`` per message, refilling a window of ``outstanding`` from result callbacks."""
    async with AsyncMessageSessionFactory(config) as factory:
        async with factory.create_producer(with_selector(broker_id)) as producer:
            await producer.publish(TOPIC)
            done = asyncio.get_running_loop().create_future()
            sent = acked = 0

            def on_result(result) -> None:
                nonlocal acked
                if not result.success:
                    if not done.done():
                        done.set_exception(RuntimeError(result.error_message))
                    return
                acked += 1
                if acked == n:
                    done.set_result(None)
                else:
                    send_one()

            def send_one() -> None:
                nonlocal sent
                if sent < n:
                    sent += 1
                    producer.send_message_async(Message(TOPIC, payload), on_result)

            started = time.perf_counter()
            for _ in range(outstanding):
                send_one()
            await done
            return n / (time.perf_counter() - started)


def slave_config(group: str, work: Path) -> ConsumerConfig:
    return ConsumerConfig(group=group, read_from="slave", fetch_size=1 << 20,
                          offset_store_path=str(work / f"{group}.json"), recover_dir=str(work / "recover"))


def metaq_consume_iterating(factory: MessageSessionFactory, n: int, group: str, work: Path) -> float:
    """``for message in consumer``: what an application loop writes."""
    clock = Clock()
    with factory.create_consumer(slave_config(group, work)).subscribe(CONSUME_TOPIC) as consumer:
        first = consumer.getmany()  # the clock starts after the first fetch, as for Redis
        clock.batch(len(first))
        got = len(first)
        for message in consumer:
            message.data  # what a reader looks at
            got += 1
            if got >= n:
                break
        clock.counted = got - len(first)
        return clock.rate()


def metaq_consume_listening(factory: MessageSessionFactory, n: int, group: str, work: Path, batches: bool) -> float:
    """A listener per message (MetaQ's API) or per fetch (``batch_listener``)."""
    finished = threading.Event()
    clock = Clock()
    got = 0

    def on_batch(messages: list[Message]) -> None:
        nonlocal got
        for message in messages:
            message.data
        clock.batch(len(messages))
        got += len(messages)
        if got >= n:
            finished.set()

    def on_message(message: Message) -> None:
        nonlocal got
        message.data
        got += 1
        if got == 1 or got % 1000 == 0:
            clock.batch(1 if got == 1 else 1000)
        if got >= n:
            finished.set()

    consumer = factory.create_consumer(slave_config(group, work))
    if batches:
        consumer.subscribe(CONSUME_TOPIC, batch_listener=on_batch)
    else:
        consumer.subscribe(CONSUME_TOPIC, listener=on_message)
    with consumer:
        finished.wait(300)
        return clock.rate()


# --- the run -------------------------------------------------------------------------------


def fill_for_consuming(factory: MessageSessionFactory, redis_pair: RedisPair, n: int, payload: bytes) -> None:
    producer = factory.create_producer(with_selector(0))
    end = 0
    for start in range(0, n, 1000):
        results = producer.send_batch([Message(CONSUME_TOPIC, payload) for _ in range(min(1000, n - start))])
        assert all(results)
        end = results[-1].offset + HEADER_SIZE + len(payload)
    producer.close()
    # Readers are served what the slave has flushed (its default policy flushes every 1,000
    # messages or 10 s): wait for all of it, or the first read would wait out the flush.
    wait_until(lambda: asyncio.run(slave_readable_end(factory.aio.cluster.snapshot.brokers[0])) >= end, 120,
               interval=0.5, message="the slave to serve all the messages to consume")
    for start in range(0, n, 1000):
        pipe = redis_pair.master.pipeline(transaction=False)
        for _ in range(min(1000, n - start)):
            pipe.xadd(CONSUME_TOPIC, {"d": payload})
        pipe.execute()
    redis_pair.master.execute_command("WAIT", 1, 0)


async def slave_readable_end(broker) -> int:
    """How far a consumer of the slave of ``broker`` (a group's addresses) may read the topic."""
    host, port = broker.slaves[0][1].removeprefix("meta://").rsplit(":", 1)
    conn = await BrokerConnection.open(host, int(port))
    try:
        reply = await conn.request(OffsetRequest(topic=CONSUME_TOPIC, partition=0, offset=0).to_header())
        return int(reply["max_offset"])
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts and durations (default 1)")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--only", help="run only the workloads whose name contains this text")
    parser.add_argument("--replication-stream", action="store_true",
                        help="the sync master pushes puts to its slave (replicationStream=true)")
    args = parser.parse_args(argv)
    payload = b"x" * args.size
    batched_n = int(100_000 * args.scale)
    async_n = int(200_000 * args.scale)
    seconds = 3.0 * args.scale
    consume_n = int(300_000 * args.scale)

    work = Path(tempfile.mkdtemp(prefix="metaq-vs-redis-"))
    metaq = MetaqPairs(work, replication_stream=args.replication_stream)
    redis_pair = RedisPair(work)
    rows: dict[str, dict[str, list[float]]] = {}
    # Per workload and system, each round's (p50, p99) send latency in seconds.
    latency_rows: dict[str, dict[str, list[tuple[float, float]]]] = {}

    def record(name: str, system: str, measured: float | Measured) -> None:
        rate = measured.rate if isinstance(measured, Measured) else measured
        rows.setdefault(name, {}).setdefault(system, []).append(rate)
        line = f"  {name:<58} {system:<6} {rate:>12,.0f} msgs/s"
        if isinstance(measured, Measured):
            p50, p99 = percentile(measured.latencies, 0.50), percentile(measured.latencies, 0.99)
            latency_rows.setdefault(name, {}).setdefault(system, []).append((p50, p99))
            line += f"  p50 {p50 * 1000:.3f} ms  p99 {p99 * 1000:.3f} ms"
        print(line, file=sys.stderr, flush=True)

    try:
        metaq.start()
        redis_pair.start()
        with MessageSessionFactory(metaq.config()) as factory:
            if not args.only or any(args.only in consume_row(label) for label in READERS):
                fill_for_consuming(factory, redis_pair, consume_n, payload)
            for round_no in range(args.rounds):
                metaq_first = round_no % 2 == 0
                workloads: list[tuple[str, Callable[[], float] | None, Callable[[], float] | None]] = []
                replications = (("async", 0, False), ("sync", 1, True))  # metaq group, Redis WAIT 1
                for mode, group_id, wait in replications:
                    workloads.append((f"batches of 100, one in flight, {mode} replication",
                                      partial(metaq_batches, factory, group_id, batched_n, payload),
                                      partial(redis_batches, redis_pair.master, f"s-{mode}", batched_n, payload, wait)))
                workloads.append(("per-message send_message_async, 1,000 outstanding",
                                  lambda: asyncio.run(metaq_async_per_message(metaq.config(), 0, async_n, payload, 1000)),
                                  None))
                for mode, group_id, wait in replications:
                    workloads.append((f"blocking per-message send, {mode} replication",
                                      partial(metaq_per_message, factory, group_id, seconds, payload),
                                      partial(redis_per_message, redis_pair.master, f"p-{mode}", seconds, payload, wait)))
                readers = (
                    partial(metaq_consume_iterating, factory, consume_n, f"it{round_no}", work),
                    partial(metaq_consume_listening, factory, consume_n, f"bl{round_no}", work, True),
                    partial(metaq_consume_listening, factory, consume_n, f"ml{round_no}", work, False),
                )
                for label, read in zip(READERS, readers):
                    workloads.append((consume_row(label), read,
                                      partial(redis_consume, redis_pair.replica, CONSUME_TOPIC, consume_n)))
                for name, run_metaq, run_redis in workloads:
                    if args.only and args.only not in name:
                        continue
                    order = [("metaq", run_metaq), ("redis", run_redis)]
                    for system, run in order if metaq_first else reversed(order):
                        if run is not None:
                            record(name, system, run())
    finally:
        redis_pair.stop()
        metaq.stop()
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{args.size} B messages, {args.rounds} alternating rounds, medians; one client process; "
          "metaq: master + slave, default flush; Redis: master + replica, appendfsync everysec")
    print()
    print("| workload | metaq-py msgs/s | Redis Streams msgs/s | ratio of medians | median of round ratios |")
    print("|---|---:|---:|---:|---:|")
    for name, systems in rows.items():
        m = statistics.median(systems["metaq"])
        if "redis" in systems:
            r = statistics.median(systems["redis"])
            # Each round runs both back to back: its ratio is less exposed to the machine's drift.
            paired = statistics.median(a / b for a, b in zip(systems["metaq"], systems["redis"]))
            print(f"| {name} | {m:,.0f} | {r:,.0f} | {m / r:.2f}x | {paired:.2f}x |")
        else:
            print(f"| {name} | {m:,.0f} | n/a | - | - |")
    if latency_rows:
        print()
        print("Latency of one blocking send (ms; medians of the rounds' p50 and p99; ratio: metaq / Redis, "
              "median of the rounds' ratios, below 1 is faster)")
        print()
        print("| workload | metaq-py p50 | p99 | Redis p50 | p99 | p50 ratio | p99 ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, by_system in latency_rows.items():
            metaq_rounds, redis_rounds = by_system.get("metaq", []), by_system.get("redis", [])
            cells = []
            for rounds in (metaq_rounds, redis_rounds):
                cells += [f"{statistics.median(r[i] for r in rounds) * 1000:.3f}" if rounds else "-" for i in (0, 1)]
            for i in (0, 1):
                pairs = [a[i] / b[i] for a, b in zip(metaq_rounds, redis_rounds)]
                cells.append(f"{statistics.median(pairs):.2f}x" if pairs else "-")
            print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
