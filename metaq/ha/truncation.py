"""Where a rejoining broker's log stops agreeing with the master's.

First choice, the epoch way (Kafka's KIP-101/279): ask the master where our
latest epoch ends in its log; if it never saw that epoch, the end of the epoch
it did see, taken in our own log, is the other bound. Everything of ours past
that point was written by us alone and is cut.

Then a cross-check, because a wrong cut is silent data loss: the CRC of our
last bytes before the cut point must equal the master's over the same range.
If it does not (or the epochs cannot answer: no common epoch, a log written
before epochs were kept), fall back to comparing CRCs of prefixes with the
master (``checksum`` op) and bisecting over our record boundaries for the
longest common prefix (from where both logs still have bytes: the master's
retention may have deleted what we still hold). Slower, but it needs nothing but the bytes.

The cut point is always a record boundary of our log, and our log up to it is
byte-identical to the master's: after truncation the prefix invariant holds.

Who answers: the ``epoch_end`` answer is used only from the acting master of
``master_epoch``, the epoch the asker read from ZooKeeper (answerer.py: NotTheMaster
otherwise). A deposed master, or a slave at the master's old address, answers from
another log's history; cut to it, we would drop bytes the group's master holds.

Defense in depth: a cut is trusted only when a checksum over a non-empty
range ending at it agreed (an empty range verifies nothing), and a cut that no
agreeing range backs is refused (TruncationRefused) when it would go below ``floor``,
the committed offset a master has told us: a peer that answers as master but does
not hold our committed bytes (a fake, or a wrong config) never makes us throw them away.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..protocol.messages import ChecksumRequest, EpochEndRequest, OffsetRequest
from ..record import walk_records
from .answerer import check_master_answer

if TYPE_CHECKING:
    from ..client.connection import BrokerConnection
    from ..store.log import PartitionLog
    from .epochs import EpochCache

log = logging.getLogger(__name__)

#: Bytes compared by the cross-check just before the epoch-derived cut point.
CROSS_CHECK_BYTES = 1024 * 1024
#: Largest range one checksum request covers (the broker's limit is 256 MiB).
CHECKSUM_CHUNK = 64 * 1024 * 1024


class TruncationRefused(ConnectionError):
    """The master proposes a cut below our committed offset that no byte comparison backs."""


async def divergence_point(
    conn: "BrokerConnection", topic: str, partition: int, log_: "PartitionLog", cache: "EpochCache", floor: int = 0,
    *, master_epoch: int,
) -> int:
    """The offset to truncate our log to (== log_end if nothing diverges). Raises NotTheMaster
    when the peer answers ``epoch_end`` as anything but the acting master of ``master_epoch``."""
    if log_.log_end <= log_.min_offset:
        return log_.log_end
    end = None
    # Asked even without a history of ours (a log kept before epochs were): its answer says who
    # answers, and no byte comparison below runs against a peer that is not the master.
    reply = await conn.request(
        EpochEndRequest(topic=topic, partition=partition, epoch=cache.latest_epoch).to_header(), timeout=10
    )
    check_master_answer(reply, conn.address, f"epoch_end {topic}-{partition}", master_epoch)
    if not reply.ok:
        raise ConnectionError(f"epoch_end {topic}-{partition}: {reply.code} {reply.message}")
    if cache.entries:
        found, master_end = int(reply["epoch"]), int(reply["end_offset"])
        if found >= 0:
            end = master_end
            if found < cache.latest_epoch:
                end = min(end, cache.end_offset_for(found, log_.log_end)[1])
            end = max(log_.min_offset, min(end, log_.log_end))
    if end is not None and await _agrees_before(conn, topic, partition, log_, end):
        return end
    log.warning("%s-%d: epochs give no trustworthy cut point; comparing bytes with the master", topic, partition)
    cut, verified = await _longest_common_prefix(conn, topic, partition, log_)
    if not verified and cut < min(floor, log_.log_end):
        raise TruncationRefused(
            f"{topic}-{partition}: the master at {conn.address} shares none of our bytes, and cutting at {cut} "
            f"would drop committed bytes up to {floor}; refusing to truncate (is it really our group's master?)"
        )
    return cut


async def _ranges_agree(conn: "BrokerConnection", topic: str, partition: int, log_: "PartitionLog", start: int, end: int) -> bool:
    """Whether our bytes in [start, end) equal the master's, chunk by chunk."""
    pos = start
    while pos < end:
        stop = min(end, pos + CHECKSUM_CHUNK)
        reply = await conn.request(
            ChecksumRequest(topic=topic, partition=partition, start=pos, end=stop).to_header(), timeout=60
        )
        if not reply.ok and reply.get("reason") == "corrupt":
            # The master cannot vouch for a range its scrub found corrupt (it serves it to no one
            # and repairs it from a slave, maybe from us): compare around it, never cut for it.
            # Our copy of it passed its CRC check when we fetched it.
            bad_start, bad_end = int(reply["corrupt_start"]), int(reply["corrupt_end"])
            if not bad_start < stop or not pos < bad_end:
                return False  # not a range of this request: an answer we cannot use
            return (await _ranges_agree(conn, topic, partition, log_, pos, max(pos, bad_start))
                    and await _ranges_agree(conn, topic, partition, log_, min(end, bad_end), end))
        if not reply.ok or int(reply["end"]) != stop:
            return False
        # Up to 64 MiB of our log: off the event loop, as the broker's own checksum op does.
        if int(reply["crc"]) != await asyncio.to_thread(log_.crc32, pos, stop):
            return False
        pos = stop
    return True


async def _master_min_offset(conn: "BrokerConnection", topic: str, partition: int) -> int:
    reply = await conn.request(OffsetRequest(topic=topic, partition=partition, offset=0).to_header(), timeout=10)
    if not reply.ok:
        raise ConnectionError(f"offset {topic}-{partition}: {reply.code} {reply.message}")
    return int(reply["min_offset"])


async def _agrees_before(conn: "BrokerConnection", topic: str, partition: int, log_: "PartitionLog", end: int) -> bool:
    master_min = await _master_min_offset(conn, topic, partition)
    if master_min > end:
        return False  # the master no longer has these bytes: nothing to check against
    start = max(log_.min_offset, end - CROSS_CHECK_BYTES, master_min)
    if start >= end:
        return False  # an empty range verifies nothing
    return await _ranges_agree(conn, topic, partition, log_, start, end)


async def _longest_common_prefix(
    conn: "BrokerConnection", topic: str, partition: int, log_: "PartitionLog"
) -> tuple[int, bool]:
    """Largest record boundary b of ours with our [s, b) == the master's [s, b), and whether a
    non-empty range verified it (False: nothing in common was found, b is our log start).

    s is where both logs still have bytes: the master's retention may have deleted
    segments that we still hold, and what lies before s can no longer be compared
    (it was replicated from a master once; the prefix invariant vouches for it).
    """
    common_start = max(log_.min_offset, await _master_min_offset(conn, topic, partition))
    # boundaries[0] is always safe to cut at (all of ours goes aside); the rest are candidates.
    boundaries = [log_.min_offset] + [b for b in _record_boundaries(log_) if b > common_start]
    low, high = 0, len(boundaries) - 1  # boundaries[low] agrees; find the last that does
    while low < high:
        mid = (low + high + 1) // 2
        if await _ranges_agree(conn, topic, partition, log_, common_start, boundaries[mid]):
            low = mid
        else:
            high = mid - 1
    return boundaries[low], low > 0


def _record_boundaries(log_: "PartitionLog") -> list[int]:
    ends: list[int] = []
    for run in walk_records(log_.read, log_.min_offset, log_.log_end, boundaries_only=True):
        ends.extend(run.ends)
    return ends
