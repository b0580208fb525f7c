"""Producer ids for idempotent producers: unique in the cluster, never handed out twice.

An id is ``(broker group id << 40) | n``: the group id keeps groups apart, and ``n``
comes from a counter the group owns. The counter is handed out in blocks of
``BLOCK_SIZE``: a broker takes a block by raising the counter with one
compare-and-set, then serves ids from memory. A block taken and not used up (a
restart, a failover) is skipped, never reused: uniqueness over density.

Where the counter lives:

* with ZooKeeper: ``{root}/brokers/ids/{id}/producer_ids`` (persistent, decimal: the
  first id of the next free block), under the group's node, so it has the group's
  ACL: only the group's brokers may raise it, and a new master continues after
  whatever the old one took;
* without ZooKeeper (``zk.zkEnable=false``, a single broker): the file
  ``{dataPath}/producer-ids`` (CRC-guarded, replaced atomically, fsynced before a
  block is used).

The epoch of an idempotent producer is always 0: a restarted producer asks for a
new id instead (its old id's state expires with ``producerExpiryMs``). A producer
with a transactional id keeps its id and raises the epoch instead
(transactional_ids.py), which is what fences its older instances.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Iterable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ..txn.crcfile import read_crc_file, write_crc_file
from ..zk.paths import ZkPaths

BLOCK_SIZE = 1000
GROUP_SHIFT = 40
#: Attempts at the compare-and-set before giving up (another broker of the group raced us).
CAS_ATTEMPTS = 20
LOCAL_FILE = "producer-ids"


def producer_id(group: int, n: int) -> int:
    if not 0 <= n < 1 << GROUP_SHIFT:
        raise ValueError(f"producer id counter {n} of group {group} is exhausted")
    return (group << GROUP_SHIFT) | n


class ProducerIdAllocator:
    """Hands out ids from a block; ``take_block`` (blocking I/O) refills it."""

    def __init__(self, group: int, take_block: Callable[[], int]) -> None:
        self.group = group
        self._take_block = take_block
        self._next = 0
        self._end = 0  # the current block is [_next, _end)
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                start = await asyncio.to_thread(self._take_block)
                self._next, self._end = start, start + BLOCK_SIZE
            n, self._next = self._next, self._next + 1
        return producer_id(self.group, n)


def _update_counter(client: Any, path: str, create: Callable[[str, bytes], Any], change: Callable[[int], int]) -> tuple[int, int]:
    """Compare-and-set the counter at ``path`` (absent: 0) to ``change(value)``; ``(before, after)``."""
    for _ in range(CAS_ATTEMPTS):
        try:
            value, stat = client.get(path)
        except NoNodeError:
            try:
                create(path, str(change(0)).encode())
                return 0, change(0)
            except NodeExistsError:
                continue
        before = int(value.decode() or 0)
        after = change(before)
        if after == before:
            return before, after
        try:
            client.set(path, str(after).encode(), version=stat.version)
            return before, after
        except BadVersionError:
            continue  # another broker of the group changed it first
    raise RuntimeError(f"could not update the producer id counter at {path}: too many concurrent updates")


def zookeeper_blocks(client: Any, paths: ZkPaths, group: int, create: Callable[[str, bytes], Any]) -> Callable[[], int]:
    """``take_block`` over the group's counter node; ``create(path, value)`` makes it with the group's ACL."""
    path = paths.producer_ids(group)

    def take_block() -> int:
        start, _ = _update_counter(client, path, create, lambda value: value + BLOCK_SIZE)
        return start

    return take_block


#: After ZooKeeper lost the counter, how far past the highest id found in the logs it starts
#: again. Ids handed out but in no log yet (a producer that has not written) lie in blocks
#: taken since; 1000 blocks is more than masters take between two writes of any producer,
#: and a millionth of the id space. An id handed out twice would share the old producer's
#: sequence state: its first batches would be taken for duplicates, acked and not stored.
RESEED_SKIP = 1000 * BLOCK_SIZE


def highest_counter_in(producer_ids: Iterable[int], group: int) -> int:
    """One past the highest counter value among ``producer_ids`` of ``group`` (0 if none)."""
    mask = (1 << GROUP_SHIFT) - 1
    return max((pid & mask for pid in producer_ids if pid >> GROUP_SHIFT == group), default=-1) + 1


def raise_zookeeper_counter(client: Any, paths: ZkPaths, group: int, at_least: int, create: Callable[[str, bytes], Any]) -> int:
    """Make the group's counter at least ``at_least`` (never lowered); its value."""
    _, value = _update_counter(client, paths.producer_ids(group), create, lambda value: max(value, at_least))
    return value


def local_blocks(data_path: str | Path) -> Callable[[], int]:
    """``take_block`` over ``{dataPath}/producer-ids`` (a broker without ZooKeeper)."""
    path = Path(data_path) / LOCAL_FILE

    def take_block() -> int:
        raw = read_crc_file(path)
        start = int(raw.decode()) if raw else 0
        write_crc_file(path, str(start + BLOCK_SIZE).encode())  # fsynced before any id of the block is used
        return start

    return take_block
