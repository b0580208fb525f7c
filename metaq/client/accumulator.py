"""The producer's accumulator: per-message sends gathered into puts (Kafka's RecordAccumulator + Sender).

Theory of operation
-------------------
``append`` files a message, with the future of its SendResult, in the queue of the
partition the producer picked for it. A partition's queue becomes *ready* when it
holds ``batch_size`` bytes (or the broker's limit of messages per put), when its
oldest message has waited ``linger_ms``, or on ``flush()``/``close()``. Ready queues
are drained once per event-loop turn (so every message appended in one turn can join
the same put) by one sender per broker group, which keeps at most
``max_in_flight_per_connection`` puts in flight on that broker's connection.

Invariants (enforced here, relied on by callers):

* **At most ``max_in_flight_per_partition`` puts in flight per partition.** A queue is
  *muted* while that many of its puts are in flight, retries included. The plain producer
  allows one, so a later batch of the same partition never overtakes an earlier one that
  is being retried: per-partition order survives retries. The idempotent producer allows
  up to 5, because its numbering keeps their order (``idempotence.py``). Messages appended
  meanwhile wait, and are sent as soon as a put returns (they already waited a round
  trip), before that put's callbacks run, which batches naturally under load; a put whose
  callbacks refill the queue hands out its results in two halves (``_deliver``).
* **Bounded memory.** Every queued or in-flight message holds its size against
  ``buffer_memory`` until its SendResult is set; ``reserve`` refuses (or ``wait_for_room``
  waits for) a message that would go over it. One message larger than the whole buffer
  is still taken when nothing else is buffered, so it is never stuck.
* **Exactly one SendResult per message.** A drained batch goes to ``send_chunk`` (the
  producer's put with its retries), which returns one result per message; the results
  are set on the futures in send order, the put stays where ``flush()`` looks until its
  last result is set (even if cancelled meanwhile), and ``close()`` waits for all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Sequence

from .message import Message, Partition, SendResult

log = logging.getLogger(__name__)

#: The broker takes at most this many messages in one put.
MAX_BATCH_COUNT = 4096
#: Bytes a record takes on the wire besides its data (header, attribute length field).
RECORD_OVERHEAD = 24

SendChunk = Callable[[str, Partition, list[Message]], Awaitable[Sequence[SendResult]]]
Callback = Callable[[SendResult], object]
#: One queued message: the message, its result's future, its record_size, the sender's callback.
Entry = tuple[Message, "asyncio.Future[SendResult]", int, "Callback | None"]


def record_size(message: Message) -> int:
    """Bytes a message holds against ``batch_size`` and ``buffer_memory`` (close to its wire size)."""
    attribute = message.attribute
    return len(message.data) + RECORD_OVERHEAD + (len(attribute) * 4 if attribute else 0)


def deliver(entries: list[Entry | None], results: Iterable[SendResult], start: int = 0, stop: int | None = None) -> None:
    """Set the results of ``entries[start:stop]`` and call their callbacks, in order (a failing callback is logged).

    Reads one result per entry (``zip`` takes the entry's index first, so an iterator of
    results is left at the first one not read). Each entry is dropped from the list once
    resolved, freeing its message and future at once unless the sender kept them: CPython's
    cyclic garbage collector runs whenever allocations outnumber frees by 700, and callbacks
    that send again allocate as they go, so a put's worth of entries held to the end made it
    run several times per put (a sixth of a client sending from its callbacks).
    """
    for i, result in zip(range(start, len(entries) if stop is None else stop), results):
        _, future, _, callback = entries[i]  # type: ignore[misc]
        entries[i] = None
        if not future.done():
            future.set_result(result)
        if callback is not None:
            try:
                callback(result)
            except Exception:
                # __wrapped__: the application's callback inside the blocking facade's wrapper.
                log.exception("send callback %r failed", getattr(callback, "__wrapped__", callback))


def resolve(future: "asyncio.Future[SendResult]", callback: Callback | None, result: SendResult) -> None:
    """Set a send's result and call its callback (a failing callback is logged, nothing else)."""
    deliver([(None, future, 0, callback)], (result,))  # type: ignore[list-item]


@dataclass
class AccumulatorConfig:
    linger_ms: float
    batch_size: int
    buffer_memory: int
    max_in_flight_per_connection: int
    max_in_flight_per_partition: int = 1


class PartitionQueue:
    """The messages waiting for one partition, oldest first."""

    __slots__ = ("topic", "partition", "entries", "nbytes", "in_flight", "ready", "timer")

    def __init__(self, topic: str, partition: Partition) -> None:
        self.topic = topic
        self.partition = partition
        self.entries: list[Entry] = []
        self.nbytes = 0
        self.in_flight = 0  # puts of this partition in flight (or retrying); muted at the limit
        self.ready = False
        self.timer: asyncio.TimerHandle | None = None

    def take(self, batch_size: int) -> tuple[list[Entry], int]:
        """The oldest entries up to ``batch_size`` bytes (at least one), removed from the queue."""
        if self.nbytes <= batch_size and len(self.entries) <= MAX_BATCH_COUNT:  # all of them: no walk
            taken, self.entries = self.entries, []
            nbytes, self.nbytes = self.nbytes, 0
            return taken, nbytes
        count, nbytes = 0, 0
        for entry in self.entries:
            size = entry[2]
            if count and (nbytes + size > batch_size or count == MAX_BATCH_COUNT):
                break
            count += 1
            nbytes += size
        taken = self.entries[:count]
        del self.entries[:count]
        self.nbytes -= nbytes
        return taken, nbytes


class _BrokerSender:
    """Puts in flight on one broker group's connection, and the ready queues waiting for a slot."""

    __slots__ = ("in_flight", "waiting")

    def __init__(self) -> None:
        self.in_flight = 0
        self.waiting: list[PartitionQueue] = []


class Accumulator:
    def __init__(self, config: AccumulatorConfig, send_chunk: SendChunk) -> None:
        self.config = config
        self._send_chunk = send_chunk
        self._queues: dict[tuple[str, Partition], PartitionQueue] = {}
        self._senders: dict[int, _BrokerSender] = {}
        self._ready: list[PartitionQueue] = []
        self._drain_scheduled = False
        self._puts: dict[asyncio.Task[None], list[Entry | None]] = {}  # each put's entries, None once resolved
        self.buffered = 0  # bytes held by queued and in-flight messages
        self._room = asyncio.Event()
        self._room.set()

    # --- memory ----------------------------------------------------------------------------

    def has_room(self, size: int) -> bool:
        return self.buffered + size <= self.config.buffer_memory or self.buffered == 0

    async def wait_for_room(self, size: int, timeout: float) -> bool:
        """Wait until ``size`` more bytes fit the buffer; False if they did not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.has_room(size):
            self._room.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._room.wait(), remaining)
            except asyncio.TimeoutError:
                return False
        return True

    def hold(self, nbytes: int) -> None:
        """Count bytes of a message sent outside the queues against the buffer."""
        self.buffered += nbytes

    def release(self, nbytes: int) -> None:
        self.buffered -= nbytes
        if not self._room.is_set() and self.buffered < self.config.buffer_memory:
            self._room.set()

    # --- appending ---------------------------------------------------------------------------

    def queue(self, topic: str, partition: Partition) -> PartitionQueue:
        """The queue of ``partition`` (callers may keep it: it lives as long as the accumulator)."""
        key = (topic, partition)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = PartitionQueue(topic, partition)
        return queue

    def append(self, queue: PartitionQueue, entry: Entry, linger: bool = True) -> None:
        """Queue one message; its size (``entry[2]``, its record_size) was checked with has_room.

        ``linger=False`` makes the batch ready at once (a caller that waits for the result
        gains nothing from lingering).
        """
        size = entry[2]
        queue.entries.append(entry)
        queue.nbytes += size
        self.buffered += size
        if queue.ready:
            return  # already due to go out in this loop turn's drain
        if queue.nbytes >= self.config.batch_size or len(queue.entries) >= MAX_BATCH_COUNT or not linger \
                or self.config.linger_ms <= 0:
            self._make_ready(queue)
        elif queue.timer is None and not queue.in_flight and not queue.ready:
            queue.timer = asyncio.get_running_loop().call_later(self.config.linger_ms / 1000, self._make_ready, queue)

    def flush_all(self) -> list["asyncio.Future[SendResult]"]:
        """Make every queue ready now; the futures of every message queued or in flight."""
        futures = [entry[1] for entries in self._puts.values() for entry in entries if entry is not None]
        for queue in self._queues.values():
            futures.extend(entry[1] for entry in queue.entries)
            if queue.entries:
                self._make_ready(queue)
        return futures

    # --- draining ------------------------------------------------------------------------------

    def _make_ready(self, queue: PartitionQueue) -> None:
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        if queue.ready:
            return
        queue.ready = True
        self._ready.append(queue)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        ready, self._ready = self._ready, []
        for queue in ready:
            queue.ready = False
            if queue.entries and queue.in_flight < self.config.max_in_flight_per_partition:
                self._start_put(queue)

    def _start_put(self, queue: PartitionQueue) -> bool:
        """Start a put of the oldest entries of ``queue``; False if its broker's connection has no free slot."""
        sender = self._senders.get(queue.partition.broker_id)
        if sender is None:
            sender = self._senders[queue.partition.broker_id] = _BrokerSender()
        if sender.in_flight >= self.config.max_in_flight_per_connection:
            if queue not in sender.waiting:
                sender.waiting.append(queue)
            return False
        if queue.timer is not None:  # going out now: no linger left to wait for
            queue.timer.cancel()
            queue.timer = None
        entries, nbytes = queue.take(self.config.batch_size)
        queue.in_flight += 1
        sender.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._put(queue, sender, entries, nbytes))
        self._puts[task] = entries
        task.add_done_callback(self._puts.pop)
        if queue.entries and queue.in_flight < self.config.max_in_flight_per_partition:
            self._make_ready(queue)  # more than one put's worth queued: the next may go out too
        return True

    async def _put(self, queue: PartitionQueue, sender: _BrokerSender, entries: list[Entry], nbytes: int) -> None:
        try:
            results = await self._send_chunk(queue.topic, queue.partition, [entry[0] for entry in entries])
        except BaseException as exc:  # never a message without a result, even on a bug or a cancel
            error = f"send failed: {exc!r}"
            failed = [SendResult(False, queue.partition, error_message=error, topic=queue.topic) for _ in entries]
            self._settle(queue, sender, nbytes)
            deliver(entries, failed)
            if isinstance(exc, Exception):
                return
            raise
        # This task stays in _puts (so flush() waits for it) until every result is handed out.
        await self._deliver(queue, entries, results, self._settle(queue, sender, nbytes))

    def _settle(self, queue: PartitionQueue, sender: _BrokerSender, nbytes: int) -> bool:
        """A put of ``queue`` ended: free its slot and memory; True if another put of it started."""
        queue.in_flight -= 1
        sender.in_flight -= 1
        self.release(nbytes)
        while sender.waiting and sender.in_flight < self.config.max_in_flight_per_connection:
            self._make_ready(sender.waiting.pop(0))
        # Messages appended during the put already waited one round trip: they leave now,
        # ahead of this put's callbacks (which may append more), not with them.
        return bool(queue.entries) and self._start_put(queue)

    async def _deliver(self, queue: PartitionQueue, entries: list[Entry | None], results: Sequence[SendResult],
                       next_put_started: bool) -> None:
        """Set a put's results and call its callbacks, in order, keeping the partition's next put on the wire meanwhile.

        Pipelining across the reply: callbacks that send again (a window of sends refilled
        from result callbacks) would otherwise leave the broker idle while they run, and
        the client idle while the broker handles their single next put. If the partition
        has no put in flight once half of the results are out, and the callbacks queued
        something, that goes out before the other half are handed out: the two halves then
        take turns, one put on the wire while the other's callbacks run. Order within the
        partition is unchanged (still at most ``max_in_flight_per_partition`` puts, in
        queue order); only with ``linger_ms`` 0, as a lingering queue is meant to wait.
        """
        half = len(entries) // 2 if self.config.linger_ms <= 0 else 0
        unread = iter(results)  # read once, in order: results may be built as they are read
        delivered = 0
        try:
            if next_put_started:
                await asyncio.sleep(0)  # its task was scheduled first: it writes its put, then the callbacks run
            if half:
                deliver(entries, unread, 0, half)
                delivered = half
                if queue.entries and not queue.in_flight and self._start_put(queue):
                    await asyncio.sleep(0)
        finally:  # the rest even if cancelled at a sleep: exactly one result per message
            deliver(entries, unread, delivered)
