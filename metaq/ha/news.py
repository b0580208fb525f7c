"""The master's side of ``news``: one long-poll per slave for all of its quiet partitions.

A slave keeps a fetch parked on a partition only while the partition is busy (metaq/ha/
follower.py). A partition whose parked fetch came back empty goes *quiet*: the slave names
it, with what it holds, in its next ``news`` request, and stops fetching it. The master then
watches the partition for that slave (one ``EndWaiters`` watch, woken by exactly what wakes
a parked replica fetch: an append, a move of the committed offset, the partition dropped,
the broker stopping) and answers the slave's one parked ``news`` request with the partitions
that have news. The slave fetches those, as before. So a slave with P partitions costs its
master one parked request and P idle watches, not P long-polls renewed every
``slaveMaxDelayInMills`` (at 2,000 partitions those filled ``maxRequestsInFlight`` and the
slave never got all of its partitions started).

Safety does not depend on this: a quiet partition is one the slave fetched to the master's
log end; a missed wake-up only delays its next fetch (every fetch checks epoch, incarnation
and offsets as ever), and the slave registers everything again on a new connection.

One ``NewsSession`` per connection a slave polls on, bound to that slave's id. Costs: a
registration or a wake-up is O(1); nothing here walks all partitions.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from ..deferred import Deferred

Key = tuple[str, int]
#: Watch a partition, calling back once at its next change; returns what withdraws the watch.
Watch = Callable[[str, int, Callable[[], None]], Callable[[], None]]
#: Builds the reply to a ``news`` request (its opaque, the partitions with news).
Answer = Callable[[int, list[Key]], object]


class NewsSession:
    __slots__ = ("slave_id", "_watch", "_answer", "quiet", "news", "parked", "_opaque", "_timer")

    def __init__(self, slave_id: int, watch: Watch, answer: Answer) -> None:
        self.slave_id = slave_id
        self._watch = watch
        self._answer = answer
        #: Quiet partitions, each with what withdraws its watch.
        self.quiet: dict[Key, Callable[[], None]] = {}
        #: Partitions with news not yet told (a dict: in order, each once).
        self.news: dict[Key, None] = {}
        self.parked: Deferred[object] | None = None
        self._opaque = -1
        self._timer: asyncio.TimerHandle | None = None

    def register(self, key: Key, has_news: bool) -> None:
        """The slave says ``key`` is quiet; ``has_news``: the master already has news for it."""
        withdraw = self.quiet.pop(key, None)
        if withdraw is not None:
            withdraw()
        if has_news:
            self.news[key] = None
            return
        self.quiet[key] = self._watch(key[0], key[1], lambda: self._woken(key))

    def _woken(self, key: Key) -> None:
        # The watch was taken out by the notify that called this: nothing to withdraw.
        if self.quiet.pop(key, None) is None:
            return
        self.news[key] = None
        if self.parked is not None:
            self._reply()

    def poll(self, opaque: int, max_wait_s: float) -> object:
        """Answer now (news, or no wait asked), or park until news or ``max_wait_s``.

        A poll while one is parked answers the parked one first (with what it has): the slave
        sends a new ``news`` when it has partitions to register, without waiting for the old.
        """
        if self.parked is not None:
            self._reply()
        if self.news or max_wait_s <= 0:
            return self._answer(opaque, self._take())
        self.parked = Deferred()
        self._opaque = opaque
        self._timer = asyncio.get_running_loop().call_later(max_wait_s, self._reply)
        self.parked.on_cancel(self._let_go)
        return self.parked

    def _take(self) -> list[Key]:
        keys, self.news = list(self.news), {}
        return keys

    def _reply(self) -> None:
        parked = self.parked
        self._let_go()
        if parked is not None and not parked.done():
            parked.set_result(self._answer(self._opaque, self._take()))

    def _let_go(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self.parked = None

    def close(self) -> None:
        """The connection closed: withdraw every watch (a parked reply is dropped with it)."""
        self._let_go()
        for withdraw in self.quiet.values():
            withdraw()
        self.quiet.clear()
        self.news.clear()
