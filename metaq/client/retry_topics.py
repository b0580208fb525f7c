"""Durable retries: a failed message goes back to its group's retry topic, and at last to a dead-letter topic.

RocketMQ's ``%RETRY%{group}`` and ``%DLQ%{group}``, under names the topic-name rule allows
(letters, digits, ``.``, ``_`` and ``-``; metaq/config.py ``check_topic_name``):
``__retry.{group}`` and ``__dlq.{group}`` (``failure_topic_names``; a character of the group
name outside the rule, and ``_`` itself, is written ``_XX``, its UTF-8 bytes in hex, so two
groups never share a topic; a name too long is cut and ends in a hash of the whole).

Theory of operation (``failure_store="topic"``, the default):

* A listener that raises on a message is not called again in place. The consumer sends the
  message to the retry topic (failure_router.py ``FailureRouter.send_back``) wrapped in an *envelope*: the
  original data as the record's data, and as its attribute ``metaq-retry/1 `` + JSON
  naming the original topic, partition, offset, msg id and attribute, how many deliveries
  failed (``attempts``), the last error and the delay. Only once the retry topic acked it
  does the partition move past the message: a consumer that dies before that redelivers
  it from its last commit (at least once, never lost).
* Delivery ``k`` that fails waits ``retry_delays_s[k-1]`` (the last one repeats). The message
  goes to partition ``k-1`` (modulo their count) of the retry topic's partitions in the
  original partition's broker group: with as many partitions as delay levels (what
  ``ensure`` creates) a partition holds one level only, so its messages come due in the
  order they are stored (RocketMQ's schedule queue per level) and a long delay never holds
  back a short one.
* The group subscribes to its retry topic like to any topic: its partitions are split among
  the members, its offsets committed with the others. A retry partition's fetcher delivers
  a message only when it is due (``due_at``: the retry record's own msg id time, the master's
  append time, plus the delay), waiting on that partition alone; then it calls the original
  topic's listener with the message as first delivered (a ``Redelivery``: equal to the
  original and carrying the envelope, so ``delivery_attempt`` and ``failure_info`` tell the
  listener which delivery it is on).
* After ``1 + max_reconsume_times`` failed deliveries the envelope goes to the dead-letter
  topic instead, where nobody consumes it: ``metaq groups dlq`` lists, replays or purges it.

The topics come to exist as Kafka's and RocketMQ's do, created on first need: the client
adds them to the broker group's topic configuration in ZooKeeper (``ensure``) when it may
write it (failure_router.py ``FailureRouter._ensure``). With ZooKeeper ACLs on (a secured group) only the group's credentials may, so an
operator creates them once with ``metaq topics create``; the consumer says so in one line
(failure_router.py ``FailureTopicsMissing``) and keeps the partition where it is until they exist.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..config import TOPIC_NAME_MAX
from ..store.msgid import msg_id_timestamp_ms
from .message import Message, Partition

RETRY_PREFIX = "__retry."
DLQ_PREFIX = "__dlq."
#: RocketMQ's delay levels from its first retry on (levels 3..18: 10s 30s 1m 2m ... 1h 2h).
DEFAULT_RETRY_DELAYS_S: tuple[float, ...] = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
ENVELOPE_MARK = "metaq-retry/1 "
#: The last error is kept to this many characters (a traceback's last line, not the whole).
ERROR_MAX = 1000
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")


def _escaped(group: str) -> list[str]:
    """The group name's characters as written in a topic name (``_XX`` per UTF-8 byte when not plain)."""
    return [ch if ch in _PLAIN else "".join(f"_{b:02X}" for b in ch.encode()) for ch in group]


def failure_topic_names(group: str) -> tuple[str, str]:
    """``(retry topic, dead-letter topic)`` of a consumer group.

    A group whose escaped name would make them longer than a topic name may be keeps its
    first characters and ends in ``~`` written ``_7E`` plus 16 hex digits of the SHA-256 of
    the whole name: still one pair per group (a collision would need a SHA-256 collision).
    """
    pieces = _escaped(group)
    safe = "".join(pieces)
    room = TOPIC_NAME_MAX - len(RETRY_PREFIX)
    if len(safe) > room:
        suffix = "_7E" + hashlib.sha256(group.encode()).hexdigest()[:16]
        kept, used = [], 0
        for piece in pieces:  # whole characters only: never half an escape
            if used + len(piece) > room - len(suffix):
                break
            kept.append(piece)
            used += len(piece)
        safe = "".join(kept) + suffix
    return RETRY_PREFIX + safe, DLQ_PREFIX + safe


@dataclass(frozen=True)
class FailureInfo:
    """What the envelope of a retried or dead-lettered message says about the original."""

    topic: str
    partition: Partition
    offset: int
    msg_id: int
    attribute: str | None
    attempts: int  # deliveries that failed so far
    error: str  # the last one's error
    delay_ms: int  # how long after it was stored the retry is due (0 in the dead-letter topic)

    def encode(self) -> str:
        return ENVELOPE_MARK + json.dumps({
            "topic": self.topic, "partition": str(self.partition), "offset": self.offset, "msg_id": self.msg_id,
            "attribute": self.attribute, "attempts": self.attempts, "error": self.error, "delay_ms": self.delay_ms,
        }, separators=(",", ":"))

    def original(self, data: bytes) -> "Redelivery":
        """The message as first delivered, carrying this envelope (what a retry hands the listener)."""
        message = Redelivery(self.topic, data, self.attribute, self.msg_id, self.partition, self.offset)
        message.failure = self
        return message


class Redelivery(Message):
    """A retried message as its listener gets it: the original's fields, and ``failure``, its envelope.

    Equal to, hashed and unpacked like the original (a tuple with the same fields): a
    listener that does not ask sees the message it would have seen the first time. Without
    ``__slots__`` on purpose: a tuple subclass keeps the envelope in an instance ``__dict__``,
    so only retries pay for it, and it survives pickling and copying.
    """

    failure: FailureInfo

    @property
    def delivery_attempt(self) -> int:
        failure = self.__dict__.get("failure")  # None on a copy made by _replace()
        return 1 if failure is None else failure.attempts + 1


def failure_info(message: Message) -> FailureInfo | None:
    """The envelope of a message of a retry or dead-letter topic, or of a retry handed to a listener
    (``attempts`` deliveries failed before this one, ``error`` the last one's); None for any other message."""
    failure = getattr(message, "__dict__", {}).get("failure")
    if isinstance(failure, FailureInfo):
        return failure
    attribute = message.attribute
    if attribute is None or not attribute.startswith(ENVELOPE_MARK):
        return None
    return parse_envelope(attribute)


def parse_envelope(attribute: str) -> FailureInfo:
    """ValueError naming what is wrong when the attribute is not a whole envelope."""
    if not attribute.startswith(ENVELOPE_MARK):
        raise ValueError("not a retry envelope (its attribute does not start with 'metaq-retry/1 ')")
    try:
        value = json.loads(attribute[len(ENVELOPE_MARK):])
        info = FailureInfo(str(value["topic"]), Partition.parse(str(value["partition"])), int(value["offset"]),
                           int(value["msg_id"]), None if value["attribute"] is None else str(value["attribute"]),
                           int(value["attempts"]), str(value["error"]), int(value["delay_ms"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed retry envelope: {exc}") from None
    if info.attempts < 1 or info.delay_ms < 0:
        raise ValueError(f"malformed retry envelope: attempts {info.attempts}, delay_ms {info.delay_ms}")
    return info


def due_at_ms(retried: Message, info: FailureInfo) -> int:
    """When a retry is due: its record's append time on the master (the msg id's time) plus the delay.

    The broker's clock, not the sender's: a consumer host with a clock ahead cannot make
    every member's retries early. Compared with this host's clock, so members should keep
    their clocks in sync (NTP) for delays to hold to the second.
    """
    return msg_id_timestamp_ms(retried.id or 0) + info.delay_ms


@dataclass(frozen=True)
class FailurePolicy:
    """Where delivery k's failure of a message goes, and with which envelope (pure: no I/O)."""

    retry_topic: str
    dlq_topic: str
    delays_ms: tuple[int, ...]
    max_reconsume_times: int
    retry_partitions: int  # what a retry topic is created with

    @classmethod
    def of(cls, config: Any) -> "FailurePolicy":
        """From a ConsumerConfig (group, retry_delays_s, max_reconsume_times, retry_topic_partitions)."""
        retry, dlq = failure_topic_names(config.group)
        delays = tuple(int(round(d * 1000)) for d in config.retry_delays_s)
        return cls(retry, dlq, delays, config.max_reconsume_times, config.retry_topic_partitions or len(delays))

    def delay_ms(self, attempts: int) -> int:
        """The wait after delivery ``attempts`` failed: the k-th delay, the last one repeated."""
        return self.delays_ms[min(attempts, len(self.delays_ms)) - 1]

    def envelope(self, message: Message, error: BaseException | str, attempts: int) -> tuple[str, Message]:
        """The topic delivery ``attempts``'s failure goes to (retry or dead-letter), and the message to send there.

        ``attempts`` counts failed deliveries: the first delivery is 1, so a message is
        delivered at most ``1 + max_reconsume_times`` times.
        """
        text = error if isinstance(error, str) else (f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        dead = attempts > self.max_reconsume_times
        topic = self.dlq_topic if dead else self.retry_topic
        info = FailureInfo(message.topic, message.partition or Partition(0, 0), message.offset or 0, message.id or 0,
                           message.attribute, attempts, text[:ERROR_MAX], 0 if dead else self.delay_ms(attempts))
        return topic, Message(topic, message.data, info.encode())


class RetryPartitionSelector:
    """Delivery k's retry goes to partition k-1 (modulo) of the retry topic in the original's broker group."""

    per_message = True

    def select(self, topic: str, partitions: list[Partition], message: Message) -> Partition:
        info = failure_info(message)
        if info is None:
            return partitions[0]
        local = [p for p in partitions if p.broker_id == info.partition.broker_id] or partitions
        return local[(info.attempts - 1) % len(local)]
