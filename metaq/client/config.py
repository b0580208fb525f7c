"""Client settings: one MetaClientConfig per session factory, one ConsumerConfig per consumer."""

from __future__ import annotations

import os
import socket
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..addresses import check_zk_connect, parse_host_port
from ..config import ZkTls, check_zk_root
from .connection import Credentials
from .retry_topics import DEFAULT_RETRY_DELAYS_S

#: A retry topic gets one partition per delay level: bounded like a topic's partition count.
MAX_RETRY_LEVELS = 64
#: Longer waits belong in a scheduler, not in a partition that holds back the messages behind.
MAX_RETRY_DELAY_S = 7 * 24 * 3600

READ_FROM_CHOICES = ("master", "slave", "prefer-slave")
#: Where a message goes whose listener keeps failing (docs/client.md, "Failed messages").
FAILURE_STORE_CHOICES = ("topic", "local")
DEFAULT_CLIENT_DIR = Path.home() / ".metaq"


def _check_bounds(config: object, at_least_one: tuple[str, ...] = (), positive: tuple[str, ...] = (),
                  not_negative: tuple[str, ...] = ()) -> None:
    """Refuse, at construction, a setting out of its bounds with one line naming the field.

    Checked here and not where a value is used: a zero timeout, interval or size would
    otherwise show up much later as a busy loop, a hang or an odd error far from its cause.
    """
    for names, test, bound in ((at_least_one, lambda v: v >= 1, ">= 1"), (positive, lambda v: v > 0, "> 0"),
                               (not_negative, lambda v: v >= 0, ">= 0")):
        for name in names:
            value = getattr(config, name)
            if not test(value):
                raise ValueError(f"{name} must be {bound}, got {value!r}")


def _check_order(config: object, low: str, high: str) -> None:
    if getattr(config, low) > getattr(config, high):
        raise ValueError(f"{low} must be <= {high}, got {getattr(config, low)!r} > {getattr(config, high)!r}")


@dataclass
class MetaClientConfig:
    """What every producer and consumer of one factory shares: ZooKeeper and timeouts."""

    zk_connect: str = "127.0.0.1:2181"
    zk_root: str = "/meta"
    zk_session_timeout_ms: int = 30_000
    zk_connection_timeout_ms: int = 30_000
    #: Timeout of one request to a broker (a long-poll fetch adds its wait to it).
    request_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    #: Producer retries of retriable errors (403/503, no connection, no master yet).
    #: Bounded by ``send_timeout_s`` first: enough attempts to ride out a failover,
    #: whose length is about the brokers' ZooKeeper session timeout.
    send_max_attempts: int = 100
    #: A send gives up after this long in total, attempts left or not.
    send_timeout_s: float = 15.0
    send_retry_min_wait_s: float = 0.05
    send_retry_max_wait_s: float = 0.5
    #: Resend a put whose outcome is unknown (lost connection after sending, timeout, 504)?
    #: On by default, so that a failover is a pause and not an error (at-least-once: a
    #: resent message may be stored twice; the drill counts such duplicates). Off gives
    #: at-most-once: the SendResult says outcome_unknown and the application decides.
    retry_unknown_outcome: bool = True
    #: Idempotent producer: every put carries a producer id and a sequence number per
    #: partition, and a resent put that the broker already stored is answered with its
    #: original offsets instead of being stored again, also through a failover (exactly
    #: once in the log; docs/transactions.md). Retries then stay on the batch's partition.
    #: Opt-in: measured against the plain producer it stays within 10% for pipelined
    #: sends, but one-at-a-time blocking sends on a sync pair lose about a fifth and
    #: ``send_batch`` on a single master about a tenth (docs/benchmarks.md).
    idempotence: bool = False
    #: Per-message sends are gathered into one put per partition (Kafka's producer batching;
    #: MetaQ's producer has no such settings). A partition's batch is sent when it holds
    #: ``batch_size`` bytes, when its oldest message has waited ``linger_ms``, or as soon as
    #: the partition's previous put returns. 0 (Kafka's default before 4.0): no added wait;
    #: messages sent while a put is in flight still share the next one.
    linger_ms: float = 0.0
    #: Bytes per put at most (one message larger than this goes alone). Larger than Kafka's
    #: 16 KiB because a partition has one put in flight at a time in the plain producer (that
    #: is what keeps its order across retries), so a put carries what arrived during one round
    #: trip; an idempotent producer keeps order by its numbers (``max_in_flight_per_partition``).
    batch_size: int = 256 * 1024
    #: Bytes of messages queued or in flight, at most; beyond it ``send_message_async``
    #: fails the message at once and ``send`` / ``send_message`` / the blocking facade wait.
    buffer_memory: int = 32 * 1024 * 1024
    #: Puts in flight on one broker's connection at most (each to a different partition).
    max_in_flight_per_connection: int = 5
    #: Idempotent producer: numbered puts of one partition in flight at most (Kafka's
    #: ``max.in.flight.requests.per.connection`` under idempotence). 1..5: the broker tells
    #: apart retries of its last 5 batches per producer and partition
    #: (``producerStateMaxBatches``). The plain producer always keeps one per partition.
    max_in_flight_per_partition: int = 5
    #: Connect somewhere else than a broker registered: ``{"registered host:port": "host:port"}``
    #: (port forwarding, NAT, a proxy in front of some brokers). Addresses not listed are used as is.
    address_map: dict[str, str] = field(default_factory=dict)
    #: User, password and CA for brokers with security on (docs/security.md); none by default.
    credentials: Credentials = field(default_factory=Credentials)
    #: ZooKeeper over TLS (CA, optional client certificate, host-name check; docs/security.md).
    #: None: the METAQ_ZK_TLS_* environment decides, else plaintext.
    zk_tls: ZkTls | None = None

    def __post_init__(self) -> None:
        try:
            check_zk_connect(self.zk_connect)
        except ValueError as exc:
            raise ValueError(f"zk_connect: {exc}") from None
        try:
            check_zk_root(self.zk_root)
        except ValueError as exc:
            raise ValueError(f"zk_root {exc}") from None
        _check_bounds(
            self,
            at_least_one=("zk_session_timeout_ms", "send_max_attempts", "batch_size", "buffer_memory",
                          "max_in_flight_per_connection"),
            positive=("request_timeout_s", "connect_timeout_s", "send_timeout_s", "send_retry_max_wait_s"),
            # 0 ms: one immediate try (metaq produce/consume --zk-connect-timeout rounds down to whole ms).
            not_negative=("zk_connection_timeout_ms", "send_retry_min_wait_s", "linger_ms"),
        )
        _check_order(self, "send_retry_min_wait_s", "send_retry_max_wait_s")
        if not 1 <= self.max_in_flight_per_partition <= 5:
            raise ValueError(f"max_in_flight_per_partition must be 1..5 (the broker remembers 5 batches "
                             f"per producer and partition), got {self.max_in_flight_per_partition}")
        for address in (*self.address_map, *self.address_map.values()):
            try:
                parse_host_port(address)
            except ValueError as exc:
                raise ValueError(f"address_map: {exc}") from None


def default_consumer_id() -> str:
    # MetaQ's default: host-pid-UUID, unique even for several consumers in one process.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


@dataclass
class ConsumerConfig:
    """One consumer's settings.

    ``read_from`` (see routing.choose_replica): ``master`` (MetaQ's rule: the master if
    present, else a slave), ``slave`` (slaves only: the master is never read) or
    ``prefer-slave`` (a slave if present, else the master).
    Where a partition starts (MetaQ's rule, see ``start_offset``): at the group's stored
    offset; a group without one starts at ``offset`` (default 0: the oldest message the
    broker still has), or at the newest with ``consume_from_max_offset``. With
    ``always_consume_from_max_offset`` stored offsets are ignored as well: every partition
    this consumer takes starts at the newest (messages sent meanwhile are skipped).
    ``from_beginning`` is deprecated: True is now the default, False means
    ``consume_from_max_offset=True``.
    ``broadcast``: every consumer of the group gets every message; offsets are kept in
    a local file (``offset_store_path``) instead of ZooKeeper and no owners are taken.
    """

    group: str
    read_from: str = "master"
    consumer_id: str = field(default_factory=default_consumer_id)
    #: Where a group without a stored offset starts: a message's offset (as SendResult
    #: reports it), moved into the partition's [oldest, newest] range. MetaQ's default 0.
    offset: int = 0
    consume_from_max_offset: bool = False
    always_consume_from_max_offset: bool = False
    from_beginning: bool | None = None  # deprecated, see the class docstring
    broadcast: bool = False
    #: Bytes asked per fetch; doubled for a record larger than this (up to max_fetch_size).
    fetch_size: int = 256 * 1024
    max_fetch_size: int = 64 * 1024 * 1024
    #: Long-poll: how long the broker holds a fetch that finds no data.
    fetch_wait_ms: int = 1000
    #: Back-off after a failed fetch (broker gone, 403...), doubled up to the max.
    fetch_retry_min_s: float = 0.1
    fetch_retry_max_s: float = 2.0
    commit_interval_s: float = 5.0
    #: Where a message whose listener raised goes: ``"topic"`` (the default), back to the
    #: group's retry topic and after ``max_reconsume_times`` retries to its dead-letter topic
    #: (retry_topics.py); ``"local"``, MetaQ's local recover store (``recover_dir``).
    failure_store: str = "topic"
    #: failure_store="topic": retries through the retry topic before the dead-letter topic
    #: (a message is delivered at most 1 + this many times). RocketMQ's default 16.
    max_reconsume_times: int = 16
    #: failure_store="topic": the wait before retry k is ``retry_delays_s[k-1]`` (the last
    #: one repeats). RocketMQ's levels from 10 s; the retry topic gets one partition per level.
    retry_delays_s: tuple[float, ...] = DEFAULT_RETRY_DELAYS_S
    #: failure_store="topic": add the retry and dead-letter topics to a broker group's topic
    #: configuration when they are missing (refused by ZooKeeper in a secured group).
    auto_create_failure_topics: bool = True
    #: failure_store="topic": partitions of a retry topic this consumer creates; None: one per
    #: delay (no delay holds back a shorter one). Fewer cost less (each is a log on every
    #: member and a long-poll fetch of the group) at the price of late retries.
    retry_topic_partitions: int | None = None
    #: failure_store="local": calls of a failing listener per message before it goes to the recover store.
    max_retries: int = 5
    #: Store offsets in this JSON file instead of ZooKeeper (always used in broadcast mode).
    offset_store_path: str | None = None
    #: Store offsets in a SQL database instead (SQLAlchemy URL; see offsets_sql.py).
    offset_store_url: str | None = None
    recover_dir: str | None = None
    recover_interval_s: float = 5.0
    #: How long a rebalance waits for a previous owner to release a partition.
    claim_timeout_s: float = 60.0
    #: Iterating the consumer (``for message in consumer``) ends after this many seconds
    #: without a message (kafka-python's ``consumer_timeout_ms``); None: it waits until shutdown.
    iterator_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group or "/" in self.group or self.group in (".", ".."):
            # It names ZooKeeper nodes (/consumers/{group}/...), which refuse '.' and '..'.
            raise ValueError(f"consumer group must be a non-empty name without '/' (and not '.' or '..'), got {self.group!r}")
        if not isinstance(self.consumer_id, str) or not self.consumer_id or "/" in self.consumer_id:
            # It names the member's ZooKeeper node (ids/{group}_{consumer_id}): one path component.
            raise ValueError(f"consumer_id must be a non-empty name without '/', got {self.consumer_id!r}")
        if self.read_from not in READ_FROM_CHOICES:
            raise ValueError(f"read_from must be one of {', '.join(READ_FROM_CHOICES)}, got {self.read_from!r}")
        _check_bounds(
            self,
            at_least_one=("max_retries", "fetch_size"),
            positive=("fetch_retry_min_s", "fetch_retry_max_s", "commit_interval_s", "recover_interval_s",
                      "claim_timeout_s"),
            not_negative=("offset", "fetch_wait_ms"),
        )
        _check_order(self, "fetch_size", "max_fetch_size")
        _check_order(self, "fetch_retry_min_s", "fetch_retry_max_s")
        self._check_failure_settings()
        if self.iterator_timeout_s is not None and self.iterator_timeout_s <= 0:
            raise ValueError(f"iterator_timeout_s must be > 0 or None, got {self.iterator_timeout_s!r}")
        if self.offset_store_path and self.offset_store_url:
            # Two stores would each hold a part of the truth: one of them must be chosen.
            raise ValueError("offset_store_path and offset_store_url: give one of the two, not both")
        if self.from_beginning is not None:
            warnings.warn(
                "ConsumerConfig(from_beginning=...) is deprecated: a new group now starts at the oldest message "
                "(MetaQ's rule); use consume_from_max_offset=True to start at the newest",
                DeprecationWarning, stacklevel=3,
            )
            if not self.from_beginning:
                self.consume_from_max_offset = True
        if self.always_consume_from_max_offset:
            self.consume_from_max_offset = True

    def _check_failure_settings(self) -> None:
        if self.failure_store not in FAILURE_STORE_CHOICES:
            raise ValueError(f"failure_store must be one of {', '.join(FAILURE_STORE_CHOICES)}, got {self.failure_store!r}")
        if isinstance(self.max_reconsume_times, bool) or not isinstance(self.max_reconsume_times, int) or self.max_reconsume_times < 0:
            raise ValueError(f"max_reconsume_times must be an int >= 0, got {self.max_reconsume_times!r}")
        delays = self.retry_delays_s
        if (not isinstance(delays, (tuple, list)) or not delays or len(delays) > MAX_RETRY_LEVELS
                or not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= MAX_RETRY_DELAY_S for d in delays)):
            raise ValueError(f"retry_delays_s must be 1..{MAX_RETRY_LEVELS} delays in seconds, each 0..{MAX_RETRY_DELAY_S}, got {delays!r}")
        self.retry_delays_s = tuple(delays)
        partitions = self.retry_topic_partitions
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_RETRY_LEVELS):
            raise ValueError(f"retry_topic_partitions must be None (one per delay) or 1..{MAX_RETRY_LEVELS}, got {partitions!r}")

    def set_consume_from_max_offset(self, always: bool = False) -> "ConsumerConfig":
        """MetaQ's ``setConsumeFromMaxOffset``: start at the newest message; ``always``: even with a stored offset."""
        self.consume_from_max_offset = True
        self.always_consume_from_max_offset = always
        return self

    def start_offset(self, min_offset: int, max_offset: int) -> int:
        """Where a partition without a (usable) stored offset starts, given its oldest and newest offsets."""
        if self.consume_from_max_offset:
            return max_offset
        return min(max(self.offset, min_offset), max_offset)

    def describe_start(self) -> str:
        if self.consume_from_max_offset:
            return "the newest message" + (" (always)" if self.always_consume_from_max_offset else "")
        return "the oldest message" if self.offset == 0 else f"offset {self.offset}"

    def resolved_offset_store_path(self) -> Path | None:
        if self.offset_store_path:
            return Path(self.offset_store_path)
        if self.broadcast:
            return DEFAULT_CLIENT_DIR / "offsets" / f"{self.group}.json"
        return None

    def resolved_recover_dir(self) -> Path:
        base = Path(self.recover_dir) if self.recover_dir else DEFAULT_CLIENT_DIR / "recover"
        return base / self.group
