"""``metaq groups list|describe|reset-offsets|delete|dlq``: consumer groups, their lag, moving and deleting them.

A group's offsets are MetaQ's: ``{root}/consumers/{group}/offsets/{topic}/{brokerId}-{n}``
holds ``{msgId}-{offset}`` (the byte offset the group reads next). Live consumers are
the ephemeral ``{root}/consumers/{group}/ids/*`` nodes.

``describe``: per partition the group's committed offset, the log end a consumer may
read up to (the master's committed offset), and the lag in bytes and in messages
(counted exactly, by walking the records in between through the master).

``reset-offsets`` (one topic, or ``--all-topics``): to the earliest retained offset, to
the latest, to where the group is (``--to-current``), to the first message at or after a
time (``--to-datetime``, or ``--by-duration`` before now), N messages forward or back
(``--shift-by``), to an explicit offset, or to the offsets of a CSV file (``--from-file``,
what ``--export`` prints); an explicit offset must start a message. A dry run prints
the plan; ``--execute`` writes it. Refused while the group has live members
(they would overwrite it at their next commit) unless ``--force``. The time of a
message is the timestamp in its msg id (metaq/store/msgid.py: the append time on
the master, in ms, never earlier than the true time); a time is answered by the master's
time index (the ``offset_for_time`` request: one index file and one index interval of
the log read on the broker, one request per partition), the end when no message is that late.

``dlq``: the group's dead letters (metaq/cli/dlq.py).

``delete``: removes the group (or one topic's offsets of it) from ZooKeeper; refused
while the group has live members.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from ..errors import MetaqError, UsageError
from . import numbers
from .admin import (
    NEEDS_LOGIN, UNREACHABLE, Answer, add_action, add_actions, add_json_option, ask, ask_answer, no_such_topic, print_json, render_table, table_json,
    zk_client,
)
from .login import credentials

if TYPE_CHECKING:
    from ..record import Record


def add_parser(sub: argparse._SubParsersAction) -> None:
    actions = add_actions(sub, "groups", "list, describe (lag) or reset the offsets of consumer groups")
    listing = add_action(actions, "list", "consumer groups with their live members and topics", run_list)
    add_json_option(listing)

    describe = add_action(actions, "describe", "per partition: committed offset, log end, lag in bytes and messages", run_describe)
    describe.add_argument("--group", required=True, help="the consumer group")
    describe.add_argument("--topic", help="only this topic")
    add_json_option(describe)

    reset = add_action(actions, "reset-offsets", "move a group's offsets (dry run unless --execute)", run_reset)
    reset.add_argument("--group", required=True, help="the consumer group")
    topics = reset.add_mutually_exclusive_group()
    topics.add_argument("--topic", help="the topic")
    topics.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    reset.add_argument("--partition", type=numbers.partition, metavar="BROKER-N", help="only this partition, e.g. 0-1 (default: all)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the oldest retained message")
    target.add_argument("--to-latest", action="store_true", help="after the last readable message")
    target.add_argument("--to-current", action="store_true", help="where the group is now (never committed: the oldest message); with --export, a backup")
    target.add_argument("--to-datetime", metavar="TIME", help="the first message at or after TIME (ISO 8601, e.g. 2026-11-23T09:30:00Z; no zone: local time)")
    target.add_argument("--by-duration", metavar="DURATION", help="the first message at or after now minus DURATION (30m, 2h, 1d, or ISO 8601 like PT1H30M)")
    target.add_argument("--to-offset", type=numbers.offset, metavar="OFFSET", help="this byte offset (must start a message)")
    target.add_argument("--shift-by", type=int, metavar="N", help="N messages forward (negative: back) from the current offset, within the retained log")
    target.add_argument("--from-file", metavar="CSV", help="the offsets in CSV lines TOPIC,BROKER-N,OFFSET (what --export prints); each must start a message")
    reset.add_argument("--export", action="store_true", help="print the plan as CSV lines TOPIC,BROKER-N,OFFSET instead of a table")
    reset.add_argument("--execute", action="store_true", help="write the new offsets (default: only show them)")
    reset.add_argument("--force", action="store_true", help="even while the group has live consumers (they may overwrite it)")

    delete = add_action(actions, "delete", "delete a group's stored offsets (all, or one topic's); refused while it has live members", run_delete)
    delete.add_argument("--group", required=True, help="the consumer group")
    delete.add_argument("--topic", help="only this topic's offsets (default: the whole group)")

    from . import dlq

    dead_letters = add_action(actions, "dlq", "a group's dead letters: list (count, oldest, by error), --replay or --purge",
                              lambda args: dlq.run_dlq(args, dlq.GroupReaders(read_rows, bounds_answer, walk)))
    dlq.add_arguments(dead_letters)


@dataclass
class PartitionRow:
    topic: str
    broker_id: int
    partition: int
    master_url: str | None
    committed: int | None = None  # the group's offset; None: never committed
    msg_id: int | None = None

    @property
    def name(self) -> str:
        return f"{self.broker_id}-{self.partition}"


# --- ZooKeeper ---------------------------------------------------------------------------------


def _children(client: Any, path: str) -> list[str]:
    from kazoo.exceptions import NoNodeError

    try:
        return sorted(client.get_children(path))
    except NoNodeError:
        return []


def topic_partitions(client: Any, paths: Any, topic: str) -> dict[int, int]:
    """broker id -> partitions of ``topic``, from the brokers' topic nodes and group configurations
    (empty: no broker group has the topic)."""
    from ..zk.paths import parse_topic_node_data
    from ..zk.topic_config import read_group_topics

    found: dict[int, int] = {}
    for parent in (paths.topics_pub(topic), paths.topics_sub(topic)):
        for child in _children(client, parent):
            try:
                data = parse_topic_node_data(client.get(f"{parent}/{child}")[0])
            except Exception:  # gone meanwhile, or not ours to read
                continue
            found[data.broker_id] = max(found.get(data.broker_id, 0), data.num_parts)
    for broker_id in {int(c) for c in _children(client, paths.topic_config(0).rsplit("/", 1)[0]) if c.isdigit()}:
        settings = read_group_topics(client, paths, broker_id).topics.get(topic)
        if settings is not None:
            found[broker_id] = max(found.get(broker_id, 0), int(settings.get("numPartitions", "1")))
    return dict(sorted(found.items()))


def read_rows(client: Any, paths: Any, group: str, topic: str) -> list[PartitionRow]:
    from kazoo.exceptions import NoNodeError

    from ..zk.group import read_members
    from ..zk.paths import parse_offset

    rows = []
    for broker_id, partitions in topic_partitions(client, paths, topic).items():
        try:
            master = read_members(client, paths, broker_id).master_url
        except NoNodeError:
            master = None
        for n in range(partitions):
            row = PartitionRow(topic, broker_id, n, master)
            try:
                row.msg_id, row.committed = parse_offset(client.get(paths.offset(group, topic, row.name))[0])
            except NoNodeError:
                pass
            rows.append(row)
    return rows


def live_members(client: Any, paths: Any, group: str) -> list[str]:
    return _children(client, paths.consumer_ids(group))


# --- brokers -----------------------------------------------------------------------------------


async def bounds_answer(row: PartitionRow, timeout: float, creds: Any) -> tuple[tuple[int, int] | None, str]:
    """``((earliest, readable end), "")`` of a partition on its master, or ``(None, why not)``.

    A master with security on asked without a login cannot answer anything: that is a
    MetaqError naming the missing login, not a partition row saying "unreachable".
    """
    from ..protocol.messages import OffsetRequest

    if row.master_url is None:
        return None, UNREACHABLE
    answer: Answer = await ask_answer(row.master_url, OffsetRequest(topic=row.topic, partition=row.partition, offset=0).to_header(), timeout, creds)
    if answer.problem == NEEDS_LOGIN:
        raise MetaqError(f"broker group {row.broker_id}'s master {row.master_url} has security on and needs a login: "
                         "give --user and --password-file (a user with consume rights on the topic)")
    if answer.reply is None:
        return None, answer.problem or UNREACHABLE
    return (int(answer.reply["min_offset"]), int(answer.reply["max_offset"])), ""


async def bounds(row: PartitionRow, timeout: float, creds: Any) -> tuple[int, int] | None:
    """``(earliest, readable end)`` of a partition on its master; None if it cannot answer."""
    return (await bounds_answer(row, timeout, creds))[0]


async def walk(
    row: PartitionRow, start: int, end: int, timeout: float, creds: Any,
    stop: Callable[[Record, int], bool] | None = None, seen: Callable[[Record], None] | None = None,
) -> tuple[int, int | None, int]:
    """Walk the messages starting in [start, end) through the master.

    ``stop(record, walked so far)`` ends the walk at the first record it is true for;
    ``seen`` is called with every record walked. Returns ``(count, found, reached)``: the
    messages walked, the offset of the record ``stop`` ended at (None if none), and the
    offset after the last message walked.
    """
    from ..addresses import parse_broker_url
    from ..client.connection import Credentials
    from ..protocol.messages import GetRequest
    from ..record import iter_records

    assert row.master_url is not None
    count, offset, max_size = 0, start, 1024 * 1024
    conn = await (creds or Credentials()).open(*parse_broker_url(row.master_url), timeout)
    try:
        while offset < end:
            request = GetRequest(topic=row.topic, partition=row.partition, offset=offset, max_size=max_size)
            reply = await conn.request(request.to_header(), timeout=timeout)
            if not reply.ok:
                raise MetaqError(f"{row.topic}-{row.name}: the master answered {reply.code} at offset {offset}: {reply.message}")
            moved = False
            for record in iter_records(bytes(reply.body), offset, verify=False):
                if record.offset >= end:
                    return count, None, offset
                if stop is not None and stop(record, count):
                    return count, record.offset, offset
                if seen is not None:
                    seen(record)
                count += 1
                offset, moved = record.offset + record.size, True
            if not moved:
                if max_size >= 64 * 1024 * 1024:
                    raise MetaqError(f"{row.topic}-{row.name}: no whole message at offset {offset}")
                max_size *= 4  # one message larger than the fetch size
    finally:
        conn.close()
    return count, None, offset


# --- commands --------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    rows = []
    with zk_client(args) as (client, paths):
        for group in _children(client, paths.consumers()):
            topics = _children(client, f"{paths.consumer_group(group)}/offsets")
            rows.append((group, len(live_members(client, paths, group)), topics))
    if args.json:
        print_json(table_json(("group", "live members", "topics"), rows))
        return 0
    rows = [(group, live, ",".join(topics) or "-") for group, live, topics in rows]
    if not rows:
        print(f"no consumer groups under {args.zk_root}")
        return 0
    print(render_table(("group", "live members", "topics with offsets"), rows))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with zk_client(args) as (client, paths):
        topics = [args.topic] if args.topic else _children(client, f"{paths.consumer_group(args.group)}/offsets")
        if not topics and not _children(client, paths.consumer_group(args.group)):
            raise MetaqError(f"no consumer group {args.group!r} under {args.zk_root} (see metaq groups list)")
        rows = [row for topic in topics for row in read_rows(client, paths, args.group, topic)]
        if args.topic and not rows:
            raise no_such_topic(args.topic, args.zk_root)
        members = live_members(client, paths, args.group)
    table = asyncio.run(_describe(rows, args.timeout, credentials(args)))
    columns = ("topic", "partition", "committed", "log end", "lag bytes", "lag messages")
    cells = [row[:-1] for row in table]
    problems = [row[-1] for row in table]
    if args.json:
        # The numbers stay numbers (null when unknown); why a master gave none is "problem".
        partitions = [{**row, "problem": problem} for row, problem in zip(table_json(columns, cells), problems)]
        print_json({"group": args.group, "live_members": members, "partitions": partitions})
        return 0
    print(f"group {args.group}: {len(members)} live member(s){': ' + ', '.join(members) if members else ''}")
    # In the table, why a master gave no log end stands in that column.
    print(render_table(columns, [row if problem is None else (*row[:3], problem, *row[4:]) for row, problem in zip(cells, problems)]))
    return 0


async def _describe(rows: list[PartitionRow], timeout: float, creds: Any) -> list[tuple[Any, ...]]:
    """One row per partition: the describe columns, then why its master gave no bounds (None: it did)."""
    async def one(row: PartitionRow) -> tuple[Any, ...]:
        found, why_not = await bounds_answer(row, timeout, creds)
        if found is None:
            return (row.topic, row.name, row.committed, None, None, None, why_not)
        earliest, end = found
        start = earliest if row.committed is None else max(row.committed, earliest)
        messages = (await walk(row, start, end, timeout, creds))[0] if start < end else 0
        return (row.topic, row.name, row.committed, end, max(0, end - start), messages, None)

    return list(await asyncio.gather(*(one(row) for row in rows)))


def run_reset(args: argparse.Namespace) -> int:
    from ..zk.paths import NO_MSG_ID, format_offset

    stop_at_ms = _parse_time(args.to_datetime) if args.to_datetime else None
    if args.by_duration:
        stop_at_ms = int(time.time() * 1000) - _parse_duration(args.by_duration)
    wanted = _read_offsets_file(args.from_file) if args.from_file else None
    if not (args.all_topics or args.topic or wanted is not None):
        raise UsageError("give --topic T or --all-topics (or --from-file)")
    with zk_client(args) as (client, paths):
        if args.all_topics:
            topics = _children(client, f"{paths.consumer_group(args.group)}/offsets")
        elif wanted is not None and not args.topic:
            topics = sorted({topic for topic, _ in wanted})
        else:
            topics = [args.topic]
        rows = [row for topic in topics for row in read_rows(client, paths, args.group, topic)]
        if args.partition:
            rows = [row for row in rows if row.name == args.partition]
        if wanted is not None:
            unknown = sorted(set(wanted) - {(row.topic, row.name) for row in rows})
            if unknown:
                raise MetaqError(f"--from-file {args.from_file}: no partition {unknown[0][1]} of topic {unknown[0][0]!r} is registered; nothing written")
            rows = [row for row in rows if (row.topic, row.name) in wanted]
        if not rows:
            what = f"topic {args.topic!r}" if args.topic else f"group {args.group!r}"
            raise MetaqError(f"{what} has no partition {args.partition or ''} registered under {args.zk_root}".replace("  ", " "))
        members = live_members(client, paths, args.group)
        plan = asyncio.run(_plan(rows, args, stop_at_ms, wanted))
        if args.export:
            print("\n".join(f"{r.topic},{r.name},{new}" for r, new in plan))
        else:
            print(render_table(("topic", "partition", "current", "new"), [(r.topic, r.name, r.committed, new) for r, new in plan]))
        if not args.execute:
            if not args.export:
                print("dry run: nothing written (add --execute to apply)")
            return 0
        if members and not args.force:
            raise MetaqError(f"group {args.group} has {len(members)} live member(s) ({', '.join(members)}): stop them, or add --force")
        for row, new in plan:
            path = paths.offset(args.group, row.topic, row.name)
            value = format_offset(NO_MSG_ID, new).encode()
            if client.exists(path):
                client.set(path, value)
            else:
                client.create(path, value, makepath=True)
    print(f"group {args.group}: {len(plan)} offset(s) written", file=sys.stderr if args.export else sys.stdout)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    """Delete a group's offsets (``/consumers/{group}``, or one topic's offsets under it)."""
    from kazoo.exceptions import NoNodeError, NotEmptyError

    with zk_client(args) as (client, paths):
        base = paths.consumer_group(args.group)
        if not client.exists(base):
            raise MetaqError(f"no consumer group {args.group!r} under {args.zk_root} (see metaq groups list)")
        members = live_members(client, paths, args.group)
        if members:
            # A live member would commit its offsets again (or lose its registration).
            raise MetaqError(f"group {args.group} has {len(members)} live member(s) ({', '.join(members)}): stop them first; nothing deleted")
        target = f"{base}/offsets/{args.topic}" if args.topic else base
        try:
            client.delete(target, recursive=True)
        except NoNodeError:
            raise MetaqError(f"group {args.group} has no offsets for topic {args.topic!r}") from None
        except NotEmptyError:
            raise MetaqError(f"group {args.group}: a member joined meanwhile; run it again once it is stopped") from None
    print(f"group {args.group}: deleted " + (f"its offsets of topic {args.topic}" if args.topic else "the group and all its offsets"))
    return 0


async def _plan(rows: list[PartitionRow], args: argparse.Namespace, stop_at_ms: int | None,
                wanted: dict[tuple[str, str], int] | None) -> list[tuple[PartitionRow, int]]:

    creds = credentials(args)

    async def one(row: PartitionRow) -> tuple[PartitionRow, int]:
        found = await bounds(row, args.timeout, creds)
        if found is None:
            raise MetaqError(f"{row.topic}-{row.name}: its master cannot be reached; nothing was written")
        earliest, end = found
        current = earliest if row.committed is None else min(max(row.committed, earliest), end)
        if args.to_earliest:
            return row, earliest
        if args.to_latest:
            return row, end
        if args.to_current:
            return row, current
        if stop_at_ms is not None:
            return row, await time_offset(row, stop_at_ms, args.timeout, creds)
        if args.shift_by is not None:
            return row, await _shifted(row, current, args.shift_by, earliest, end, args.timeout, creds)
        offset = wanted[(row.topic, row.name)] if wanted is not None else args.to_offset
        return row, await checked_offset(row, offset, earliest, end, args.timeout, creds)

    return list(await asyncio.gather(*(one(row) for row in rows)))


async def time_offset(row: PartitionRow, time_ms: int, timeout: float, creds: Any) -> int:
    """The offset of the first message at or after ``time_ms`` on the partition's master (its
    readable end when none is that late), from the broker's time index."""
    from ..protocol.messages import OffsetForTimeRequest

    assert row.master_url is not None
    header = OffsetForTimeRequest(topic=row.topic, partition=row.partition, time_ms=time_ms).to_header()
    answer: Answer = await ask_answer(row.master_url, header, timeout, creds)
    if answer.reply is None:
        raise MetaqError(f"{row.topic}-{row.name}: its master answered no offset for the time: {answer.problem}; nothing was written")
    return int(answer.reply["offset"])


async def _shifted(row: PartitionRow, current: int, shift: int, earliest: int, end: int, timeout: float, creds: Any) -> int:
    """The offset ``shift`` messages after ``current`` (before it when negative), kept within [earliest, end]."""
    if shift >= 0:
        _, at, reached = await walk(row, current, end, timeout, creds, stop=lambda _r, walked: walked >= shift)
        return reached if at is None else at
    # Back: the starts of the last -shift messages before ``current``, walking from the oldest.
    starts: deque[int] = deque(maxlen=-shift)
    await walk(row, earliest, current, timeout, creds, seen=lambda record: starts.append(record.offset))
    return starts[0] if len(starts) == -shift else earliest


def _read_offsets_file(path: str) -> dict[tuple[str, str], int]:
    """``(topic, BROKER-N) -> offset`` from CSV lines ``TOPIC,BROKER-N,OFFSET``."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise MetaqError(f"--from-file {path}: {exc.strerror}") from None
    wanted: dict[tuple[str, str], int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3 or not re.fullmatch(r"\d+-\d+", fields[1]) or not fields[2].isdigit():
            raise MetaqError(f"--from-file {path} line {number}: expected TOPIC,BROKER-N,OFFSET, got {line!r}")
        wanted[(fields[0], fields[1])] = int(fields[2])
    if not wanted:
        raise MetaqError(f"--from-file {path}: no offsets in it")
    return wanted


def _parse_duration(text: str) -> int:
    """``30m``, ``2h``, ``1d``, ``90s`` or ISO 8601 ``PnDTnHnMnS`` in milliseconds."""
    simple = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if simple:
        return int(simple.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[simple.group(2)] * 1000
    iso = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", text.strip().upper())
    if iso and any(iso.groups()) and not text.strip().upper().endswith("T"):
        days, hours, minutes, seconds = (float(g) if g else 0.0 for g in iso.groups())
        return int((((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000)
    raise MetaqError(f"--by-duration: expected 30m, 2h, 1d or ISO 8601 like PT1H30M, got {text!r}")


async def checked_offset(row: PartitionRow, offset: int, earliest: int, end: int, timeout: float, creds: Any) -> int:
    if not earliest <= offset <= end:
        raise MetaqError(f"{row.topic}-{row.name}: offset {offset} is outside [{earliest}, {end}]")
    if offset in (earliest, end):
        return offset
    from ..protocol.messages import OffsetRequest

    # Walk from the start of the segment holding it: a message boundary is where a walk lands.
    reply = await ask(row.master_url or "", OffsetRequest(topic=row.topic, partition=row.partition, offset=offset).to_header(), timeout, creds)
    segment_start = int(reply["offset"]) if reply is not None else earliest
    _, _, reached = await walk(row, segment_start, offset, timeout, creds)
    if reached != offset:
        raise MetaqError(f"{row.topic}-{row.name}: offset {offset} does not start a message (the nearest boundary after it is {reached})")
    return offset


def _parse_time(text: str, option: str = "--to-datetime") -> int:
    """Milliseconds since 1970 of an ISO 8601 time (no zone: local time)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MetaqError(f"{option}: expected ISO 8601 like 2026-11-23T09:30:00Z, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as the operator typed it
    return int(moment.astimezone(timezone.utc).timestamp() * 1000)
