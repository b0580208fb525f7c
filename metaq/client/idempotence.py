"""A producer's identity and numbering: a producer id, and a sequence per partition.

Both producers that number their puts, the idempotent one (producer.py) and the
transactional one (transactional.py), hold one ``ProducerIdentity`` (who they are to the
brokers: producer id, epoch, token; the one way to ask for them) inside one ``Sequencer``
(their puts' numbers). They differ only in where they ask and how they retry (the
senders; the retry policy is ``retry.RetryPolicy``), as aiokafka's TransactionManager
keeps the producer id and sequences apart from its Sender.

Every put of an idempotent producer carries ``(producer id, epoch, first sequence)``;
the broker appends a batch once and answers a retry of it as a duplicate, with the
original offsets (docs/transactions.md, "Idempotent producer"). Each partition has a
``Lane``: the numbered batches of that partition not yet settled, in sequence order.
What the client must keep for exactly once and per-partition order, and where it is
enforced:

* **Numbered when written, in arrival order.** A new batch takes its place in the lane's
  line (``enter``) before its first await; ``claim`` numbers only the first in line, and
  the caller writes it on the connection before the event loop runs anything else, so
  sequence order is send order and the order of the bytes on the connection, which the
  broker appends in.
* **Several batches in flight only where the broker knows us.** A broker treats an
  unknown producer's first batch as new whatever its sequence, so a later batch could be
  stored ahead of an earlier one that was lost. A lane therefore pipelines (up to
  ``limit`` batches, never more than the broker's ``producerStateMaxBatches`` = 5) only
  after one of its batches was acked under the current producer id, and only on the
  connection its batches in flight were written on; from then on the broker refuses a
  gap (OUT_OF_ORDER) instead of storing past it. The limit counts every batch from the
  oldest unsettled one on, settled or not, so a resend of that one is still among the
  batches the broker remembers and is answered with its original offsets.
* **Retries in sequence order.** After any failure in a lane no new batch is numbered
  until the lane is empty again, and a batch is resent only when it is the lane's head
  (every earlier batch settled): ``claim``. An OUT_OF_ORDER answer to a batch behind an
  earlier one being retried is expected; it waits for its turn.
* **A retry reuses its numbers**, to the same partition (through a failover: its new
  master), so the broker can tell it is the same batch.
* **Numbers given back only when nothing was written after them**: ``end(stored=False)``
  of the lane's newest batch. A batch that gave up unknown, or surely not stored with
  later batches written (a gap the broker would refuse from then on), drops the producer
  id: the next batch asks for a new one and numbers from 0. Batches of the old id still
  in the lane resend their old numbers when their turn comes; an OUT_OF_ORDER answer to
  such a head means it was never stored (the broker knew the producer, so it stored
  nothing past the gap), and ``renumber`` gives it numbers under the new id.

Thread-safe: the blocking producer numbers its first attempt on the caller's thread
(metaq/client/blocking.py, ``try_begin``: only into an empty lane, which it then holds
alone), the asyncio producer in the loop thread. The lock is held only for bookkeeping,
never across I/O.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Hashable, NamedTuple

from ..protocol.messages import InitProducerRequest
from ..txn.control import MAX_SEQUENCE

#: The broker remembers this many batches per producer and partition (``producerStateMaxBatches``
#: default): more numbered batches of one partition in flight could not all be told apart.
BROKER_MAX_BATCHES = 5
#: ``Lane.conn`` of a batch written on a connection the loop does not own (the blocking
#: facade's direct path): nothing may pipeline behind it.
ELSEWHERE = object()


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


class Lane:
    """One partition's numbered batches not yet settled, oldest (lowest sequence) first."""

    __slots__ = ("generation", "next", "known", "in_flight", "settled", "line", "conn", "failed", "waiters")

    def __init__(self) -> None:
        self.generation = 0
        self.next = 0
        self.known = False  # a batch was acked under ``generation``: the broker has our state here
        #: Numbered batches from the oldest unsettled one on (settled ones behind it stay, in ``settled``).
        self.in_flight: list[Numbered] = []
        self.settled: set[Numbered] = set()
        self.line: list[object] = []  # new batches waiting to be numbered, in arrival order
        self.conn: object = None  # what the batches in flight were written on
        self.failed = False  # a batch failed: resend head first, number nothing new until empty
        self.waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []


class NoProducerId(Exception):
    """``claim`` needs a producer id first."""


class ProducerIdentity:
    """Who a producer is to the brokers: a producer id, its epoch and (security on) the token
    proving both were issued to this user; with a ``transactional_id``, that name's id.

    One writer: ``obtain`` sets it from an ``init_producer`` reply (one request in flight
    for the whole producer), the owning ``Sequencer`` drops it when the numbering under it
    is unknown (``Sequencer.end``). Each new id is a new ``generation``: every partition's
    numbering starts over at 0 under it.
    """

    def __init__(self, transactional_id: str | None = None) -> None:
        self.transactional_id = transactional_id
        self.producer_id: int | None = None
        self.epoch = 0
        self.token: str | None = None
        self.generation = 0
        #: Guards the id with the numbering that reads it (the owning Sequencer's lock: the
        #: blocking facade numbers on the caller's thread).
        self.lock = threading.Lock()
        self._asking: asyncio.Future[None] | None = None

    @property
    def known(self) -> bool:
        return self.producer_id is not None

    def request(self) -> InitProducerRequest:
        """The one request for an id: a new one, or (transactional id) that name's, one epoch up."""
        return InitProducerRequest(transactional_id=self.transactional_id)

    def set(self, producer_id: int, epoch: int, token: str | None = None) -> None:
        """Adopt an issued id, unless one is held (a late answer never replaces the current id)."""
        with self.lock:
            if self.producer_id is None:
                self.producer_id, self.epoch, self.token = producer_id, epoch, token
                self.generation += 1

    def adopt(self, reply_header: dict[str, Any]) -> None:
        self.set(int(reply_header["producer_id"]), int(reply_header["epoch"]), reply_header.get("producer_token"))

    def drop(self) -> None:
        """Forget the id (called with ``lock`` held, by ``Sequencer.end``)."""
        self.producer_id = None

    async def obtain(self, ask: Callable[[InitProducerRequest], Awaitable[dict[str, Any]]]) -> None:
        """Make sure an id is held: ``ask`` sends the request and returns the 200 reply's header
        (or raises its sender's failure). Concurrent callers share one request."""
        if self.producer_id is not None:
            return
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask(ask))
        await asyncio.shield(self._asking)

    async def _ask(self, ask: Callable[[InitProducerRequest], Awaitable[dict[str, Any]]]) -> None:
        self.adopt(await ask(self.request()))


class Sequencer:
    def __init__(self, limit: int = 1, identity: ProducerIdentity | None = None) -> None:
        if not 1 <= limit <= BROKER_MAX_BATCHES:
            raise ValueError(f"numbered batches in flight per partition must be 1..{BROKER_MAX_BATCHES}, got {limit}")
        self.limit = limit
        self.identity = identity or ProducerIdentity()
        self._lock = self.identity.lock
        self._lanes: dict[Hashable, Lane] = {}

    @property
    def producer_id(self) -> int | None:
        return self.identity.producer_id

    @property
    def epoch(self) -> int:
        return self.identity.epoch

    @property
    def token(self) -> str | None:
        return self.identity.token

    @property
    def _generation(self) -> int:
        return self.identity.generation

    @property
    def has_id(self) -> bool:
        return self.identity.known

    def set_id(self, producer_id: int, epoch: int, token: str | None = None) -> None:
        self.identity.set(producer_id, epoch, token)

    def _lane(self, key: Hashable) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane()
        if lane.generation != self._generation:  # a new producer id numbers from 0
            lane.generation, lane.next, lane.known = self._generation, 0, False
        return lane

    def try_begin(self, key: Hashable, count: int) -> Numbered | None:
        """Number a batch into an empty lane, held alone; None if the lane is busy or there is no id."""
        with self._lock:
            if self.producer_id is None:
                return None
            lane = self._lane(key)
            if lane.in_flight or lane.line:
                return None
            return self._number(lane, key, count, ELSEWHERE)

    def enter(self, key: Hashable) -> object:
        """A new batch's place in the lane's line: call before the first await, pass to ``claim``."""
        ticket = object()
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = Lane()
            lane.line.append(ticket)
        return ticket

    def leave(self, key: Hashable, ticket: object) -> None:
        """The batch leaves the line without being numbered (it gave up, or moved to another partition)."""
        with self._lock:
            lane = self._lanes[key]
            if ticket in lane.line:
                lane.line.remove(ticket)
                waiters, lane.waiters = lane.waiters, []
            else:
                waiters = []
        _wake_all(waiters)

    def claim(self, key: Hashable, count: int, conn: object, numbered: Numbered | None,
              ticket: object = None) -> Numbered | None:
        """May a batch be written on ``conn`` now? Its numbers if so (to write at once), else None: wait.

        ``numbered`` None: a new batch holding ``ticket`` from ``enter`` (NoProducerId if an id
        must be fetched first); else a resend of a batch of the lane, allowed only as its head.
        """
        with self._lock:
            lane = self._lanes[numbered.key] if numbered is not None else None
            if numbered is not None:
                assert lane is not None
                if not lane.in_flight or lane.in_flight[0] is not numbered:
                    return None
                lane.conn = conn
                return numbered
            lane = self._lane(key)
            if not lane.line or lane.line[0] is not ticket:
                return None  # an earlier new batch goes first
            if self.producer_id is None:
                raise NoProducerId
            if lane.in_flight:
                if lane.failed or len(lane.in_flight) >= self.limit or not lane.known or lane.conn is not conn \
                        or lane.in_flight[-1].generation != self._generation:
                    return None
            lane.line.pop(0)
            numbered = self._number(lane, key, count, conn)
            if lane.line:
                waiters, lane.waiters = lane.waiters, []
                _wake_all(waiters)  # the next in line may go too (scheduled, not run, here)
            return numbered

    def renumber(self, numbered: Numbered) -> Numbered | None:
        """New numbers under the current id for the lane's head, surely never stored under its old ones.

        None if there is no producer id (fetch one and call again).
        """
        with self._lock:
            lane = self._lanes[numbered.key]
            assert lane.in_flight[0] is numbered
            if self.producer_id is None:
                return None
            lane = self._lane(numbered.key)
            renumbered = self._number(lane, numbered.key, numbered.count, lane.conn, at_head=True)
            lane.in_flight.remove(numbered)
            return renumbered

    def _number(self, lane: Lane, key: Hashable, count: int, conn: object, at_head: bool = False) -> Numbered:
        assert self.producer_id is not None
        numbered = Numbered(key, self.producer_id, self.epoch, lane.next, count, self._generation, self.token)
        lane.next = (lane.next + count) & MAX_SEQUENCE
        if at_head:
            lane.in_flight.insert(0, numbered)
        else:
            lane.in_flight.append(numbered)
        lane.conn = conn
        return numbered

    def is_head(self, numbered: Numbered) -> bool:
        with self._lock:
            in_flight = self._lanes[numbered.key].in_flight
            return bool(in_flight) and in_flight[0] is numbered

    def is_current(self, numbered: Numbered) -> bool:
        return numbered.generation == self._generation and self.producer_id is not None

    def failed(self, numbered: Numbered) -> None:
        """An attempt of ``numbered`` failed: the lane resends head first until it is empty."""
        with self._lock:
            self._lanes[numbered.key].failed = True

    def wait(self, key: Hashable) -> "asyncio.Future[None]":
        """A future done at the lane's next change (a batch settled)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._lanes[key].waiters.append((loop, future))
        return future

    def end(self, numbered: Numbered, stored: bool | None) -> None:
        """The batch is settled: stored (True), surely not stored (False) or unknown (None)."""
        with self._lock:
            lane = self._lanes[numbered.key]
            if numbered in lane.in_flight:  # else renumbered meanwhile: the new numbers are the ones in the lane
                lane.settled.add(numbered)
                # The window starts at the oldest unsettled batch.
                while lane.in_flight and lane.in_flight[0] in lane.settled:
                    lane.settled.discard(lane.in_flight.pop(0))
            if numbered.generation == self._generation and self.producer_id is not None:
                if stored:
                    lane.known = True
                elif stored is False and lane.next == (numbered.sequence + numbered.count) & MAX_SEQUENCE:
                    lane.next = numbered.sequence  # nothing written after it: its numbers are free again
                else:
                    self.identity.drop()  # unknown, or a gap the broker would refuse: start over
            if not lane.in_flight:
                lane.failed, lane.conn = False, None
            waiters, lane.waiters = lane.waiters, []
        _wake_all(waiters)


def _wake_all(waiters: list[tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]]) -> None:
    for loop, future in waiters:
        loop.call_soon_threadsafe(_wake, future)


def _wake(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
