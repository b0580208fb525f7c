"""``metaq topics list|describe|create|alter|delete``: a broker group's topics, without restarts.

Topics live in each broker group's topic configuration in ZooKeeper
(``{root}/brokers/topic-config/{id}``, metaq/zk/topic_config.py); every member of the
group, master and slaves, applies a change within moments, and the configuration
outlives any role swap. ``create``, ``alter`` and ``delete`` write it (compare-and-set),
then wait until every live member serves the change (``--wait``, default 15 s; exit 1
if one does not). ``describe`` asks the members themselves: per partition, each
member's log end and committed offset, and each slave's lag behind the master.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
from typing import Any

from ..errors import MetaqError, UsageError
from . import numbers
from .admin import (
    add_action, add_actions, add_json_option, ask, no_such_topic, parse_settings, print_json, render_table, stats_answer, sync_set_json, sync_set_text, table_json, zk_client,
)
from .login import add_group_secret_argument, credentials, zk_security, zk_write_refused


def add_parser(sub: argparse._SubParsersAction) -> None:
    actions = add_actions(sub, "topics", "list, describe, create, alter or delete topics of a broker group")
    listing = add_action(actions, "list", "every group's topics and their settings", run_list)
    listing.add_argument("--broker-id", type=numbers.broker_id, metavar="ID", help="only this broker group")
    add_json_option(listing)

    describe = add_action(actions, "describe", "partitions, master, slaves, sync set, committed offsets, lag per slave", run_describe)
    describe.add_argument("--topic", required=True, help="the topic")
    describe.add_argument("--broker-id", type=numbers.broker_id, metavar="ID", help="only this broker group")
    only = describe.add_mutually_exclusive_group()
    only.add_argument("--under-replicated-partitions", action="store_true",
                      help="only partitions a registered slave does not hold fully: unreachable, not serving it, out of the sync set (sync) or behind (async)")
    only.add_argument("--unavailable-partitions", action="store_true", help="only partitions without a master serving them")
    add_json_option(describe)

    get = add_action(actions, "get", "print one message of a partition, by offset, msg id or time (read from its master)", run_get)
    get.add_argument("--topic", required=True, help="the topic")
    get.add_argument("--partition", required=True, type=numbers.partition, metavar="BROKER-N", help="the partition, e.g. 0-1")
    which = get.add_mutually_exclusive_group(required=True)
    which.add_argument("--offset", type=numbers.offset, help="the message starting at this byte offset")
    which.add_argument("--msg-id", type=int, help="the message with this msg id (walks the partition from its oldest message)")
    which.add_argument("--at", metavar="TIME", help="the first message at or after TIME (ISO 8601, e.g. 2026-11-23T09:30:00Z; no zone:"
                       " local time), found by the broker's time index")
    add_json_option(get)

    for name, helptext, runner in (
        ("create", "add a topic to a broker group (every member serves it at once)", run_create),
        ("alter", "change a topic's partitions (only more) or settings", run_alter),
        ("delete", "delete a topic in a broker group: every member drops it and its files", run_delete),
    ):
        action = add_action(actions, name, helptext, runner)
        action.add_argument("--broker-id", type=numbers.broker_id, required=True, metavar="ID", help="the broker group")
        action.add_argument("--topic", required=True, help="the topic")
        if name != "delete":
            action.add_argument("--partitions", type=numbers.positive_int, metavar="N", help="number of partitions" + (" (default 1)" if name == "create" else " (can only grow)"))
            action.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                                help="a topic key in MetaQ's name (unflushThreshold, deletePolicy, acceptPublish, ...); repeatable"
                                + ("; KEY= (empty) removes the override, the key then follows each broker's [system] default" if name == "alter" else ""))
        if name == "create":
            action.add_argument("--if-not-exists", action="store_true", help="exit 0 without a change if the group already has the topic")
        if name == "delete":
            action.add_argument("--if-exists", action="store_true", help="exit 0 without a change if the group has no such topic")
        add_group_secret_argument(action)
        action.add_argument("--wait", type=numbers.non_negative, default=15.0, metavar="S", help="seconds to wait for every live member to apply it (0: do not wait; default 15)")


# --- reading -----------------------------------------------------------------------------------


def _group_ids(client: Any, paths: Any) -> list[int]:
    from kazoo.exceptions import NoNodeError

    ids: set[int] = set()
    for parent in (paths.broker_ids(), paths.topic_config(0).rsplit("/", 1)[0]):
        try:
            ids.update(int(child) for child in client.get_children(parent) if child.isdigit())
        except NoNodeError:
            pass
    return sorted(ids)


LIST_COLUMNS = ("broker", "topic", "partitions", "settings (other than the defaults)")


def run_list(args: argparse.Namespace) -> int:
    from ..config import TopicConfig, topic_settings
    from ..zk.topic_config import read_group_topics

    defaults = topic_settings(TopicConfig(name=""))
    rows, found = [], []
    with zk_client(args) as (client, paths):
        ids = [args.broker_id] if args.broker_id is not None else _group_ids(client, paths)
        for broker_id in ids:
            group = read_group_topics(client, paths, broker_id, args.timeout)
            if not group.exists:
                rows.append((broker_id, "(no topic configuration in ZooKeeper)", "", ""))
            for name, settings in sorted(group.topics.items()):
                other = " ".join(f"{k}={v}" for k, v in sorted(settings.items()) if k != "numPartitions" and defaults.get(k) != v)
                rows.append((broker_id, name, settings.get("numPartitions", "1"), other))
                found.append({"broker": broker_id, "topic": name, "partitions": int(settings.get("numPartitions", "1")),
                              "settings": dict(sorted(settings.items()))})
    if args.json:
        print_json(found)
        return 0
    if not rows:
        print(f"no broker groups under {args.zk_root}")
        return 0
    print(render_table(LIST_COLUMNS, rows))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    from ..zk.group import read_group_state, read_members
    from ..zk.topic_config import read_group_topics
    from kazoo.exceptions import NoNodeError

    groups = []
    with zk_client(args) as (client, paths):
        ids = [args.broker_id] if args.broker_id is not None else _group_ids(client, paths)
        for broker_id in ids:
            config = read_group_topics(client, paths, broker_id, args.timeout)
            if args.topic not in config.topics and args.broker_id is None:
                continue
            if args.topic not in config.topics and config.exists:
                raise MetaqError(f"broker group {broker_id} has no topic {args.topic!r} (see metaq topics list)")
            try:
                members = read_members(client, paths, broker_id)
            except NoNodeError:
                members = None
            groups.append((broker_id, config, members, read_group_state(client, paths, broker_id)))
    if not groups:
        raise no_such_topic(args.topic, args.zk_root)
    described = [asyncio.run(_describe_group(args, *group)) for group in groups]
    if args.under_replicated_partitions or args.unavailable_partitions:
        keep = _under_replicated if args.under_replicated_partitions else _unavailable
        described = [(head, [row for row in rows if row[0] in keep(rows)]) for head, rows in described]
    if args.json:
        print_json([{**head, "sync_set": sync_set_json(head["sync_set"]),
                     "partitions": [{**row, "in_sync_set": IN_SYNC_JSON[row["in_sync_set"]]}
                                    for row in table_json(DESCRIBE_COLUMNS, rows)]}
                    for head, rows in described])
        return 0
    print("\n\n".join(_describe_text(args.topic, head, rows) for head, rows in described))
    return 0


def _under_replicated(rows: list[tuple[Any, ...]]) -> set[int]:
    """Partitions a registered slave does not hold fully (rows as in DESCRIBE_COLUMNS)."""
    return {row[0] for row in rows if row[1] != "master" and (row[3] != "up" or row[7] == "no" or (row[7] == "-" and row[6] != 0))}


def _unavailable(rows: list[tuple[Any, ...]]) -> set[int]:
    """Partitions whose master is absent, unreachable or does not serve them."""
    partitions = {row[0] for row in rows}
    served = {row[0] for row in rows if row[1] == "master" and row[3] == "up"}
    return partitions - served


DESCRIBE_COLUMNS = ("partition", "member", "address", "state", "log end", "committed", "lag bytes", "in sync set")
#: The table's "in sync set" column in JSON: a master's row, or a group without a sync set, is null.
IN_SYNC_JSON = {"yes": True, "no": False, "-": None}


def _describe_text(topic: str, head: dict[str, Any], rows: list[tuple[Any, ...]]) -> str:
    line = (
        f"topic {topic}, broker group {head['broker']}: {head['partition_count']} partitions, epoch {'-' if head['epoch'] is None else head['epoch']}, "
        f"master {head['master'] or '-'}, slaves {','.join(head['slaves']) or '-'}, sync set {head['sync_set']}"
    )
    return line + "\n" + render_table(DESCRIBE_COLUMNS, rows)


async def _describe_group(args: argparse.Namespace, broker_id: int, config: Any, members: Any, state: Any) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The group's head facts and one row per partition and member."""
    settings = config.topics.get(args.topic)
    partitions = int(settings.get("numPartitions", "1")) if settings else 0
    sync_set = sync_set_text(state.sync_set)
    registered = members.slaves if members is not None else {}
    master_url = members.master_url if members is not None else None
    # Who should hold the partitions, present or not: the master (a row even when none is
    # registered) and every registered slave or sync-set member (a sync-set member that is
    # not registered lacks what the set promises).
    roles: list[tuple[str, str | None]] = [("master", master_url)] + [(f"slave{k}", url) for k, url in registered.items()]
    roles += [(f"slave{k}", None) for k in sorted(state.sync_set or ()) if k not in registered]
    head = {
        "topic": args.topic, "broker": broker_id, "partition_count": partitions,
        "epoch": None if state.epoch_version < 0 else state.epoch,  # None: the group never had a master
        "master": master_url.removeprefix("meta://") if master_url else None,
        "slaves": [f"slave{k}" for k in registered], "sync_set": sync_set,
    }
    creds = credentials(args)
    answers = await asyncio.gather(*(stats_answer(url, args.topic, args.timeout, creds) for _, url in roles if url is not None))
    found = iter(answers)
    offsets = {role: (next(found) if url is not None else None) for role, url in roles}
    rows = []
    for partition in range(partitions):
        name = f"{args.topic}-{broker_id}-{partition}"
        master_end = None
        for role, url in roles:
            answer = offsets[role]
            pairs = answer.reply.pairs if answer is not None and answer.reply is not None else None
            row = dict(pairs).get(name) if pairs is not None else None
            end = row["max_offset"] if isinstance(row, dict) else None
            if role == "master":
                master_end = end
            lag = master_end - end if role != "master" and master_end is not None and end is not None else None
            in_sync = "-" if role == "master" or state.sync_set is None else ("yes" if int(role[5:]) in state.sync_set else "no")
            if url is None:
                state_text = "not registered"
            elif pairs is None:
                state_text = answer.problem if answer is not None and answer.problem else "unreachable"
            else:
                state_text = "up" if row is not None else "not served"
            rows.append((partition, role, url.removeprefix("meta://") if url else "-", state_text, end,
                         row["committed"] if isinstance(row, dict) else None, lag, in_sync))
    return head, rows


def run_get(args: argparse.Namespace) -> int:
    from kazoo.exceptions import NoNodeError

    from ..zk.group import read_members
    from .groups import PartitionRow

    broker, _, number = args.partition.partition("-")  # checked by its type, numbers.partition
    with zk_client(args) as (client, paths):
        try:
            master = read_members(client, paths, int(broker)).master_url
        except NoNodeError:
            master = None
    if master is None:
        raise MetaqError(f"broker group {broker} has no master registered under {args.zk_root}: {args.topic}-{args.partition} cannot be read")
    row = PartitionRow(args.topic, int(broker), int(number), master)
    record = asyncio.run(_find_message(row, args))
    from datetime import datetime, timezone

    from ..store.msgid import msg_id_timestamp_ms

    at = datetime.fromtimestamp(msg_id_timestamp_ms(record.msg_id) / 1000, timezone.utc).isoformat(timespec="milliseconds")
    if args.json:
        from ..http.bodies import data_json

        print_json({"topic": args.topic, "partition": args.partition, "offset": record.offset, "msg_id": record.msg_id,
                    "time": at, "attribute": record.attribute, **data_json(record.data)})
    else:
        print(f"{args.topic}-{args.partition} offset {record.offset} msg id {record.msg_id} time {at} attribute {record.attribute or '-'}")
        # The bytes as stored (a decode would replace what is not UTF-8): `... | tail -c +N > file` gets them back.
        sys.stdout.flush()
        sys.stdout.buffer.write(record.data + b"\n")
        sys.stdout.buffer.flush()
    return 0


async def _find_message(row: Any, args: argparse.Namespace) -> Any:
    """The record at ``--offset`` (which must start a message) or with ``--msg-id``, read from the master."""
    from ..txn.control import CONTROL_ATTRIBUTE
    from .groups import _parse_time, bounds, checked_offset, time_offset, walk

    creds = credentials(args)
    found = await bounds(row, args.timeout, creds)
    if found is None:
        raise MetaqError(f"{row.topic}-{row.name}: its master cannot be reached or does not serve it")
    earliest, end = found
    if args.offset is not None:
        if args.offset >= end:
            raise MetaqError(f"{row.topic}-{row.name}: no message at offset {args.offset} (readable messages end at {end})")
        start = await checked_offset(row, args.offset, earliest, end, args.timeout, creds)
    elif args.at is not None:
        start = await time_offset(row, _parse_time(args.at, "--at"), args.timeout, creds)
        if start >= end:
            raise MetaqError(f"{row.topic}-{row.name}: no message at or after {args.at} (every readable message is older)")
    else:
        start = earliest
    hits: list[Any] = []

    def wanted(record: Any, _walked: int) -> bool:
        if args.at is not None and record.attribute == CONTROL_ATTRIBUTE:
            return False  # a time finds the first message: a control record there (a batch header) is passed
        if args.msg_id is None or record.msg_id == args.msg_id:
            hits.append(record)
            return True
        return False

    await walk(row, start, end, args.timeout, creds, stop=wanted)
    if not hits:
        raise MetaqError(f"{row.topic}-{row.name}: no message with msg id {args.msg_id} in [{earliest}, {end})")
    return hits[0]


# --- writing -----------------------------------------------------------------------------------


class Unchanged(Exception):
    """The topic already is as asked (``--if-not-exists``, ``--if-exists``): nothing to write."""


def run_create(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if any(value == "" for value in settings.values()):
        raise MetaqError("--set KEY= (an empty value) unsets an override: only for metaq topics alter")

    def change(group: Any) -> Any:
        if args.topic in group.topics:
            if args.if_not_exists:
                raise Unchanged(f"broker group {args.broker_id} already has a topic {args.topic!r}; nothing changed")
            raise MetaqError(f"broker group {args.broker_id} already has a topic {args.topic!r} (use metaq topics alter)")
        return group.with_topic(args.topic, {**settings, "numPartitions": str(args.partitions or 1)})

    return _write(args, change, f"created {args.topic}", ends_incarnation=True)


def run_alter(args: argparse.Namespace) -> int:
    if args.partitions is None and not args.set:
        raise UsageError("nothing to change: give --partitions N or --set KEY=VALUE (--set KEY= unsets an override)")
    settings = _settings(args)
    if settings.get("numPartitions") == "":
        raise MetaqError("--set numPartitions= : every topic has a partition count; it cannot be unset")

    def change(group: Any) -> Any:
        current = group.topics.get(args.topic)
        if current is None:
            raise MetaqError(f"broker group {args.broker_id} has no topic {args.topic!r} (see metaq topics list)")
        # An empty value removes the override: the key then takes each member's [system] default.
        updated = {key: value for key, value in {**current, **settings}.items() if value != ""}
        if args.partitions is not None:
            have = int(current.get("numPartitions", "1"))
            if args.partitions < have:
                raise MetaqError(f"{args.topic} has {have} partitions; partitions can only be added (their logs hold data)")
            updated["numPartitions"] = str(args.partitions)
        if updated == current:
            raise MetaqError("nothing to change: give --partitions, --set KEY=VALUE or --set KEY= for a key the topic overrides")
        return group.with_topic(args.topic, updated)

    return _write(args, change, f"altered {args.topic}")


def run_delete(args: argparse.Namespace) -> int:
    def change(group: Any) -> Any:
        if args.topic not in group.topics:
            if args.if_exists:
                raise Unchanged(f"broker group {args.broker_id} has no topic {args.topic!r}; nothing changed")
            raise MetaqError(f"broker group {args.broker_id} has no topic {args.topic!r} (see metaq topics list)")
        return group.without_topic(args.topic)

    return _write(args, change, f"deleted {args.topic} (every member deletes its partition files)", ends_incarnation=True)


def _settings(args: argparse.Namespace) -> dict[str, str]:
    from ..config import SHARED_TOPIC_KEYS, ConfigError
    from ..zk.topic_config import check_settings

    settings = parse_settings(args.set)
    unknown = [key for key in settings if key not in SHARED_TOPIC_KEYS]
    if unknown:
        raise MetaqError(f"--set: {unknown[0]}: not a shared topic key (one of {', '.join(SHARED_TOPIC_KEYS)})")
    try:
        # An empty value (unset) has nothing to parse.
        check_settings({key: value for key, value in settings.items() if value != ""}, "--set")
    except ConfigError as exc:
        raise MetaqError(str(exc)) from None
    return settings


def _write(args: argparse.Namespace, change: Any, done: str, ends_incarnation: bool = False) -> int:
    from ..config import check_topic_name
    from ..zk.group import read_members
    from ..zk.topic_config import delete_group_offsets, read_group_topics, update_group_topics
    from kazoo.exceptions import NoAuthError, NoNodeError

    try:
        check_topic_name(args.topic)
    except ValueError as exc:
        raise MetaqError(str(exc)) from None
    # The login is read once, when first needed: a password file may be a pipe (/dev/stdin),
    # which the open-file check and the wait for the members would otherwise both read.
    login = functools.cache(lambda: credentials(args))
    with zk_client(args) as (client, paths):
        try:
            members = read_members(client, paths, args.broker_id)
        except NoNodeError:
            members = None
        urls = ([members.master_url] if members and members.master_url else []) + (list(members.slaves.values()) if members else [])
        current = read_group_topics(client, paths, args.broker_id, args.timeout)
        configured = current.exists
        if members is None and not configured:
            # A typo'd id would otherwise create a configuration no broker ever serves.
            raise MetaqError(f"no broker group {args.broker_id} under {args.zk_root} (no broker ever registered as it; see metaq cluster)")
        if urls and not configured:
            # Members serving server.ini topics would drop them for a configuration naming only this one.
            raise MetaqError(f"broker group {args.broker_id} is running but has no topic configuration in ZooKeeper "
                             f"({paths.topic_config(args.broker_id)}); restart its master with this version first")
        added = _added_partitions(args, current.topics.get(args.topic))
        if added > 0 and urls:
            asyncio.run(_check_open_files(urls, added, args.timeout, login()))
        try:
            group = update_group_topics(client, paths, args.broker_id, change, security=zk_security(args, args.broker_id))
        except Unchanged as unchanged:
            print(unchanged)
            return 0
        except NoAuthError:
            raise zk_write_refused(args, f"the write of {paths.topic_config(args.broker_id)}") from None
        if ends_incarnation:
            # Kafka's rule: a topic's stored consumer offsets end with it. The group's master
            # deletes them when it applies the change (and again at a create, for a consumer
            # that ran on), but only a master that leads while it applies it: one paused, or
            # between masters in a failover, leaves them. So the tool that ends it deletes them too.
            stale = delete_group_offsets(client, paths, args.broker_id, args.topic)
            if stale:
                print(f"deleted {len(stale)} stored consumer offset(s) of {args.topic}'s partitions in broker group {args.broker_id}")
    expected = group.topics.get(args.topic)
    partitions = int(expected.get("numPartitions", "1")) if expected else None
    print(f"broker group {args.broker_id}: {done} (topic configuration version {group.version})")
    if args.wait <= 0 or not urls:
        return 0
    incarnation = group.incarnations.get(args.topic)
    late = asyncio.run(_wait_applied(urls, args.topic, partitions, incarnation, args.wait, args.timeout, login()))
    if late:
        print(f"not applied within {args.wait:g} s by: {', '.join(u.removeprefix('meta://') for u in late)}")
        return 1
    print(f"applied by every live member: {', '.join(u.removeprefix('meta://') for u in urls)}")
    return 0


def _added_partitions(args: argparse.Namespace, current: dict[str, str] | None) -> int:
    """How many partitions a create or alter adds to the group."""
    if args.action == "create":
        return 0 if current is not None else args.partitions or 1
    if args.action == "alter" and args.partitions is not None and current is not None:
        return max(0, args.partitions - int(current.get("numPartitions", "1")))
    return 0


async def _check_open_files(urls: list[str], added: int, timeout: float, creds: Any) -> None:
    """Refuse (before writing) partitions a live member cannot hold open: every member would
    otherwise apply the change and fail puts with ``Too many open files``. A member refuses such
    a change itself too (metaq/server/open_files.py); this says so before anything is written."""
    from ..server.open_files import with_headroom

    answers = await asyncio.gather(*(stats_answer(url, "", timeout, creds) for url in urls))
    for url, answer in zip(urls, answers):
        reply = answer.reply
        if reply is None or reply.get("open_files_limit") is None:
            continue  # unreachable, or a version that does not say: it refuses by itself
        limit, need = int(reply.get("open_files_limit")), int(reply.get("open_files_needed"))
        want = need + with_headroom(added)  # each new partition opens its active segment
        if want > limit:
            raise MetaqError(
                f"{url.removeprefix('meta://')} cannot hold {added} more partition(s) open: it would need about {want}"
                f" open files and its open-file limit (RLIMIT_NOFILE) is {limit}; raise its hard limit (ulimit -Hn,"
                f" systemd LimitNOFILE=) and restart it, or add fewer partitions (docs/operations.md, 'Sizing')")


async def _wait_applied(urls: list[str], topic: str, partitions: int | None, incarnation: str | None, wait: float,
                        timeout: float, creds: Any) -> list[str]:
    """The members that do not serve ``topic`` with ``partitions`` (None: not at all) of
    ``incarnation`` in time: a put acked by a master still serving the old incarnation of a
    re-created topic is deleted with it, so "applied" must mean the new one."""
    from ..protocol.messages import TopicsRequest
    from ..protocol.replies import TopicsReply

    async def applied(url: str) -> bool:
        reply = await ask(url, TopicsRequest().to_header(), timeout, creds)
        return reply is not None and TopicsReply.of(reply).serves(topic, partitions, incarnation)

    deadline = time.monotonic() + wait
    pending = list(urls)
    while pending:
        done = await asyncio.gather(*(applied(url) for url in pending))
        pending = [url for url, ok in zip(pending, done) if not ok]
        if not pending or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    return pending
