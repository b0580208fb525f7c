"""Long-poll support: fetches parked at a partition's end until it moves.

A consumer fetch waits for the partition's *committed* end to move, a slave's
fetch for the *log* end; both are woken by ``notify`` and re-check their own
condition, so one mechanism serves both.

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
from typing import Callable

log = logging.getLogger(__name__)


class EndWaiters:
    def __init__(self) -> None:
        self._watchers: dict[tuple[str, int], dict[int, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._held = 0
        #: Partitions notified while held, in order (a dict: each once).
        self._pending: dict[tuple[str, int], None] = {}

    def hold(self) -> None:
        """Gather notifies until the matching ``release`` (holds nest)."""
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        if not self._held and self._pending:
            pending, self._pending = self._pending, {}
            for topic, partition in pending:
                self._wake(topic, partition)

    def watch(self, topic: str, partition: int, woken: Callable[[], None]) -> Callable[[], None]:
        """Call ``woken()`` once, at the partition's next ``notify``; returns what withdraws it."""
        key = (topic, partition)
        watcher_id = next(self._ids)
        watching = self._watchers.get(key)
        if watching is None:
            watching = self._watchers[key] = {}
        watching[watcher_id] = woken

        def withdraw() -> None:
            current = self._watchers.get(key)
            if current is not None:
                current.pop(watcher_id, None)
                if not current:
                    del self._watchers[key]

        return withdraw

    def notify(self, topic: str, partition: int) -> None:
        if self._held:
            self._pending[(topic, partition)] = None
            return
        self._wake(topic, partition)

    def _wake(self, topic: str, partition: int) -> None:
        # Taken out first: a watcher that finds nothing for it yet watches again, for the next notify.
        watching = self._watchers.pop((topic, partition), None)
        if watching:
            for woken in watching.values():
                try:
                    woken()
                except Exception:  # one fetch's bug must not fail the put or flush that woke it
                    log.exception("error answering a parked fetch of %s-%d", topic, partition)

    def notify_all(self) -> None:
        for topic, partition in list(self._watchers):
            self.notify(topic, partition)

