"""Long-poll support: fetches parked at a partition's end until it moves.

A consumer fetch waits for the partition's *committed* end to move, a slave's
fetch for the *log* end; both are woken by ``notify`` (an append, the broker
stopping) or by their partition's drop (``Partitions.drop``: a partition's parked
fetches are held by it, ``ParkedFetches``, and go with it), and re-check their own
condition, so one mechanism serves both. A move of the committed offset or the flushed end alone
(``notify_committed``) wakes only the fetches watching with ``on_commit``
(consumers'): a slave's fetch finds nothing new in it (a sync master's commit
follows every put, and would wake the slave's just-parked fetch for nothing).

A parked fetch is a plain callback, called by ``notify`` itself: the append (or
commit, or flush) that gives a fetch its data also reads and writes its reply, with
no task and no turn of the event loop in between. On a sync master that is the first
leg of every ack's round trip (docs/sync-replication.md, "The round trip").

While a connection processes one read of requests (``hold`` .. ``release``), notifies
are gathered and delivered at its end: pipelined puts then wake a parked fetch once,
with all of their bytes, instead of once per put. The connection writes that read's
replies first and releases after (connection.py ``_process_batch``): an ack that does
not wait for a slave leaves before the slave's reply is built and the slave woken; a
sync ack waits for the slave's report anyway.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable, Iterator, Protocol

log = logging.getLogger(__name__)

Woken = Callable[[], None]


class ParkedFetches:
    """The fetches parked on one partition, held by the partition (``Partition.parked``): a
    partition dropped takes them along, and wakes them as it goes (``wake``)."""

    __slots__ = ("name", "watchers", "log_end_watchers")

    def __init__(self, name: str) -> None:
        self.name = name
        #: Woken by every notify (consumers' fetches).
        self.watchers: dict[int, Woken] = {}
        #: Woken by ``notify`` but not by ``notify_committed`` (slaves' fetches).
        self.log_end_watchers: dict[int, Woken] = {}

    def wake(self, everyone: bool) -> None:
        """Call the fetches waiting (only consumers' unless ``everyone``), slaves' first (an
        append's bytes on their way to the sync set). Each is taken out first: a fetch that
        finds nothing for it yet watches again, for the next notify."""
        for slaves in (True, False) if everyone else (False,):
            watching = self.log_end_watchers if slaves else self.watchers
            if not watching:
                continue
            if slaves:
                self.log_end_watchers = {}
            else:
                self.watchers = {}
            for woken in watching.values():
                try:
                    woken()
                except Exception:  # one fetch's bug must not fail the put, flush or drop that woke it
                    log.exception("error answering a parked fetch of %s", self.name)


class ParkingPartitions(Protocol):
    """Where each partition's parked fetches live (metaq.server.partitions.Partitions)."""

    def parking(self, topic: str, partition: int) -> ParkedFetches:
        """The partition's parked fetches, to park one (made at the first)."""

    def parked(self, topic: str, partition: int) -> ParkedFetches | None:
        """The partition's parked fetches, if it is open and ever had one (never opens it)."""

    def every_parked(self) -> Iterator[ParkedFetches]: ...


class EndWaiters:
    """Parks fetches on their partition's ``ParkedFetches`` and wakes them; keeps only what is
    broker-wide: the watch ids and the notifies gathered while a connection holds."""

    def __init__(self, partitions: ParkingPartitions) -> None:
        self._partitions = partitions
        self._ids = itertools.count()
        self._held = 0
        #: Partitions notified while held, in order (a dict: each once); True once a ``notify``
        #: (not only ``notify_committed``) is among them. Empty between reads.
        self._pending: dict[tuple[str, int], bool] = {}

    def hold(self) -> None:
        """Gather notifies until the matching ``release`` (holds nest)."""
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        if not self._held and self._pending:
            pending, self._pending = self._pending, {}
            for (topic, partition), everyone in pending.items():
                self._wake(topic, partition, everyone)

    def watch(self, topic: str, partition: int, woken: Woken, on_commit: bool = True) -> Callable[[], None]:
        """Call ``woken()`` once, at the partition's next ``notify`` (or ``notify_committed``
        with ``on_commit``); returns what withdraws it."""
        fetches = self._partitions.parking(topic, partition)
        watcher_id = next(self._ids)
        (fetches.watchers if on_commit else fetches.log_end_watchers)[watcher_id] = woken

        def withdraw() -> None:
            # The table it is in now (a wake swaps them): popping from both costs no more.
            fetches.watchers.pop(watcher_id, None)
            fetches.log_end_watchers.pop(watcher_id, None)

        return withdraw

    def notify(self, topic: str, partition: int) -> None:
        """The partition's log end moved (or the broker stops): wake every fetch."""
        if self._held:
            self._pending[(topic, partition)] = True
            return
        self._wake(topic, partition, True)

    def notify_committed(self, topic: str, partition: int) -> None:
        """Only the committed offset or the flushed end moved: wake the fetches watching ``on_commit``."""
        if self._held:
            self._pending.setdefault((topic, partition), False)
            return
        self._wake(topic, partition, False)

    def _wake(self, topic: str, partition: int, everyone: bool) -> None:
        fetches = self._partitions.parked(topic, partition)
        if fetches is not None:
            fetches.wake(everyone)

    def notify_all(self) -> None:
        for fetches in self._partitions.every_parked():
            fetches.wake(True)
