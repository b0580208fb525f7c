"""Options of the ``metaq`` Spark source: parsing and validation, with errors that name the option.

Spark passes options as strings; keys are matched case-insensitively (as Spark does for
its own sources). Everything here is pure and runs on the driver before any connection.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping

from ..addresses import check_zk_connect
from ..config import check_topic_name, check_zk_root
from .login import LOGIN_OPTIONS, SparkLogin
from .options_error import OptionError

READ_FROM_CHOICES = ("slave", "prefer-slave", "master")
EARLIEST = "earliest"
LATEST = "latest"
KEYWORDS = (EARLIEST, LATEST)
_PARTITION_NAME = re.compile(r"^\d+-\d+$")

DEFAULT_FETCH_BYTES = 1 << 20  # the broker's default maxTransferSize caps consumer fetches here
DEFAULT_TIMEOUT_MS = 60_000

#: Option names as documented (the keys Spark hands us may be lower-cased).
KNOWN_OPTIONS = (
    "zkConnect",
    "zkRoot",
    "topic",
    "readFrom",
    "startingOffsets",
    "endingOffsets",
    "maxBytesPerPartition",
    "fetchBytes",
    "timeoutMs",
    "maxMessagesPerTrigger",
    "maxBytesPerTrigger",
    "failOnDataLoss",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    *LOGIN_OPTIONS,
)
#: ``startingOffsetsByTimestampStrategy``: what a partition with no message at or after its
#: starting time does (Kafka's): fail the query, or start at the latest offset.
TIMESTAMP_STRATEGIES = ("error", "latest")


@dataclass(frozen=True)
class OffsetSpec:
    """``startingOffsets`` / ``endingOffsets``: a default keyword plus per-partition values.

    ``per_partition`` maps a partition name (``"{brokerId}-{n}"``) to a byte offset (a
    message boundary) or to ``"earliest"`` / ``"latest"``; partitions not named get
    ``default``.
    """

    default: str
    per_partition: Mapping[str, int | str] = field(default_factory=dict)

    def value_for(self, name: str) -> int | str:
        return self.per_partition.get(name, self.default)

    def to_json(self) -> str:
        return json.dumps(dict(self.per_partition)) if self.per_partition else self.default


def parse_offsets(text: str | None, option: str, default: str) -> OffsetSpec:
    """Parse ``earliest``, ``latest`` or a JSON object like ``{"0-0": 0, "0-1": "earliest"}``."""
    if text is None or not str(text).strip():
        return OffsetSpec(default)
    raw = str(text).strip()
    if raw.lower() in KEYWORDS:
        return OffsetSpec(raw.lower())
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {option}: not 'earliest', 'latest' or a JSON object of partition offsets "
            f"(like {{\"0-0\": 0, \"0-1\": \"earliest\"}}): {exc.msg} at position {exc.pos} in {raw!r}"
        ) from None
    if not isinstance(value, dict):
        raise OptionError(f"option {option}: expected a JSON object of partition offsets, got {type(value).__name__} {raw!r}")
    per_partition: dict[str, int | str] = {}
    for name, offset in value.items():
        if not _PARTITION_NAME.match(name):
            raise OptionError(f"option {option}: {name!r} is not a partition name (expected '{{brokerId}}-{{n}}', like '0-1')")
        if isinstance(offset, str) and offset.lower() in KEYWORDS:
            per_partition[name] = offset.lower()
        elif isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
            per_partition[name] = offset
        elif isinstance(offset, int) and not isinstance(offset, bool) and offset in (-1, -2):
            # Kafka's spelling: -2 earliest, -1 latest.
            per_partition[name] = EARLIEST if offset == -2 else LATEST
        else:
            raise OptionError(
                f"option {option}: offset of partition {name} must be a byte offset >= 0, 'earliest' or 'latest', got {offset!r}"
            )
    return OffsetSpec(default, per_partition)


@dataclass(frozen=True)
class TimeSpec:
    """Kafka's ``startingTimestamp`` / ``startingOffsetsByTimestamp`` (or the ``ending`` pair): a
    time in ms since 1970 for every partition (``every``) or per partition name."""

    option: str  # the option it came from, named in errors
    every: int | None = None
    per_partition: Mapping[str, int] = field(default_factory=dict)

    def time_for(self, name: str) -> int | None:
        return self.every if self.every is not None else self.per_partition.get(name)


def parse_times(opts: Mapping[str, str], single: str, by_partition: str) -> TimeSpec | None:
    """``single`` (one time for every partition) wins over ``by_partition`` (JSON), as in Kafka."""
    raw = str(opts.get(single) or "").strip()
    if raw:
        return TimeSpec(single, every=_time_ms(raw, single))
    raw = str(opts.get(by_partition) or "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {by_partition}: not a JSON object of partition times (like {{\"0-0\": 1700000000000}}):"
                          f" {exc.msg} at position {exc.pos} in {raw!r}") from None
    if not isinstance(value, dict) or not value:
        raise OptionError(f"option {by_partition}: expected a JSON object of partition times in ms, got {raw!r}")
    times = {}
    for name, time_ms in value.items():
        if not _PARTITION_NAME.match(name):
            raise OptionError(f"option {by_partition}: {name!r} is not a partition name (expected '{{brokerId}}-{{n}}', like '0-1')")
        times[name] = _time_ms(time_ms, f"{by_partition} of partition {name}")
    return TimeSpec(by_partition, per_partition=times)


def _time_ms(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise OptionError(f"option {what}: expected milliseconds since 1970 (an integer >= 0), got {value!r}")
    try:
        time_ms = int(str(value).strip())
    except ValueError:
        raise OptionError(f"option {what}: expected milliseconds since 1970 (an integer >= 0), got {value!r}") from None
    if not 0 <= time_ms < 1 << 63:
        raise OptionError(f"option {what}: expected milliseconds since 1970 (an integer >= 0), got {value!r}")
    return time_ms


def canonical_options(options: Mapping[str, str] | None, known: tuple[str, ...], what: str) -> dict[str, str]:
    """Options under their documented names (Spark may lower-case keys); unknown ones refused."""
    canonical = {name.lower(): name for name in known}
    opts = {canonical.get(str(key).lower(), str(key)): value for key, value in dict(options or {}).items()}
    unknown = sorted(k for k in opts if k not in known and k.lower() != "path")
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)}; {what} takes: {', '.join(known)}")
    return opts


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise OptionError(f"option {name}: expected true or false, got {raw!r}")


def positive_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name}: expected a positive integer, got {raw!r}") from None
    if value <= 0:
        raise OptionError(f"option {name}: expected a positive integer, got {raw!r}")
    return value


def cluster_options(opts: Mapping[str, str]) -> tuple[str, str]:
    """``zkConnect`` and ``zkRoot``, checked as the client checks them, with the option named
    (a bad connect string would otherwise fail later, inside the client, without the option's name)."""
    zk_connect = str(opts.get("zkConnect") or "").strip()
    if not zk_connect:
        raise OptionError("option zkConnect is required (the ZooKeeper connect string, like '127.0.0.1:2181')")
    try:
        check_zk_connect(zk_connect)
    except ValueError as exc:
        raise OptionError(f"option zkConnect: {exc}") from None
    try:
        zk_root = check_zk_root(str(opts.get("zkRoot") or "/meta"))
    except ValueError as exc:
        raise OptionError(f"option zkRoot {exc}") from None
    return zk_connect, zk_root


def topic_option(opts: Mapping[str, str]) -> str | None:
    """Option ``topic`` (None if not given), refused at once if no broker could have such a topic."""
    topic = str(opts.get("topic") or "").strip() or None
    if topic is not None:
        try:
            check_topic_name(topic)
        except ValueError as exc:
            raise OptionError(f"option topic: {exc}") from None
    return topic


@dataclass(frozen=True)
class SourceOptions:
    zk_connect: str
    topic: str
    zk_root: str = "/meta"
    read_from: str = "slave"
    starting: OffsetSpec = OffsetSpec(EARLIEST)
    ending: OffsetSpec = OffsetSpec(LATEST)
    max_bytes_per_partition: int | None = None
    fetch_bytes: int = DEFAULT_FETCH_BYTES
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    login: SparkLogin = SparkLogin()
    #: Streams: at most about this many records / log bytes per micro-batch (None: no limit).
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    #: Streams: a checkpointed offset that retention already deleted fails the query (else: skip ahead).
    fail_on_data_loss: bool = True
    #: Kafka's time options: where to start (over ``starting``) and, batch only, end (over ``ending``).
    starting_times: TimeSpec | None = None
    ending_times: TimeSpec | None = None
    #: ``startingOffsetsByTimestampStrategy``: a partition with no message that late fails (``error``) or starts at the end.
    timestamp_strategy: str = "error"

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool = False) -> "SourceOptions":
        opts = canonical_options(options, KNOWN_OPTIONS, "the metaq source")
        zk_connect, zk_root = cluster_options(opts)
        topic = topic_option(opts)
        if topic is None:
            raise OptionError("option topic is required (the topic to read)")
        read_from = str(opts.get("readFrom") or "slave").strip().lower()
        if read_from not in READ_FROM_CHOICES:
            raise OptionError(f"option readFrom must be one of {', '.join(READ_FROM_CHOICES)}; got {opts.get('readFrom')!r}")
        # Like Kafka: a batch starts at the earliest offsets, a new stream at the latest.
        starting = parse_offsets(opts.get("startingOffsets"), "startingOffsets", LATEST if streaming else EARLIEST)
        if streaming and opts.get("endingOffsets"):
            raise OptionError("option endingOffsets is for batch reads only (a stream reads up to the committed offsets)")
        for limit in ("maxMessagesPerTrigger", "maxBytesPerTrigger"):
            if not streaming and opts.get(limit):
                raise OptionError(f"option {limit} is for streams only (a batch read reads its whole range)")
        ending = parse_offsets(opts.get("endingOffsets"), "endingOffsets", LATEST)
        if streaming:
            for option in ("endingTimestamp", "endingOffsetsByTimestamp"):
                if opts.get(option):
                    raise OptionError(f"option {option} is for batch reads only (a stream reads up to the committed offsets)")
        strategy = str(opts.get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
        if strategy not in TIMESTAMP_STRATEGIES:
            raise OptionError(f"option startingOffsetsByTimestampStrategy must be one of {', '.join(TIMESTAMP_STRATEGIES)};"
                              f" got {opts.get('startingOffsetsByTimestampStrategy')!r}")
        if not streaming:
            if ending.default == EARLIEST or EARLIEST in ending.per_partition.values():
                raise OptionError("option endingOffsets: 'earliest' is not an end (use a byte offset or 'latest')")
        return cls(
            zk_connect=zk_connect,
            topic=topic,
            zk_root=zk_root,
            read_from=read_from,
            starting=starting,
            ending=ending,
            max_bytes_per_partition=positive_int(opts, "maxBytesPerPartition", None),
            fetch_bytes=positive_int(opts, "fetchBytes", DEFAULT_FETCH_BYTES) or DEFAULT_FETCH_BYTES,
            timeout_ms=positive_int(opts, "timeoutMs", DEFAULT_TIMEOUT_MS) or DEFAULT_TIMEOUT_MS,
            login=SparkLogin.parse(opts),
            max_messages_per_trigger=positive_int(opts, "maxMessagesPerTrigger", None),
            max_bytes_per_trigger=positive_int(opts, "maxBytesPerTrigger", None),
            fail_on_data_loss=boolean(opts, "failOnDataLoss", True),
            starting_times=parse_times(opts, "startingTimestamp", "startingOffsetsByTimestamp"),
            ending_times=parse_times(opts, "endingTimestamp", "endingOffsetsByTimestamp"),
            timestamp_strategy=strategy,
        )
