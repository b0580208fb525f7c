"""A group member whose listener always fails on b"poison", for the kill -9 test.

    python -m tests.integration.retry_consumer_main ZK ZK_ROOT TOPIC GROUP DELAY_S

Prints ``deliver<TAB>offset<TAB>data`` per delivery and ``retried<TAB>N`` whenever a failed
message was stored in the group's retry topic (flushed at once: what a killed process
printed happened), and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from metaq.client import AsyncMessageSessionFactory, ConsumerConfig, Message, MetaClientConfig


async def main(zk: str, zk_root: str, topic: str, group: str, delay_s: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    def listener(message: Message) -> None:
        print(f"deliver\t{message.offset}\t{message.data.decode()}", flush=True)
        if message.data == b"poison":
            raise RuntimeError("this member cannot handle it")

    config = MetaClientConfig(zk_connect=zk, zk_root=zk_root, zk_session_timeout_ms=4000)
    async with AsyncMessageSessionFactory(config) as factory:
        consumer = factory.create_consumer(ConsumerConfig(
            group=group, commit_interval_s=0.2, fetch_wait_ms=200, retry_delays_s=(float(delay_s),),
        ))
        consumer.subscribe(topic, listener=listener)
        await consumer.complete_subscribe()
        reported = 0
        while not stop.is_set():
            if consumer.stats.retried != reported:
                reported = consumer.stats.retried
                print(f"retried\t{reported}", flush=True)
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
