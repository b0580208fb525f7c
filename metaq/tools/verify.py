"""Compare a slave's logs with its master's: ``metaq verify`` and the failover drills.

The invariant checked: **every slave's log is a byte-identical prefix of its
master's log at the same offsets.** For each topic-partition and slave:

1. read both logs' bounds (``stats {topic}`` as data: ``min_offset`` and ``max_offset``,
   the log end); the slave first, so a master that keeps appending cannot make a
   healthy slave look ahead;
2. the slave must not end past the master (``slave log_end <= master log_end``);
3. over the common range ``[max(mins), min(ends))`` the CRC32s of 4 MiB chunks
   (the ``checksum`` op, computed by each broker on its own disk) must be equal;
4. on a mismatch the differing chunk is bisected with more ``checksum`` calls,
   first to a range of at most 4 KiB (reported as the first differing byte
   range) and then down to the first differing byte.

Nothing here writes anything or registers as a replica, so it is safe against a
live group. Used by the CLI (``metaq/cli/verify.py``), the integration tests and
the failover drills.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..addresses import parse_broker_url
from ..client.connection import BrokerConnection, ConnectionClosed, Credentials
from ..protocol.messages import ChecksumRequest, TopicsRequest
from ..protocol.replies import ChecksumReply, ReplyError, TopicsReply, fetch_stats
from ..zk.group import GroupNotFound, read_live_group

CHUNK = 4 * 1024 * 1024
FINE = 4096
PIPELINE = 8


class VerifyError(Exception):
    """The group could not be checked at all (ZK unreachable, no master, ...)."""


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    slave: str  # "slave{k}"
    status: str  # ok | diverged | ahead | missing | corrupt | error
    master_range: tuple[int, int] | None = None
    slave_range: tuple[int, int] | None = None
    compared_bytes: int = 0
    diff_range: tuple[int, int] | None = None  # first differing range, <= 4 KiB
    diff_offset: int | None = None  # first differing byte
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        if self.status == "ok":
            assert self.slave_range is not None and self.master_range is not None
            return (
                f"OK: identical prefix, {self.compared_bytes} bytes compared "
                f"(slave [{self.slave_range[0]}, {self.slave_range[1]}), master ends at {self.master_range[1]})"
            )
        text = self.status.upper()
        if self.diff_range is not None:
            text += f": first difference in bytes [{self.diff_range[0]}, {self.diff_range[1]})"
            if self.diff_offset is not None:
                text += f", at byte {self.diff_offset}"
        return text + (f"; {self.detail}" if self.detail else "")


@dataclass
class VerifyReport:
    broker_id: int
    master: str
    slaves: dict[int, str]
    checks: list[PartitionCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.slaves) and all(check.ok for check in self.checks)


# --- one partition --------------------------------------------------------------------


async def log_bounds(conn: BrokerConnection, topic: str, partition: int, broker_id: int, timeout: float = 10) -> tuple[int, int] | None:
    """``(min_offset, log_end)`` of a partition on one broker, or None if it has no such log."""
    state = await log_state(conn, topic, partition, broker_id, timeout)
    return None if state is None else state[0]


async def log_state(
    conn: BrokerConnection, topic: str, partition: int, broker_id: int, timeout: float = 10
) -> tuple[tuple[int, int], int | None] | None:
    """``((min_offset, log_end), corrupt_from)`` of a partition on one broker (``corrupt_from``:
    where the first range its scrub or recovery found corrupt starts, None if none), or None
    if it has no such log."""
    try:
        stats = await fetch_stats(conn, topic, timeout)
    except ReplyError:  # e.g. no such topic on this broker
        return None
    row = stats.row(f"{topic}-{broker_id}-{partition}")
    if row is None:
        return None
    corrupt_from = int(row.get("corrupt_from", -1))
    return (int(row["min_offset"]), int(row["max_offset"])), (corrupt_from if corrupt_from >= 0 else None)


async def range_crc(conn: BrokerConnection, topic: str, partition: int, start: int, end: int, timeout: float = 60) -> int:
    request = ChecksumRequest(topic=topic, partition=partition, start=start, end=end)
    try:
        reply = ChecksumReply.of(await conn.request(request.to_header(), timeout=timeout))
    except ReplyError as exc:
        raise VerifyError(f"checksum [{start}, {end}) of {topic}-{partition} on {conn.address}: {exc}") from None
    if reply.end != end:
        raise VerifyError(f"{conn.address} no longer has bytes up to {end} of {topic}-{partition}")
    return reply.crc


async def _differs(master: BrokerConnection, slave: BrokerConnection, topic: str, partition: int, start: int, end: int) -> bool:
    a, b = await asyncio.gather(
        range_crc(master, topic, partition, start, end), range_crc(slave, topic, partition, start, end)
    )
    return a != b


async def first_difference(
    master: BrokerConnection, slave: BrokerConnection, topic: str, partition: int, start: int, end: int,
    chunk: int = CHUNK, fine: int = FINE,
) -> tuple[tuple[int, int], int] | None:
    """The first differing range (<= ``fine`` bytes) and byte in ``[start, end)``, or None if equal."""
    bad: tuple[int, int] | None = None
    chunks = [(pos, min(pos + chunk, end)) for pos in range(start, end, chunk)]
    for i in range(0, len(chunks), PIPELINE):
        window = chunks[i : i + PIPELINE]
        results = await asyncio.gather(*(_differs(master, slave, topic, partition, a, b) for a, b in window))
        for (a, b), differs in zip(window, results):
            if differs:
                bad = (a, b)
                break
        if bad is not None:
            break
    if bad is None:
        return None
    lo, hi = bad
    # Invariant: [lo, hi) differs and everything before lo is equal.
    diff_range: tuple[int, int] | None = (lo, hi) if hi - lo <= fine else None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await _differs(master, slave, topic, partition, lo, mid):
            hi = mid
        else:
            lo = mid
        if diff_range is None and hi - lo <= fine:
            diff_range = (lo, hi)
    return diff_range or (lo, hi), lo


async def compare_partition(
    master: BrokerConnection, slave: BrokerConnection, topic: str, partition: int, broker_id: int,
    slave_name: str = "slave", chunk: int = CHUNK,
) -> PartitionCheck:
    """Is the slave's log of ``topic-partition`` a byte-identical prefix of the master's?"""
    check = PartitionCheck(topic, partition, slave_name, "error")
    try:
        slave_state = await log_state(slave, topic, partition, broker_id)
        master_state = await log_state(master, topic, partition, broker_id)
        if master_state is None:
            check.status, check.detail = "error", f"the master has no log for {topic}-{partition}"
            return check
        master_bounds, master_corrupt = master_state
        check.master_range = master_bounds
        if slave_state is None:
            check.status, check.detail = "missing", f"{slave_name} has no log for {topic}-{partition}"
            return check
        slave_bounds, slave_corrupt = slave_state
        check.slave_range = slave_bounds
        # Corrupt bytes are not served, so they cannot be compared: say where they are instead.
        for who, corrupt in (("the master", master_corrupt), (slave_name, slave_corrupt)):
            if corrupt is not None:
                check.status, check.diff_offset = "corrupt", corrupt
                check.detail = (f"{who} holds corrupt bytes from offset {corrupt} (a record fails its CRC check;"
                                " not served" + (", re-fetched from the master" if who == slave_name else "") + ")")
                return check
        (s_min, s_end), (m_min, m_end) = slave_bounds, master_bounds
        start, end = max(s_min, m_min), min(s_end, m_end)
        if start < end:
            found = await first_difference(master, slave, topic, partition, start, end, chunk)
            if found is not None:
                check.status = "diverged"
                check.diff_range, check.diff_offset = found
                check.compared_bytes = found[1] - start
                check.detail = f"{slave_name} and master hold different bytes at offset {found[1]}"
                return check
            check.compared_bytes = end - start
        if s_end > m_end or s_min > m_end:
            check.status = "ahead"
            first = max(m_end, s_min)
            check.diff_range, check.diff_offset = (first, min(s_end, first + FINE)), first
            check.detail = f"{slave_name} log ends at {s_end}, past the master's log end {m_end}: not a prefix"
            return check
        check.status = "ok"
        if s_min < m_min:
            check.detail = f"bytes below {m_min} are no longer on the master and were not compared"
        return check
    except (ConnectionClosed, ConnectionError, asyncio.TimeoutError, OSError) as exc:
        check.status, check.detail = "error", f"{type(exc).__name__}: {exc}"
        return check
    except VerifyError as exc:
        check.status, check.detail = "error", str(exc)
        return check


# --- a whole group ---------------------------------------------------------------------


async def verify_urls(
    broker_id: int, master_url: str, slaves: dict[int, str], topic: str | None = None, chunk: int = CHUNK,
    creds: Credentials | None = None,
) -> VerifyReport:
    creds = creds or Credentials()
    report = VerifyReport(broker_id, master_url, slaves)
    try:
        master = await creds.open(*parse_broker_url(master_url))
    except ConnectionClosed as exc:
        raise VerifyError(f"master of broker {broker_id}: {exc}") from None
    try:
        try:
            topics = TopicsReply.of(await master.request(TopicsRequest().to_header(), timeout=10)).topics
        except ReplyError as exc:
            raise VerifyError(f"master {master_url} answered {exc}") from None
        if topic is not None:
            if topic not in topics:
                raise VerifyError(f"the master of broker {broker_id} has no topic {topic!r}")
            topics = {topic: topics[topic]}
        for slave_id, url in slaves.items():
            name = f"slave{slave_id}"
            try:
                slave = await creds.open(*parse_broker_url(url))
            except (ConnectionClosed, ValueError) as exc:
                for name_, parts in sorted(topics.items()):
                    for p in range(parts):
                        report.checks.append(PartitionCheck(name_, p, name, "error", detail=str(exc)))
                continue
            try:
                for name_, parts in sorted(topics.items()):
                    for p in range(parts):
                        report.checks.append(await compare_partition(master, slave, name_, p, broker_id, name, chunk))
            finally:
                slave.close()
    finally:
        master.close()
    return report


async def verify_group(
    zk_connect: str, broker_id: int, zk_root: str = "/meta", topic: str | None = None,
    chunk: int = CHUNK, timeout: float = 10.0, creds: Credentials | None = None,
) -> VerifyReport:
    """Find the group in ZooKeeper and compare every slave with the master."""
    try:
        group = await asyncio.to_thread(read_live_group, zk_connect, zk_root, broker_id, timeout)
    except GroupNotFound as exc:  # callers retry VerifyError (drill, demo)
        raise VerifyError(str(exc)) from None
    assert group.master_url is not None  # read_live_group's promise
    return await verify_urls(broker_id, group.master_url, group.slaves, topic, chunk, creds)
