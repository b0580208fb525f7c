"""Long-poll support: fetches parked at a partition's end until it moves.

A consumer fetch waits for the partition's *committed* end to move, a slave's
fetch for the *log* end; both are woken by ``notify`` (an append, a partition
dropped, the broker stopping) and re-check their own condition, so one mechanism
serves both. A move of the committed offset or the flushed end alone
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
from typing import Callable

log = logging.getLogger(__name__)


class EndWaiters:
    def __init__(self) -> None:
        #: Woken by every notify (consumers' fetches).
        self._watchers: dict[tuple[str, int], dict[int, Callable[[], None]]] = {}
        #: Woken by ``notify`` but not by ``notify_committed`` (slaves' fetches).
        self._log_end_watchers: dict[tuple[str, int], dict[int, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._held = 0
        #: Partitions notified while held, in order (a dict: each once); True once a ``notify``
        #: (not only ``notify_committed``) is among them.
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

    def watch(self, topic: str, partition: int, woken: Callable[[], None], on_commit: bool = True) -> Callable[[], None]:
        """Call ``woken()`` once, at the partition's next ``notify`` (or ``notify_committed``
        with ``on_commit``); returns what withdraws it."""
        key = (topic, partition)
        table = self._watchers if on_commit else self._log_end_watchers
        watcher_id = next(self._ids)
        watching = table.get(key)
        if watching is None:
            watching = table[key] = {}
        watching[watcher_id] = woken

        def withdraw() -> None:
            current = table.get(key)
            if current is not None:
                current.pop(watcher_id, None)
                if not current:
                    del table[key]

        return withdraw

    def notify(self, topic: str, partition: int) -> None:
        """The partition's log end moved (or it was dropped, or the broker stops): wake every fetch."""
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
        # Taken out first: a watcher that finds nothing for it yet watches again, for the next notify.
        # Slaves' fetches first (an append's bytes on their way to the sync set), then consumers'.
        key = (topic, partition)
        for table in (self._log_end_watchers, self._watchers) if everyone else (self._watchers,):
            watching = table.pop(key, None)
            if watching:
                for woken in watching.values():
                    try:
                        woken()
                    except Exception:  # one fetch's bug must not fail the put or flush that woke it
                        log.exception("error answering a parked fetch of %s-%d", topic, partition)

    def notify_all(self) -> None:
        for topic, partition in list(dict.fromkeys([*self._log_end_watchers, *self._watchers])):
            self.notify(topic, partition)

