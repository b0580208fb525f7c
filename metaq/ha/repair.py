"""A master puts its own corrupt bytes back from a slave (metaq/store/scrub.py found them).

A slave's log is a byte-identical prefix of its master's at the same offsets (metaq/ha/replica.py),
so a range of the master's log that fails its CRC checks is, on any slave that has it, the bytes
the master once wrote. The master asks its registered slaves in turn (over ``open_peer``:
authenticated as the group's master when security is on) with ordinary ``get`` requests, and
takes the answer only if it is exactly the range, starts at the asked offset every time and is
made of whole records that pass every check (``PartitionLog.repair_corrupt`` checks it again
before it writes). A slave serves only what it has as committed, so a range it lacks is simply
not offered; the range then stays unserved (docs/operations.md, "Corruption").
"""

from __future__ import annotations

import asyncio
import logging

from ..protocol import commands as c
from ..protocol.messages import GetRequest
from ..zk.group import read_members
from ..zk.paths import ZkPaths
from .host import BrokerHost
from .peers import open_peer

log = logging.getLogger(__name__)


async def range_from(broker: BrokerHost, url: str, topic: str, partition: int, start: int, end: int) -> bytes | None:
    """The bytes ``[start, end)`` of a partition as the broker at ``url`` serves them, or None."""
    try:
        conn = await open_peer(broker, url, None, timeout=5)
    except (OSError, ValueError) as exc:
        log.info("repair of %s-%d: %s unreachable: %s", topic, partition, url, exc)
        return None
    try:
        data = bytearray()
        while start + len(data) < end:
            offset = start + len(data)
            request = GetRequest(topic=topic, partition=partition, offset=offset, max_size=end - offset)
            reply = await conn.request(request.to_header(), timeout=30)
            # Only what answers exactly the asked offset continues the range.
            if reply.code != c.OK or reply.get("offset") != offset or not reply.body:
                log.info("repair of %s-%d: %s answered %s %s for offset %d", topic, partition, url, reply.code,
                         reply.message or f"{len(reply.body)} bytes", offset)
                return None
            data += reply.body[: end - offset]
        return bytes(data)
    except (OSError, asyncio.TimeoutError) as exc:
        log.info("repair of %s-%d from %s failed: %s", topic, partition, url, exc)
        return None
    finally:
        conn.close()


async def repair_from_slaves(broker: BrokerHost, topic: str, partition: int, start: int, end: int) -> bool:
    """Put a master's corrupt range back from the first registered slave that has it whole."""
    if (topic, partition) not in broker.store.logs():
        return False
    # Through the partition's owner: its transaction state is rebuilt once the bytes are back.
    owner = broker.partitions.get(topic, partition)
    members = await asyncio.to_thread(read_members, broker.registry.client, ZkPaths(broker.config.zk.root),
                                      broker.config.broker_id)
    for slave_id, url in members.slaves.items():
        data = await range_from(broker, url, topic, partition, start, end)
        if data is not None and owner.repair_corrupt(start, data):
            log.warning("%s-%d: corrupt bytes [%d, %d) put back from slave%d (%s)", topic, partition, start, end,
                        slave_id, url)
            return True
    # Said once at ERROR by the scrub when it found the range; each retry (every pass) only at INFO.
    log.info("%s-%d: no slave could give back the corrupt bytes [%d, %d) yet; they stay unserved", topic, partition,
             start, end)
    return False
