"""What the console shows, collected in one place: the cluster, topics, consumer groups, takeovers.

Theory of operation: one ``Collector`` per console process owns one ZooKeeper session and
builds a ``snapshot`` (a JSON-able dict) at most every ``interval`` seconds, sooner when a
ZooKeeper watch fires (a master or slave node comes or goes, an epoch node changes), so a
failover reaches the page in the time ZooKeeper takes to notice it, not a polling period
later. Pages never ask brokers themselves: every open page reads the same latest snapshot
(server-sent events), so ten open pages cost the brokers what one does.

Every figure is the one the CLI computes, by the CLI's own functions:

- the cluster table, its verdicts and its exit code: ``metaq cluster``'s ``zk_members``,
  ``apply_stats``, ``verdict`` and ``exit_code`` (metaq/cli/cluster.py);
- topics and their settings: the groups' topic configurations in ZooKeeper, as
  ``metaq topics list`` reads them, with each partition's offsets from its master's
  ``stats offsets`` (``metaq topics describe`` asks the same rows);
- consumer groups: ``metaq groups``' ``read_rows`` and ``live_members``; the lag in
  bytes here is ``groups describe``'s (the readable end minus where the group is); the
  lag in messages, which walks the records, is computed only when a page asks for one
  group (``describe_group``, the very function ``groups describe`` prints).

Cost at scale: a cycle asks each broker for its stats (two requests per master, one per
slave, on one connection kept per broker: links.py) and reads one ZooKeeper node per
consumer group partition; the lag history keeps
``HISTORY_POINTS`` numbers per (group, topic), not per partition.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..cli.admin import Answer, sync_set_json
from ..cli.cluster import NO_MASTER, Member, apply_stats, exit_code, verdict, zk_members
from .links import BrokerLinks

log = logging.getLogger(__name__)

#: Lag samples kept per (consumer group, topic): five minutes at one cycle a second.
HISTORY_POINTS = 300
#: Takeovers remembered (newest last).
MAX_TAKEOVERS = 200


@dataclass
class Takeover:
    """A change of a group's epoch the console saw happen."""

    broker_id: int
    epoch: int
    at_ms: int
    new_master: str | None
    old_master: str | None
    why: str
    #: the new master's replication lag (bytes, all partitions) in the cycle before it took over
    lag_bytes_at_takeover: int | None
    #: the old master's log end per partition in the cycle before: what it holds past the new
    #: epoch's start is what it moves aside when it follows
    old_log_ends: dict[str, int] = field(default_factory=dict)


class Collector:
    def __init__(self, zk_connect: str, zk_root: str, creds: Any, timeout: float = 2.0, interval: float = 1.0) -> None:
        from ..zk.paths import ZkPaths

        self.zk_connect, self.zk_root, self.creds = zk_connect, zk_root, creds
        self.timeout, self.interval = timeout, interval
        self.paths = ZkPaths(zk_root)
        self.links = BrokerLinks(creds, timeout)
        self.snapshot: dict[str, Any] = {}
        self.takeovers: collections.deque[Takeover] = collections.deque(maxlen=MAX_TAKEOVERS)
        self._lag_history: dict[tuple[str, str], collections.deque[tuple[int, int]]] = {}
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None
        self.client: Any = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> "Collector":
        from ..zk.session import zk_session

        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
        self._loop = asyncio.get_running_loop()
        self._session = zk_session(self.zk_connect, 10)
        self.client = await asyncio.to_thread(self._session.__enter__)  # ZooKeeperUnreachable: one line
        await self._cycle()
        self._task = asyncio.ensure_future(self._run())
        return self

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.links.close()
        if self._session is not None:
            await asyncio.to_thread(self._session.__exit__, None, None, None)

    def _poke(self, *_event: Any) -> None:
        """A kazoo watch (on kazoo's thread): collect again now."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._cycle()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # ZooKeeper away: the page says so and the loop goes on
                log.warning("console: collecting failed: %r", exc)
                self.snapshot = {**self.snapshot, "at_ms": _now_ms(), "error": f"cannot read the cluster: {exc!r}"}
                await self._publish()

    async def wait_newer(self, seen_at: int, timeout: float) -> dict[str, Any]:
        """The snapshot once it is newer than ``seen_at`` (or the current one after ``timeout``)."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.snapshot.get("seq", 0) > seen_at), timeout)
            except asyncio.TimeoutError:
                pass
        return self.snapshot

    async def _publish(self) -> None:
        self.snapshot["seq"] = self.snapshot.get("seq", 0) + 1
        async with self._changed:
            self._changed.notify_all()

    # --- one cycle ---------------------------------------------------------------------------

    async def _cycle(self) -> None:
        members = await asyncio.to_thread(self._read_members)
        urls = sorted({m.url for m in members if m.state != NO_MASTER})
        masters = sorted({m.url for m in members if m.role == "master" and m.state != NO_MASTER})
        self.links.keep_only(set(urls))
        general, offsets = await asyncio.gather(
            asyncio.gather(*(self.links.stats(url, "") for url in urls)),
            asyncio.gather(*(self.links.stats(url, "offsets") for url in masters)),
        )
        answers = dict(zip(urls, general))
        apply_stats(members, answers)
        problems = verdict(members, self.zk_root)
        offset_rows = {url: _offset_rows(answer) for url, answer in zip(masters, offsets)}
        groups = self._groups(members, answers, offset_rows)
        topics, consumer_groups = await asyncio.to_thread(self._read_topics_and_consumers, groups, offset_rows)
        previous = self.snapshot
        self._note_takeovers(previous.get("groups", []), groups)
        self.snapshot = {
            "seq": previous.get("seq", 0),
            "at_ms": _now_ms(),
            "zk": self.zk_connect,
            "zk_root": self.zk_root,
            "healthy": not problems,
            "exit_code": exit_code(problems),
            "problems": problems,
            "warnings": [w for group in groups for w in group["warnings"]],
            "groups": groups,
            "topics": topics,
            "consumer_groups": consumer_groups,
        }
        await self._publish()

    def _read_members(self) -> list[Member]:
        members = zk_members(self.client, self.paths)
        # Watches (set again each cycle; kazoo keeps one per path and function): a member
        # node or an epoch changing wakes the loop at once.
        self.client.get_children_async(self.paths.broker_ids(), watch=self._poke)
        for broker_id in sorted({m.broker_id for m in members}):
            self.client.get_children_async(self.paths.broker(broker_id), watch=self._poke)
            self.client.exists_async(self.paths.epoch(broker_id), watch=self._poke)
        return members

    def _groups(self, members: list[Member], answers: dict[str, Answer], offset_rows: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        by_group: dict[int, list[Member]] = collections.defaultdict(list)
        for member in members:
            by_group[member.broker_id].append(member)
        groups = []
        for broker_id, group in sorted(by_group.items()):
            master = group[0]  # zk_members lists the master (or its "(none)" row) first
            reply = answers.get(master.url).reply if answers.get(master.url) is not None else None
            mode = str(reply.get("replication_mode", "?")) if reply is not None else ("sync" if master.sync_set not in ("-", "?") else "?")
            partitions = [
                {"slave": f"slave{slave_id}", "partition": name, "lag_bytes": int(row.get("lag_bytes", 0)),
                 "lag_messages": int(row.get("lag_messages", 0)), "lag_ms": float(row.get("lag_ms", 0)),
                 "approx": bool(row.get("approx", False))}
                for slave_id, name, row in (reply.slave_rows() if reply is not None else [])
            ]
            sync_set = sync_set_json(master.sync_set)
            warnings = []
            if master.state != NO_MASTER and len(group) == 1:
                warnings.append(f"broker group {broker_id}: no slave registered: nothing to fail over to")
            if mode == "sync" and sync_set == [] and master.state != NO_MASTER:
                warnings.append(f"broker group {broker_id}: the sync set is empty: acked writes are on the master alone")
            for slave in group[1:]:
                if mode == "sync" and sync_set is not None and slave.role not in sync_set:
                    warnings.append(f"broker group {broker_id}: {slave.role} ({slave.url}) is out of the sync set: "
                                    "acks do not wait for it, and it may not take over")
                if slave.state not in ("up",) and not slave.stopped:
                    warnings.append(f"broker group {broker_id}: {slave.role} ({slave.url}) is {slave.state}")
            groups.append({
                "broker_id": broker_id, "epoch": master.epoch, "mode": mode, "sync_set": sync_set,
                "master": _member_json(master), "slaves": [_member_json(m) for m in group[1:]],
                "partitions": sorted(partitions, key=lambda p: (p["partition"], p["slave"])),
                "problems": verdict(group, self.zk_root),
                "warnings": warnings,
                "log_ends": {name: int(row.get("max_offset", 0)) for name, row in offset_rows.get(master.url, {}).items()},
                "handover": self._handover_pending(broker_id),
            })
        return groups

    def _handover_pending(self, broker_id: int) -> bool:
        try:
            return self.client.exists(self.paths.handover(broker_id)) is not None
        except Exception:
            return False

    def _read_topics_and_consumers(self, groups: list[dict[str, Any]], offset_rows: dict[str, dict[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        from ..cli.groups import _children, live_members, read_rows
        from ..cli.topics import _group_ids
        from ..zk.topic_config import read_group_topics

        masters = {g["broker_id"]: g["master"]["url"] for g in groups}
        topics = []
        ends: dict[tuple[str, str], dict[str, Any]] = {}
        for broker_id in _group_ids(self.client, self.paths):
            rows = offset_rows.get(masters.get(broker_id, ""), {})
            for name, settings in sorted(read_group_topics(self.client, self.paths, broker_id, self.timeout).topics.items()):
                count = int(settings.get("numPartitions", "1"))
                parts = []
                for n in range(count):
                    row = rows.get(f"{name}-{broker_id}-{n}")
                    part = {"name": f"{broker_id}-{n}", "min_offset": None, "max_offset": None, "committed": None, "size": None}
                    if row is not None:
                        part.update(min_offset=int(row["min_offset"]), max_offset=int(row["max_offset"]),
                                    committed=int(row.get("committed", row["max_offset"])),
                                    size=int(row["max_offset"]) - int(row["min_offset"]))
                    ends[(name, part["name"])] = part
                    parts.append(part)
                topics.append({"broker_id": broker_id, "topic": name, "partitions": count, "settings": dict(sorted(settings.items())),
                               "size": sum(p["size"] or 0 for p in parts), "parts": parts})
        now = _now_ms()
        consumers = []
        for group in _children(self.client, self.paths.consumers()):
            members = live_members(self.client, self.paths, group)
            group_topics = []
            for topic in _children(self.client, f"{self.paths.consumer_group(group)}/offsets"):
                partitions = []
                for row in read_rows(self.client, self.paths, group, topic):
                    bounds = ends.get((topic, row.name), {})
                    end, earliest = bounds.get("committed"), bounds.get("min_offset")
                    lag = None
                    if end is not None and earliest is not None:
                        start = earliest if row.committed is None else max(row.committed, earliest)
                        lag = max(0, end - start)
                    partitions.append({"partition": row.name, "committed": row.committed, "end": end, "lag_bytes": lag,
                                       "owner": self._owner(group, topic, row.name)})
                # A partition whose master gave no figures leaves the total unknown (a gap in
                # the sparkline), never a made-up 0.
                known = [p["lag_bytes"] for p in partitions]
                total = None if None in known else sum(known)
                history = self._lag_history.setdefault((group, topic), collections.deque(maxlen=HISTORY_POINTS))
                history.append((now, total))
                group_topics.append({"topic": topic, "lag_bytes": total, "partitions": partitions, "history": list(history)})
            consumers.append({"group": group, "members": members, "topics": group_topics})
        return topics, consumers

    def _owner(self, group: str, topic: str, partition: str) -> str | None:
        from kazoo.exceptions import NoNodeError

        try:
            return self.client.get(self.paths.owner(group, topic, partition))[0].decode("utf-8", "replace") or None
        except NoNodeError:
            return None

    # --- takeovers -----------------------------------------------------------------------------

    def _note_takeovers(self, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
        """Record each group whose epoch grew since the last cycle: who, when, why, the lag then."""
        old = {g["broker_id"]: g for g in before}
        for group in after:
            prior = old.get(group["broker_id"])
            if prior is None or group["epoch"] is None or prior["epoch"] is None or group["epoch"] <= prior["epoch"]:
                continue
            new_url = group["master"]["url"] if group["master"]["state"] != NO_MASTER else None
            old_url = prior["master"]["url"] if prior["master"]["state"] != NO_MASTER else None
            if prior.get("handover"):
                why = "hand-over (metaq promote)"
            elif old_url is None or prior["master"]["state"] != "up":
                why = f"the master was {prior['master']['state'] if old_url else 'gone'}"
            else:
                why = "the master lost its ZooKeeper session"
            lag = next((s["lag_bytes"] for s in prior["slaves"] if s["url"] == new_url), None)
            self.takeovers.append(Takeover(group["broker_id"], group["epoch"], _now_ms(), new_url, old_url, why, lag,
                                           dict(prior.get("log_ends", {}))))

    async def history(self) -> list[dict[str, Any]]:
        """Per group, each epoch: where it starts in each partition (its master's epoch history),
        when, which member, why, the lag then and the bytes the old master truncated, from the
        takeover records the brokers keep in ZooKeeper (metaq/ha/failover_record.py), else from
        what this console saw happen. A record is what a broker says of itself: one naming an
        epoch the group's history does not hold is shown flagged (``doubt``), not hidden."""
        from ..cli.admin import ask_answer
        from ..protocol.messages import EpochsRequest
        from ..protocol.replies import EpochsReply, ReplyError

        snapshot = self.snapshot
        out = []
        for group in snapshot.get("groups", []):
            broker_id, url = group["broker_id"], group["master"]["url"]
            starts: dict[int, dict[str, int]] = collections.defaultdict(dict)
            problem = None
            names = sorted(group.get("log_ends", {}))
            for name in names:
                topic, _broker, number = name.rsplit("-", 2)  # {topic}-{brokerId}-{n}; a topic may hold "-"
                answer = await ask_answer(url, EpochsRequest(topic=topic, partition=int(number)).to_header(), self.timeout, self.creds)
                if answer.reply is None:
                    problem = answer.problem
                    break
                try:
                    for epoch, start in EpochsReply.of(answer.reply).entries:
                        starts[int(epoch)][name] = int(start)
                except ReplyError as exc:
                    problem = str(exc)
                    break
            seen = {t.epoch: t for t in self.takeovers if t.broker_id == broker_id}
            epoch_node = await asyncio.to_thread(self._epoch_node, broker_id)
            records = await asyncio.to_thread(self._records, broker_id)
            # The epochs the group's history vouches for: its master's (when it answered for
            # partitions) and the epoch node's; a record outside them is flagged.
            known = set(starts) if names and problem is None else None
            rows = []
            for epoch in sorted(set(starts) | set(seen) | set(records), reverse=True):
                takeover = seen.get(epoch)
                row: dict[str, Any] = {"epoch": epoch, "starts": starts.get(epoch, {}), "at_ms": None, "master": None, "why": None,
                                       "reason": None, "previous_master": None, "lag_bytes_at_takeover": None,
                                       "truncated_bytes": None, "truncated": {}, "observed": takeover is not None,
                                       "reported": False, "doubt": None}
                if takeover is not None:
                    row.update(at_ms=takeover.at_ms, master=takeover.new_master, why=takeover.why, previous_master=takeover.old_master,
                               lag_bytes_at_takeover=takeover.lag_bytes_at_takeover,
                               truncated_bytes=sum(max(0, end - starts.get(epoch, {}).get(name, end))
                                                   for name, end in takeover.old_log_ends.items()) if epoch in starts else None)
                if epoch in records:
                    row.update(_reported(epoch, records[epoch], known, epoch_node))
                if epoch_node is not None and epoch == epoch_node[0]:
                    row["master"] = row["master"] or epoch_node[1]
                    row["at_ms"] = row["at_ms"] or epoch_node[2]
                rows.append(row)
            out.append({"broker_id": broker_id, "epoch": group["epoch"], "master": url, "problem": problem, "epochs": rows})
        return out

    def _records(self, broker_id: int) -> dict[int, dict[str, Any]]:
        from kazoo.exceptions import KazooException

        from ..ha.failover_record import read_records

        try:
            return read_records(self.client, self.paths, broker_id)
        except KazooException as exc:
            log.warning("could not read the takeover records of group %d: %s", broker_id, exc)
            return {}

    def _epoch_node(self, broker_id: int) -> tuple[int, str | None, int] | None:
        """``(epoch, the master that took it, when ZooKeeper wrote it)`` from the group's epoch node."""
        from kazoo.exceptions import NoNodeError

        from ..zk.paths import decode_epoch

        try:
            data, stat = self.client.get(self.paths.epoch(broker_id))
            epoch, leader = decode_epoch(data)
        except (NoNodeError, ValueError):
            return None
        return epoch, leader, int(stat.mtime)


def _reported(epoch: int, entry: dict[str, Any], known: set[int] | None,
              epoch_node: tuple[int, str | None, int] | None) -> dict[str, Any]:
    """A history row's fields from the takeover record of ``epoch`` (metaq/ha/failover_record.py),
    with ``doubt`` saying where it disagrees with what vouches for the group's epochs: the epoch
    node (written only by the group's election transaction) and the master's epoch history."""
    record, truncated = entry["record"], entry["truncated"]
    fields: dict[str, Any] = {"truncated": {str(k): v.get("partitions", {}) for k, v in truncated.items()}}
    cut = [n for v in truncated.values() for n in (v.get("partitions") or {}).values() if isinstance(n, int)]
    if cut or truncated:
        fields["truncated_bytes"] = sum(cut)
    if record:
        fields.update(reported=True, at_ms=record.get("at_ms"), master=record.get("url"), why=record.get("why"),
                      reason=record.get("reason"), previous_master=record.get("previous_master"),
                      lag_bytes_at_takeover=record.get("lag_bytes"))
    doubts = []
    if entry["malformed"]:
        doubts.append(f"unreadable: {', '.join(entry['malformed'])}")
    if record and record.get("epoch") != epoch:
        doubts.append(f"the record names epoch {record.get('epoch')}")
    if record and isinstance(record.get("previous_epoch"), int) and record["previous_epoch"] >= epoch:
        doubts.append(f"its previous epoch {record['previous_epoch']} is not older")
    if epoch_node is not None and epoch > epoch_node[0]:
        doubts.append(f"the group's epoch node is at {epoch_node[0]}")
    elif epoch_node is not None and epoch == epoch_node[0] and record and record.get("url") != epoch_node[1]:
        doubts.append(f"the epoch node names {epoch_node[1]} as its master")
    elif known is not None and epoch not in known:
        doubts.append("not in the master's epoch history (no write of this epoch survives, or the record is wrong)")
    fields["doubt"] = "; ".join(doubts) or None
    return fields


def _offset_rows(answer: Answer) -> dict[str, dict[str, Any]]:
    if answer.reply is None:
        return {}
    return {name: row for name, row in answer.reply.pairs if isinstance(row, dict) and "max_offset" in row}


def _member_json(member: Member) -> dict[str, Any]:
    return {**asdict(member), "sync_set": sync_set_json(member.sync_set)}


def _now_ms() -> int:
    return int(time.time() * 1000)
