"""How long a new consumer-group member waits for its first message.

    python bench/group_join.py                  # groups of 1, 3 and 10; 3 rounds each
    python bench/group_join.py --members 1 3 --rounds 5
    python bench/group_join.py --default-flush  # the broker's default flush policy

Starts an embedded ZooKeeper and one broker (a topic of 12 partitions, group commit, so
that a message is readable once acked), and keeps a
producer writing one message to every partition every 20 ms, so that every partition
always has something new. For a group of N members, N - 1 members join first and
settle (each owns its share and has received a message); then the timed member is
created and the clock runs from its ``complete_subscribe()`` to the first message its
listener receives. That covers registering in the group, the others' rebalance (they
commit and release what the newcomer takes), the newcomer's claims (which wait for the
previous owners' release), loading its stored offsets, and its first fetch. All members
share one client (one ZooKeeper session), each with its own consumer id.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from metaq.client import AsyncMessageSessionFactory, ConsumerConfig, Message, MetaClientConfig  # noqa: E402
from metaq.tools.launcher import BrokerProcess  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402

TOPIC = "join"
PARTITIONS = 12
PRODUCE_EVERY_S = 0.02


async def keep_producing(factory: AsyncMessageSessionFactory, stop: asyncio.Event, flowing: asyncio.Event) -> None:
    """One message per partition every PRODUCE_EVERY_S (the default selector goes round-robin)."""
    async with factory.create_producer() as producer:
        await producer.publish(TOPIC)
        while not stop.is_set():
            results = await asyncio.gather(*(producer.send_message(Message(TOPIC, b"x" * 100)) for _ in range(PARTITIONS)))
            if all(result.success for result in results):
                flowing.set()
            await asyncio.sleep(PRODUCE_EVERY_S)


async def join_time(factory: AsyncMessageSessionFactory, members: int, group: str, work: Path) -> float:
    """Seconds from the newest member's complete_subscribe() to its first message."""

    def config(index: int) -> ConsumerConfig:
        return ConsumerConfig(group=group, consumer_id=f"m{index}", consume_from_max_offset=True,
                              offset_store_path=str(work / f"{group}.json"), recover_dir=str(work / "recover"))

    settled: list[asyncio.Event] = []
    consumers = []
    try:
        for index in range(members - 1):
            got_one = asyncio.Event()
            settled.append(got_one)
            consumer = factory.create_consumer(config(index)).subscribe(TOPIC, listener=lambda m, e=got_one: e.set())
            consumers.append(consumer)
            await consumer.complete_subscribe()
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in settled)), 120)
        first = asyncio.get_running_loop().create_future()

        def on_message(message: Message) -> None:
            if not first.done():
                first.set_result(time.perf_counter())

        newcomer = factory.create_consumer(config(members - 1)).subscribe(TOPIC, listener=on_message)
        consumers.append(newcomer)
        started = time.perf_counter()
        await newcomer.complete_subscribe()
        return await asyncio.wait_for(first, 120) - started
    finally:
        for consumer in reversed(consumers):
            await consumer.shutdown()


async def run(zk_connect: str, sizes: list[int], rounds: int, work: Path) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {}
    async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect=zk_connect)) as factory:
        stop, flowing = asyncio.Event(), asyncio.Event()
        producing = asyncio.create_task(keep_producing(factory, stop, flowing))
        try:
            await asyncio.wait_for(flowing.wait(), 120)  # the broker takes writes: every partition gets news
            for round_no in range(rounds):
                for members in sizes:
                    seconds = await join_time(factory, members, f"join{members}r{round_no}", work)
                    times.setdefault(members, []).append(seconds)
                    print(f"  {members:>2} members, round {round_no + 1}: {seconds * 1000:,.0f} ms", file=sys.stderr, flush=True)
        finally:
            stop.set()
            await producing
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--default-flush", action="store_true",
                        help="the broker's default flush policy instead of group commit (readers wait for the flush)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="metaq-join-"))
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    broker = None
    try:
        zk.start()
        # Group commit: a put is readable once acked. With the default flush policy a reader sees a
        # quiet partition's news only after unflushInterval (10 s), which would hide the join.
        system = {} if args.default_flush else {"unflushThreshold": 0}
        broker = BrokerProcess(work, zk.connect_string, 0, {TOPIC: PARTITIONS}, system)
        broker.start()
        times = asyncio.run(run(zk.connect_string, args.members, args.rounds, work))
    finally:
        if broker is not None:
            broker.stop()
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    flush = "default flush policy" if args.default_flush else "group commit"
    print(f"a topic of {PARTITIONS} partitions, one broker ({flush}); {args.rounds} rounds; "
          "complete_subscribe() to the first message")
    print()
    print("| members (with the newcomer) | median ms | max ms |")
    print("|---:|---:|---:|")
    for members, seconds in times.items():
        print(f"| {members} | {statistics.median(seconds) * 1000:,.0f} | {max(seconds) * 1000:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
