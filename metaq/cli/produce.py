"""``metaq produce --zk Z --topic T [--count N --size B] [--sync]``: messages to a topic.

A topic no broker group has is an error naming it (exit 1) before anything is sent.
Without ``--count`` every stdin line (newline stripped) is one message. By default
messages go out in batches with several puts in flight; ``--sync`` sends one message
at a time and waits for each acknowledgement. Ends with a summary on stdout; exit code
1 if any message was not stored.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from typing import Any, AsyncIterator

from ..errors import MetaqError
from . import numbers
from .login import add_login_arguments, credentials, zk_connect_arg, zk_root_arg
from .progress import Progress

MAX_ERRORS_SHOWN = 5


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("produce", help="send stdin lines (or N generated messages) to a topic")
    add_zk_arguments(parser)
    parser.add_argument("--topic", required=True, help="the topic to send to")
    parser.add_argument("--count", type=numbers.positive_int, help="send N generated messages instead of reading stdin")
    parser.add_argument("--size", type=numbers.positive_int, default=100, help="bytes per generated message (default 100)")
    parser.add_argument("--sync", action="store_true", help="one message at a time, each acknowledged before the next")
    parser.add_argument("--batch", type=numbers.positive_int, default=1000, help="messages per batch when not --sync (default 1000)")
    parser.add_argument("--in-flight", type=numbers.positive_int, default=4, help="batches in flight when not --sync (default 4)")
    parser.add_argument("--attribute", help="attribute string stored with every message")
    parser.add_argument("--send-timeout", type=numbers.positive, default=15.0, help="seconds a send may retry before it fails (default 15)")
    parser.add_argument("--quiet", action="store_true", help="no summary")
    parser.set_defaults(run=run)


def add_zk_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", type=zk_connect_arg, required=True, metavar="HOST:PORT[,...]", help="ZooKeeper connect string")
    parser.add_argument("--zk-root", type=zk_root_arg, default="/meta", help="ZooKeeper root of the cluster (default /meta)")
    parser.add_argument("--zk-session-timeout-ms", type=numbers.positive_int, default=30000, help=argparse.SUPPRESS)
    parser.add_argument("--zk-connect-timeout", type=numbers.positive, default=10.0, help="seconds to wait for ZooKeeper (default 10)")
    add_login_arguments(parser)


def client_config(args: argparse.Namespace, **settings):
    """The MetaClientConfig for --zk/--zk-root/...; kazoo's reconnect chatter stays out of the output."""
    import logging

    from ..client import MetaClientConfig

    if not getattr(args, "verbose", False):
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    return MetaClientConfig(
        zk_connect=args.zk, zk_root=args.zk_root, zk_session_timeout_ms=args.zk_session_timeout_ms,
        zk_connection_timeout_ms=math.ceil(args.zk_connect_timeout * 1000), credentials=credentials(args), **settings,
    )


def generated(count: int, size: int) -> list[bytes]:
    """N distinct messages of ``size`` bytes: a zero-padded sequence number, then filler."""
    return [f"{i:010d}".encode().ljust(size, b"x")[: max(size, 10)] for i in range(count)]


async def stdin_lines(batch: int) -> AsyncIterator[list[bytes]]:
    """Batches of stdin lines; line by line from a terminal, so each typed line goes out at once."""
    loop = asyncio.get_running_loop()
    interactive = sys.stdin.isatty()
    stream = sys.stdin.buffer

    def read_some() -> list[bytes]:
        lines = []
        while len(lines) < (1 if interactive else batch):
            line = stream.readline()
            if not line:
                break
            lines.append(line.rstrip(b"\r\n"))
        return lines

    while lines := await loop.run_in_executor(None, read_some):
        yield lines


async def require_topic(factory: Any, topic: str, zk_root: str, wait_option: str | None = None) -> None:
    """MetaqError naming ``topic`` unless some broker group has it (its topic configuration in
    ZooKeeper, or a broker's registration): a typo'd topic would otherwise be waited for
    until the sends time out, or, by a consumer, forever. A topic a group has but no master
    serves right now (a failover) is waited for as before."""
    from ..config import check_topic_name
    from ..zk.paths import ZkPaths
    from .admin import no_such_topic
    from .groups import topic_partitions

    try:
        check_topic_name(topic)
    except ValueError as exc:
        raise MetaqError(str(exc)) from None
    if not await factory.cluster.call(topic_partitions, factory.cluster.zk, ZkPaths(zk_root), topic):
        raise no_such_topic(topic, zk_root, wait_option)


async def produce(args: argparse.Namespace) -> int:
    from ..client import AsyncMessageSessionFactory, Message

    config = client_config(args, send_timeout_s=args.send_timeout)
    factory = await AsyncMessageSessionFactory(config).start()
    progress = Progress(f"producing to {args.topic}", total=args.count)
    sent = failed = unknown = 0
    errors: list[str] = []

    def account(results) -> None:
        nonlocal sent, failed, unknown
        for result in results:
            if result.success:
                sent += 1
            else:
                failed += 1
                unknown += result.outcome_unknown
                if len(errors) < MAX_ERRORS_SHOWN:
                    errors.append(result.error_message or "unknown error")
        progress.advance(len(results))

    try:
        await require_topic(factory, args.topic, args.zk_root)
        producer = factory.create_producer()
        await producer.publish(args.topic)
        if not factory.cluster.snapshot.writable_partitions(args.topic):
            print(f"metaq produce: warning: no master publishes topic {args.topic!r} yet; sends will wait and retry", file=sys.stderr)

        async def batches() -> AsyncIterator[list[bytes]]:
            if args.count is not None:
                data = generated(args.count, args.size)
                step = 1 if args.sync else args.batch
                for start in range(0, len(data), step):
                    yield data[start : start + step]
            else:
                async for lines in stdin_lines(1 if args.sync else args.batch):
                    yield lines

        in_flight: set[asyncio.Task] = set()
        async for chunk in batches():
            messages = [Message(args.topic, data, args.attribute) for data in chunk]
            if args.sync:
                for message in messages:
                    account([await producer.send_message(message)])
                continue
            task = asyncio.create_task(producer.send_batch(messages))
            task.add_done_callback(lambda t: account(t.result()))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            if len(in_flight) >= args.in_flight:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        if in_flight:
            await asyncio.wait(in_flight)
    finally:
        progress.close()
        await factory.shutdown()
    for error in errors:
        print(f"metaq produce: send failed: {error}", file=sys.stderr)
    if not args.quiet:
        total = sent + failed
        line = f"sent {sent} of {total} messages to {args.topic} in {progress.elapsed:.2f}s ({sent / progress.elapsed:,.0f} msg/s)"
        if failed:
            line += f"; {failed} failed" + (f" ({unknown} with unknown outcome)" if unknown else "")
        print(line)
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(produce(args))
