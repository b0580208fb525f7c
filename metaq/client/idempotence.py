"""The idempotent producer's numbering: a producer id, and a sequence per partition.

Every put of an idempotent producer carries ``(producer id, epoch, first sequence)``;
the broker appends a batch once and answers a retry of it as a duplicate, with the
original offsets (docs/transactions.md, "Idempotent producer"). What the client must
keep for that to hold, and where it is enforced:

* **One numbered batch of a partition in flight at a time** (``begin`` / ``try_begin``
  wait for / refuse a busy partition; ``end`` frees it). The broker remembers the last
  5 batches per producer and partition, and a later batch may never reach it before an
  earlier one that is being retried (it would be out of order).
* **A retry reuses its numbers**: a ``Numbered`` batch keeps its id, epoch and sequence
  through every attempt, to the same partition (through a failover: the partition's new
  master), so the broker can tell it is the same batch.
* **After an outcome that stays unknown the numbering starts over**: if a batch gave up
  without knowing whether it was stored, the next sequence of its partition is unknown
  too. ``end(stored=None)`` drops the producer id; the next batch asks for a new one and
  numbers from 0 (the broker treats an unknown producer's first batch as new). A batch
  known not to be stored gives its numbers back.

Thread-safe: the blocking producer numbers its first attempt on the caller's thread
(metaq/client/blocking.py), the asyncio producer in the loop thread. The lock is held
only for bookkeeping, never across I/O.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Hashable, NamedTuple

from ..txn.control import MAX_SEQUENCE


class Numbered(NamedTuple):
    """A batch's identity for the broker: the put fields of every attempt."""

    key: Hashable  # (topic, broker id, partition)
    producer_id: int
    epoch: int
    sequence: int
    count: int
    generation: int  # which producer id this was numbered under (``end`` ignores older ones)
    #: The broker's proof that the id and epoch were issued to this user (None: security off).
    token: str | None = None

    def put_fields(self) -> dict[str, int | str]:
        fields: dict[str, int | str] = {"producer_id": self.producer_id, "producer_epoch": self.epoch,
                                        "sequence": self.sequence}
        if self.token is not None:
            fields["producer_token"] = self.token
        return fields


class Sequencer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.producer_id: int | None = None
        self.epoch = 0
        self.token: str | None = None
        self._generation = 0
        self._next: dict[Hashable, int] = {}
        self._busy: set[Hashable] = set()
        #: Tasks waiting in ``begin`` for a busy partition: (loop, future).
        self._waiters: dict[Hashable, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    @property
    def has_id(self) -> bool:
        return self.producer_id is not None

    def set_id(self, producer_id: int, epoch: int, token: str | None = None) -> None:
        with self._lock:
            if self.producer_id is None:
                self.producer_id, self.epoch, self.token = producer_id, epoch, token
                self._generation += 1
                self._next.clear()

    def try_begin(self, key: Hashable, count: int) -> Numbered | None:
        """Number a batch of ``count`` messages for ``key``; None if the partition is busy or there is no id."""
        with self._lock:
            if key in self._busy or self.producer_id is None:
                return None
            return self._number(key, count)

    async def begin(self, key: Hashable, count: int) -> Numbered | None:
        """Like ``try_begin``, waiting while the partition is busy; None only if there is no id."""
        while True:
            with self._lock:
                if self.producer_id is None:
                    return None
                if key not in self._busy:
                    return self._number(key, count)
                loop = asyncio.get_running_loop()
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.setdefault(key, []).append((loop, future))
            await future

    def _number(self, key: Hashable, count: int) -> Numbered:
        assert self.producer_id is not None
        sequence = self._next.get(key, 0)
        self._next[key] = (sequence + count) & MAX_SEQUENCE
        self._busy.add(key)
        return Numbered(key, self.producer_id, self.epoch, sequence, count, self._generation, self.token)

    def end(self, numbered: Numbered, stored: bool | None) -> None:
        """The batch is done: stored (True), surely not stored (False) or unknown (None)."""
        with self._lock:
            self._busy.discard(numbered.key)
            if numbered.generation == self._generation:
                if stored is False and self._next.get(numbered.key) == (numbered.sequence + numbered.count) & MAX_SEQUENCE:
                    self._next[numbered.key] = numbered.sequence  # its numbers are free again
                elif stored is None:
                    self.producer_id = None  # numbering starts over under a new id
            waiters = self._waiters.pop(numbered.key, [])
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)


def _wake(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
