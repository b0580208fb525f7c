"""A consumer process keeping its offsets in SQL, for the kill -9 test.

    python -m tests.integration.sql_consumer_main ZK ZK_ROOT TOPIC GROUP OFFSET_URL

Prints ``partition<TAB>offset<TAB>data`` per message (flushed at once, so what a killed
process printed is what it consumed) and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from metaq.client import AsyncMessageSessionFactory, ConsumerConfig, Message, MetaClientConfig

#: Per-message work, so that a kill lands mid-stream.
DELAY_S = 0.004


async def main(zk: str, zk_root: str, topic: str, group: str, url: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def listener(message: Message) -> None:
        print(f"{message.partition}\t{message.offset}\t{message.data.decode()}", flush=True)
        await asyncio.sleep(DELAY_S)

    config = MetaClientConfig(zk_connect=zk, zk_root=zk_root, zk_session_timeout_ms=4000)
    async with AsyncMessageSessionFactory(config) as factory:
        consumer = factory.create_consumer(ConsumerConfig(
            group=group, offset_store_url=url, commit_interval_s=0.3, fetch_size=4096,
        ))
        consumer.subscribe(topic, listener=listener)
        await consumer.complete_subscribe()
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
