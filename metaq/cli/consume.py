"""``metaq consume --zk Z --topic T --group G [--read-from ...] [--max N] [--from-max-offset] [--wait-for-topic]``.

A topic no broker group has is an error naming it (exit 1), unless ``--wait-for-topic``:
then it is waited for, as is a topic whose group has no master serving it for now.

A group without stored offsets starts at the oldest message (MetaQ's rule), at ``--offset``,
or at the newest with ``--from-max-offset`` (``--always-from-max-offset``: even with stored
offsets). ``--from-beginning`` is accepted for old scripts: it is the default now.

Prints each message's data on its own line on stdout (flushed per message, so a reader
of the pipe sees every message whose offset may have been committed), a summary on
stderr at the end (with how many messages whose printing failed went to the group's retry
topic, its dead-letter topic or the recover store). Stops after ``--max`` messages, after ``--idle-timeout`` seconds
without a message, or on SIGINT/SIGTERM; offsets are committed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from ..errors import MetaqError
from . import numbers
from .files import check_parent_directory
from .produce import add_zk_arguments, client_config, require_topic
from .progress import Progress


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("consume", help="print a topic's messages as a member of a consumer group")
    add_zk_arguments(parser)
    parser.add_argument("--topic", required=True, help="the topic to read")
    parser.add_argument("--wait-for-topic", action="store_true",
                        help="wait for a topic no broker group has yet (created later) instead of exiting 1 naming it")
    parser.add_argument("--group", required=True, help="the consumer group (its offsets live in ZooKeeper)")
    parser.add_argument("--read-from", choices=("master", "slave", "prefer-slave"), default="master", help="which replica serves the reads (default master)")
    parser.add_argument("--max", type=numbers.positive_int, help="stop after N messages")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="the default now (a new group starts at the oldest message); kept for old scripts")
    start.add_argument("--from-max-offset", action="store_true", help="a group without stored offsets starts at the newest message")
    start.add_argument("--always-from-max-offset", action="store_true", help="start at the newest message even if the group has stored offsets")
    start.add_argument("--offset", type=numbers.offset, default=0, help="a group without stored offsets starts at this message offset (default 0: the oldest)")
    parser.add_argument("--attribute", action="append", help="print only messages with this attribute (repeatable); the others are skipped, offsets move past them")
    parser.add_argument("--broadcast", action="store_true", help="get every message, whatever the group's other members get")
    parser.add_argument("--offset-file", help="keep offsets in this JSON file instead of ZooKeeper")
    parser.add_argument("--offset-url", help="keep offsets in this SQL database (SQLAlchemy URL, e.g. sqlite:///offsets.db) instead of ZooKeeper")
    parser.add_argument("--commit-interval", type=numbers.positive, default=5.0, help="seconds between offset commits (default 5)")
    parser.add_argument("--idle-timeout", type=numbers.positive, help="stop after this many seconds without a message")
    parser.add_argument("--print-offsets", action="store_true", help="prefix each line with partition and offset (tab-separated)")
    parser.add_argument("--consumer-id", help=argparse.SUPPRESS)
    parser.add_argument("--recover-dir", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


async def consume(args: argparse.Namespace) -> int:
    from ..client import AsyncMessageSessionFactory, AttributeFilter, ConsumerConfig, Message

    try:
        consumer_config = ConsumerConfig(
            group=args.group,
            read_from=args.read_from,
            offset=args.offset,
            consume_from_max_offset=args.from_max_offset,
            always_consume_from_max_offset=args.always_from_max_offset,
            broadcast=args.broadcast,
            offset_store_path=args.offset_file,
            offset_store_url=args.offset_url,
            commit_interval_s=args.commit_interval,
            recover_dir=args.recover_dir,
            **({"consumer_id": args.consumer_id} if args.consumer_id else {}),
        )
    except ValueError as exc:
        raise MetaqError(str(exc)) from None
    _check_offset_store_directory(args)
    config = client_config(args)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    activity = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    out = sys.stdout.buffer
    progress = Progress(f"consuming {args.topic}", total=args.max)
    consumer = None

    reader_gone = False

    def listener(message: Message) -> None:
        nonlocal reader_gone
        try:
            if args.print_offsets:
                out.write(f"{message.partition}\t{message.offset}\t".encode())
            out.write(message.data + b"\n")
            out.flush()
        except BrokenPipeError:
            # The reader closed stdout (`metaq consume ... | head -3`): stop, as --max does,
            # instead of failing every later message into the recover store forever.
            reader_gone = True
            consumer.pause()
            done.set()
            return
        progress.advance()
        activity.set()
        if args.max is not None and progress.count >= args.max:
            # Deliver nothing more: offsets stay right after the N-th message.
            consumer.pause()
            done.set()

    factory = await AsyncMessageSessionFactory(config).start()
    try:
        try:
            consumer = factory.create_consumer(consumer_config)
        except ValueError as exc:  # the offset store's URL (--offset-url) is checked only here
            raise MetaqError(str(exc)) from None
        if not args.wait_for_topic:
            await require_topic(factory, args.topic, args.zk_root, "--wait-for-topic")
        consumer.subscribe(args.topic, None, listener, message_filter=AttributeFilter(*args.attribute) if args.attribute else None)
        await consumer.complete_subscribe()
        await _warn_if_unserved(factory, args.topic)
        while not done.is_set():
            activity.clear()
            waiters = [asyncio.ensure_future(done.wait()), asyncio.ensure_future(activity.wait())]
            finished, pending = await asyncio.wait(waiters, timeout=args.idle_timeout, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
            if not finished:
                break  # idle for --idle-timeout seconds
    finally:
        progress.close()
        await factory.shutdown()
    summary = f"consumed {progress.count} messages from {args.topic} in {progress.elapsed:.2f}s ({progress.rate:,.0f} msg/s)"
    if consumer is not None:
        summary += _failures_summary(consumer.stats, args.group)
    if reader_gone:
        summary += "; stopped: the reader closed standard output"
        from . import detach_stdout

        detach_stdout()
    print(summary, file=sys.stderr)
    return 0


def _failures_summary(stats: Any, group: str) -> str:
    """Where the messages whose listener failed went (docs/client.md, "Failed messages"); "" when none failed."""
    from ..client import failure_topic_names

    retry_topic, dlq_topic = failure_topic_names(group)
    parts = []
    if stats.retried:
        parts.append(f"{stats.retried} failed and went to the retry topic {retry_topic}")
    if stats.dead_lettered:
        parts.append(f"{stats.dead_lettered} moved to the dead-letter topic {dlq_topic} (metaq groups dlq --group {group})")
    if stats.recovered:
        parts.append(f"{stats.recovered} moved to the recover store")
    return "".join(f"; {part}" for part in parts)


def _check_offset_store_directory(args: argparse.Namespace) -> None:
    """The directory of ``--offset-file``, or of a SQLite ``--offset-url``, must exist: the
    store would create it, and a typo'd path would keep the offsets where nobody looks."""
    if args.offset_file is not None:
        check_parent_directory(args.offset_file, "--offset-file")
    if args.offset_url is not None:
        from sqlalchemy.engine import make_url

        try:
            url = make_url(args.offset_url)
        except Exception:  # malformed: the store names it when the consumer is made
            return
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            check_parent_directory(url.database, "--offset-url")


async def _warn_if_unserved(factory: Any, topic: str) -> None:
    """A topic no broker serves now (a group's master is down, or --wait-for-topic and it is
    not created yet) would otherwise just print nothing until it is."""
    snapshot = await factory.cluster.refresh()
    if not snapshot.readable_partitions(topic):
        print(f"metaq consume: warning: no broker serves topic {topic!r} (yet); waiting for it "
              "(metaq topics list shows the topics)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(consume(args))
    except BrokenPipeError:
        return 0  # e.g. `metaq consume ... | head`
