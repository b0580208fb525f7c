"""Partition selectors: which partition a producer sends a message to.

A selector gets the topic's writable partitions, sorted by (broker id, partition), and
the message. Implement ``PartitionSelector.select`` for your own rule.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Callable, Protocol

from .message import Message, Partition


class NoPartitionAvailable(LookupError):
    """No master currently publishes a partition of the topic (retriable: one may come back)."""


class PartitionSelector(Protocol):
    """``select`` is called per message, unless the selector sets ``per_message = False``:
    then once per batch, with the batch's first message."""

    def select(self, topic: str, partitions: list[Partition], message: Message) -> Partition: ...


class RoundRobinPartitionSelector:
    """MetaQ's default: each send goes to the next partition, over all live masters.

    A batch send counts as one send: the whole batch goes to one partition (in one put),
    the next batch to the next partition, like Kafka's sticky partitioner.
    """

    #: The producer may pick once per batch instead of once per message.
    per_message = False

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def select(self, topic: str, partitions: list[Partition], message: Message) -> Partition:
        if not partitions:
            raise NoPartitionAvailable(f"no available partition for topic {topic!r}")
        counter = self._counters.setdefault(topic, itertools.count())
        return partitions[next(counter) % len(partitions)]


def attribute_key(message: Message) -> str | bytes | None:
    return message.attribute


class KeyHashPartitionSelector:
    """Ordered messages: every message with the same key goes to the same partition.

    The key defaults to the message attribute. CRC32 (not ``hash()``) so that every
    producer process maps a key to the same partition. The mapping only holds while the
    set of live partitions stays the same: if a master goes away, its keys move (MetaQ's
    OrderedMessageProducer buffered locally instead; pass ``stable=True`` to fail such
    sends with a retriable error until the partition is back).
    """

    def __init__(
        self,
        key: Callable[[Message], str | bytes | None] = attribute_key,
        stable: bool = False,
        all_partitions: list[Partition] | None = None,
    ) -> None:
        if not callable(key):
            raise TypeError(f"KeyHashPartitionSelector key must be a function of the message, got {key!r}")
        # Each without the other would silently hash over the live partitions, so keys would
        # move while a master is away: the very thing stable=True is asked for to prevent.
        if stable and not all_partitions:
            raise ValueError("KeyHashPartitionSelector(stable=True) needs all_partitions=[...]: "
                             "every partition of the topic, the list a key hashes over")
        if all_partitions and not stable:
            raise ValueError("KeyHashPartitionSelector: all_partitions is used only with stable=True")
        self.key = key
        self.stable = stable
        # With ``stable``: the full partition list to hash over, e.g. from the topic's config.
        self.all_partitions = sorted(all_partitions) if all_partitions else None

    def select(self, topic: str, partitions: list[Partition], message: Message) -> Partition:
        if not partitions:
            raise NoPartitionAvailable(f"no available partition for topic {topic!r}")
        key = self.key(message)
        if key is None:
            raise ValueError("KeyHashPartitionSelector needs a key (by default the message attribute)")
        raw = key.encode("utf-8") if isinstance(key, str) else key
        universe = self.all_partitions if self.stable and self.all_partitions else partitions
        chosen = universe[zlib.crc32(raw) % len(universe)]
        if chosen not in partitions:
            raise NoPartitionAvailable(f"partition {chosen} of topic {topic!r} (for key {key!r}) has no master right now")
        return chosen
