"""``metaq groups dlq``: a consumer group's dead letters, listed, replayed or purged.

A group's dead-letter topic (``__dlq.{group}``, metaq/client/retry_topics.py) is read by
nobody but this command. Which of its messages are still *pending* is kept as the group's
own offsets of that topic (``{root}/consumers/{group}/offsets/__dlq.{group}/{id}-{n}``), as
any consumer's: the group's members never subscribe to it, so they never move them.

* list (default): the pending dead letters, their count, the oldest (its time in the
  dead-letter topic, the msg id's), per original topic and per last error.
* ``--replay``: each pending dead letter is sent to its original topic (its original data
  and attribute), in order; a partition's offset moves past the letters whose send was
  acked, so a run that fails half-way replays the rest next time. At least once: a send
  acked but not recorded (the command killed in between) is replayed again by the next
  run; ``--idempotent`` sends with the idempotent producer, so a put resent within the run
  is stored once.
* ``--purge``: the pending dead letters are marked done without a send (the offsets move to
  the end seen by this run; letters arriving meanwhile stay pending). Their bytes stay in
  the topic until its retention deletes them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..errors import MetaqError, UsageError
from .admin import add_json_option, print_json, render_table, zk_client
from .login import credentials

if TYPE_CHECKING:
    from ..client.retry_topics import FailureInfo

#: A partition of the dead-letter topic as groups.py reads it (``PartitionRow``: topic,
#: name, master_url, committed). This module gets groups.py's readers as arguments
#: (``GroupReaders``) instead of importing them: groups.py registers this command.
PartitionRow = Any


@dataclass(frozen=True)
class GroupReaders:
    """groups.py's ``read_rows``, ``bounds_answer`` and ``walk``."""

    read_rows: Callable[..., list[Any]]
    bounds_answer: Callable[..., Awaitable[tuple[tuple[int, int] | None, str]]]
    walk: Callable[..., Awaitable[tuple[int, int | None, int]]]


def add_arguments(action: argparse.ArgumentParser) -> None:
    action.add_argument("--group", required=True, help="the consumer group")
    what = action.add_mutually_exclusive_group()
    what.add_argument("--replay", action="store_true", help="send each pending dead letter back to its original topic")
    what.add_argument("--purge", action="store_true", help="mark every pending dead letter done, without sending it")
    action.add_argument("--idempotent", action="store_true", help="--replay with the idempotent producer")
    add_json_option(action)


@dataclass
class Letter:
    offset: int
    size: int
    msg_id: int
    data: bytes
    info: "FailureInfo | None"  # None: not an envelope (put there by something else)


@dataclass
class PartitionLetters:
    row: PartitionRow
    end: int  # the readable end when read: what --purge moves the offset to
    letters: list[Letter] = field(default_factory=list)


def run_dlq(args: argparse.Namespace, readers: GroupReaders) -> int:
    from ..client.retry_topics import failure_topic_names

    try:
        _, topic = failure_topic_names(args.group)
    except ValueError as exc:
        raise MetaqError(str(exc)) from None
    if args.idempotent and not args.replay:
        raise UsageError("--idempotent applies to --replay only")
    with zk_client(args) as (client, paths):
        rows = readers.read_rows(client, paths, args.group, topic)
    if not rows:
        raise MetaqError(f"group {args.group}: no dead-letter topic {topic} under {args.zk_root} "
                         "(a group has one once a message exhausted its retries)")
    creds = credentials(args)
    pending = asyncio.run(_read(readers, rows, args.timeout, creds))
    letters = [letter for part in pending for letter in part.letters]
    if args.replay:
        return _replay(args, topic, pending, creds)
    if args.purge:
        _commit(args, topic, [(part, part.end) for part in pending])
        print(f"group {args.group}: purged {len(letters)} dead letter(s) of {topic}")
        return 0
    summary = _summary(args.group, topic, letters)
    if args.json:
        print_json(summary)
        return 0
    oldest = f", oldest {summary['oldest']} ({summary['oldest_age_s']:.0f} s ago)" if summary["oldest"] else ""
    print(f"group {args.group}: {summary['count']} dead letter(s) in {topic}{oldest}")
    if letters:
        print(render_table(("original topic", "dead letters"), list(summary["by_topic"].items())))
        print(render_table(("dead letters", "last error"), [(count, error) for error, count in summary["by_error"].items()]))
    return 0


async def _read(readers: GroupReaders, rows: list[PartitionRow], timeout: float, creds: Any) -> list[PartitionLetters]:
    """Every partition's pending letters: from the group's offset (none: the oldest) to the readable end."""
    from ..client.retry_topics import parse_envelope

    async def one(row: PartitionRow) -> PartitionLetters:
        found, why_not = await readers.bounds_answer(row, timeout, creds)
        if found is None:
            raise MetaqError(f"{row.topic}-{row.name}: its master cannot be read ({why_not}); nothing changed")
        earliest, end = found
        part = PartitionLetters(row, end)

        def seen(record: Any) -> None:
            try:
                info = parse_envelope(record.attribute or "")
            except ValueError:
                info = None
            part.letters.append(Letter(record.offset, record.size, record.msg_id, bytes(record.data), info))

        start = earliest if row.committed is None else max(row.committed, earliest)
        if start < end:
            await readers.walk(row, start, end, timeout, creds, seen=seen)
        return part

    return list(await asyncio.gather(*(one(row) for row in rows)))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _summary(group: str, topic: str, letters: list[Letter]) -> dict[str, Any]:
    from ..store.msgid import msg_id_timestamp_ms

    by_topic: dict[str, int] = {}
    by_error: dict[str, int] = {}
    for letter in letters:
        original = letter.info.topic if letter.info else "(no envelope)"
        error = letter.info.error if letter.info else "(no envelope)"
        by_topic[original] = by_topic.get(original, 0) + 1
        by_error[error] = by_error.get(error, 0) + 1
    oldest = min((msg_id_timestamp_ms(letter.msg_id) for letter in letters), default=None)
    return {
        "group": group, "topic": topic, "count": len(letters),
        "oldest": None if oldest is None else _iso(oldest),
        "oldest_age_s": None if oldest is None else max(0.0, time.time() - oldest / 1000),
        "by_topic": dict(sorted(by_topic.items(), key=lambda item: (-item[1], item[0]))),
        "by_error": dict(sorted(by_error.items(), key=lambda item: (-item[1], item[0]))),
    }


def _replay(args: argparse.Namespace, topic: str, pending: list[PartitionLetters], creds: Any) -> int:
    from ..client import Message, MessageSessionFactory, MetaClientConfig

    config = MetaClientConfig(zk_connect=args.zk, zk_root=args.zk_root, credentials=creds, idempotence=args.idempotent,
                              send_timeout_s=max(args.timeout, 15.0))
    replayed = skipped = 0
    moves: list[tuple[PartitionLetters, int]] = []
    failure: str | None = None
    with MessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        for part in pending:
            reached = None
            for letter in part.letters:
                if letter.info is None:
                    skipped += 1  # nothing says where it came from: left in the topic, not sent
                else:
                    result = producer.send_message(Message(letter.info.topic, letter.data, letter.info.attribute))
                    if not result.success:
                        failure = f"{topic}-{part.row.name}@{letter.offset} to {letter.info.topic}: {result.error_message}"
                        break
                    replayed += 1
                reached = letter.offset + letter.size
            if reached is not None:
                moves.append((part, reached))
            if failure:
                break
    _commit(args, topic, moves)
    print(f"group {args.group}: replayed {replayed} dead letter(s) of {topic} to their original topics"
          + (f"; {skipped} without an envelope left unsent" if skipped else ""))
    if failure:
        raise MetaqError(f"replay stopped: cannot send {failure}; the rest stays pending (run it again)")
    return 0


def _commit(args: argparse.Namespace, topic: str, moves: list[tuple[PartitionLetters, int]]) -> None:
    """Move the group's offsets of the dead-letter topic (never backwards)."""
    from ..zk.paths import NO_MSG_ID, format_offset

    with zk_client(args) as (client, paths):
        for part, offset in moves:
            if part.row.committed is not None and offset <= part.row.committed:
                continue
            path = paths.offset(args.group, topic, part.row.name)
            value = format_offset(NO_MSG_ID, offset).encode()
            if client.exists(path):
                client.set(path, value)
            else:
                client.create(path, value, makepath=True)
