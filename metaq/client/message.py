"""The values applications hand to the client and get back: Message, Partition, SendResult."""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering
from typing import NamedTuple


@total_ordering
@dataclass(frozen=True)
class Partition:
    """A partition's global name ``{broker_id}-{partition}``: the same on a master and its slaves.

    Ordered by (broker_id, partition) as numbers, which is MetaQ's order for round robin
    and for the consumer-group assignment (so "10-0" sorts after "9-3").
    """

    broker_id: int
    partition: int

    def __str__(self) -> str:
        return f"{self.broker_id}-{self.partition}"

    def __lt__(self, other: "Partition") -> bool:
        return (self.broker_id, self.partition) < (other.broker_id, other.partition)

    @classmethod
    def parse(cls, name: str) -> "Partition":
        broker, sep, number = name.partition("-")
        try:
            if sep:
                return cls(int(broker), int(number))
        except ValueError:
            pass
        raise ValueError(f"not a partition name (expected 'BROKER-N'): {name!r}")


class _MessageFields(NamedTuple):
    topic: str
    data: bytes
    attribute: str | None = None
    id: int | None = None
    partition: Partition | None = None
    offset: int | None = None


class Message(_MessageFields):
    """A message to send, or one received (immutable).

    ``topic``, ``data`` (bytes) and the optional ``attribute`` (a string stored with the
    message, MetaQ's way to tag messages) are what a producer sets. A received message
    also carries where it came from: ``partition``, ``offset`` (its byte position in the
    partition log) and ``id`` (the msg id the master gave it).

    A tuple underneath: a consumer builds one per received record, and a tuple is the
    cheapest Python object to build (``codec.decode_messages`` skips the checks below,
    its fields come from a checked record).
    """

    __slots__ = ()

    def __new__(
        cls,
        topic: str,
        data: bytes,
        attribute: str | None = None,
        id: int | None = None,
        partition: Partition | None = None,
        offset: int | None = None,
    ) -> "Message":
        if type(data) is not bytes:  # noqa: E721 - the common case must stay cheap
            if isinstance(data, str):
                raise TypeError("Message data must be bytes, not str: encode it first, e.g. text.encode()")
            data = bytes(data)  # bytearray, memoryview...
        if type(topic) is not str or not topic or (attribute is not None and type(attribute) is not str):  # noqa: E721
            topic, attribute = _checked_names(topic, attribute)
        return tuple.__new__(cls, (topic, data, attribute, id, partition, offset))

    @property
    def delivery_attempt(self) -> int:
        """Which delivery of this message a listener is on: 1 for a first delivery, ``k + 1``
        for a retry after ``k`` failed deliveries (``failure_store="topic"``; RocketMQ's
        ``reconsumeTimes`` is this minus 1). A retry's message is a subclass carrying its
        envelope (retry_topics.py ``Redelivery``); every other message is a first delivery."""
        return 1


def _checked_names(topic: object, attribute: object) -> tuple[str, str | None]:
    """The slow path of Message(): a topic and attribute that are not plain strings are refused
    here, with the field named, instead of failing later inside a send."""
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"Message topic must be a non-empty str, got {topic!r}")
    if attribute is not None and not isinstance(attribute, str):
        raise TypeError(f"Message attribute must be a str or None, got {type(attribute).__name__} {attribute!r}")
    # str.__str__: the plain string of a str subclass (a str Enum's value, not its name).
    return str.__str__(topic), None if attribute is None else str.__str__(attribute)


# Not frozen: a frozen dataclass costs several times more to build, and a batch send
# builds one result per message.
@dataclass(slots=True)
class SendResult:
    """How one send ended. Every send ends in exactly one SendResult, never in silence.

    * ``success``: stored; ``partition``, ``offset`` and ``msg_id`` say where.
    * not ``success`` and not ``outcome_unknown``: definitely **not** stored
      (``error_message`` says why, ``code`` is the broker's result code if it answered).
    * ``outcome_unknown``: the broker may or may not have stored it (connection lost
      after the request went out, timeout, 504). Resending may duplicate it.
    """

    success: bool
    partition: Partition | None = None
    offset: int = -1
    msg_id: int = -1
    error_message: str | None = None
    topic: str = ""
    code: int | None = None
    outcome_unknown: bool = False
    attempts: int = 1

    def __bool__(self) -> bool:
        return self.success
