"""Typed views of the broker's replies: named fields instead of header lookups.

``XReply.of(reply)`` takes any received reply (a header dict and a body, as the client's
connection returns them), checks that it is a success and has the fields its command
promises, and raises ReplyError (code and one-line message) otherwise. Readers that
branch on error codes (the replica fetcher on 301/404) check ``reply.code`` first.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Iterator, Protocol

import msgpack

from .codes import CODE_NAMES, INTERNAL_ERROR, OK
from .messages import StatsRequest


class ReplyError(Exception):
    """A reply that is not the success its command promises."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message


class ReceivedReply(Protocol):
    header: dict[str, Any]
    body: Any  # bytes-like


def _checked(reply: ReceivedReply, what: str) -> dict[str, Any]:
    header = reply.header
    code = header.get("code", INTERNAL_ERROR)
    if code != OK:
        raise ReplyError(code, f"{what}: {header.get('msg', CODE_NAMES.get(code, ''))}")
    return header


@contextmanager
def _well_formed(what: str) -> Iterator[None]:
    """A missing or ill-typed field while reading a success reply: a ReplyError too."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplyError(INTERNAL_ERROR, f"{what}: malformed reply ({type(exc).__name__}: {exc})") from None


def _ints(reply: ReceivedReply, what: str, *names: str) -> list[int]:
    header = _checked(reply, what)
    with _well_formed(what):
        return [int(header[name]) for name in names]


@dataclass(frozen=True)
class PutReply:
    partition: int
    offset: int
    msg_id: int
    count: int
    end_offset: int
    epoch: int

    @classmethod
    def of(cls, reply: ReceivedReply) -> "PutReply":
        return cls(*_ints(reply, "put", "partition", "offset", "msg_id", "count", "end_offset", "epoch"))


@dataclass(frozen=True)
class FetchReply:
    """A ``get`` that returned log bytes from ``offset`` on.

    ``aborted``: byte spans ``(start, end)`` of records of rolled-back transactions that
    overlap the returned range (empty for a partition without transactions); a reader
    skips them and every control record (metaq/txn/reader.py).
    """

    offset: int
    committed: int
    log_end: int
    epoch: int
    body: Any
    aborted: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, reply: ReceivedReply) -> "FetchReply":
        ints = _ints(reply, "get", "offset", "committed", "log_end", "epoch")
        return cls(*ints, reply.body, aborted_spans(reply.header))


def aborted_spans(header: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    """The ``aborted`` field of a ``get`` reply: ``[[start, end], ...]`` (absent: none)."""
    with _well_formed("get"):
        return tuple((int(start), int(end)) for start, end in header.get("aborted") or ())


@dataclass(frozen=True)
class TransactionReply:
    """A ``transaction`` the coordinator answered: its XA code (metaq/txn/xa.py ``Code``).

    The code is the branch's outcome, not a protocol error: XA_OK, XA_RDONLY, XA_RB*,
    XA_HEUR* and XAER_* all come in a 200 reply. ``xids``: what ``recover`` lists.
    """

    xa_code: int
    xids: tuple[str, ...] = ()

    @classmethod
    def of(cls, reply: ReceivedReply) -> "TransactionReply":
        header = _checked(reply, "transaction")
        with _well_formed("transaction"):
            return cls(int(header["xa_code"]), tuple(str(x) for x in header.get("xids") or ()))


@dataclass(frozen=True)
class OffsetReply:
    offset: int  # the nearest message boundary (a segment start) at or before the asked offset
    min_offset: int
    max_offset: int  # what consumers may read up to (the committed offset)

    @classmethod
    def of(cls, reply: ReceivedReply) -> "OffsetReply":
        return cls(*_ints(reply, "offset", "offset", "min_offset", "max_offset"))


@dataclass(frozen=True)
class OffsetForTimeReply:
    offset: int  # the first readable offset whose record time is >= the asked time; max_offset if latest
    latest: bool  # no readable record is that late: offset is the end (where new messages will be)
    min_offset: int
    max_offset: int  # what consumers may read up to (the committed offset)

    @classmethod
    def of(cls, reply: ReceivedReply) -> "OffsetForTimeReply":
        offset, min_offset, max_offset = _ints(reply, "offset_for_time", "offset", "min_offset", "max_offset")
        return cls(offset, bool(reply.header.get("latest")), min_offset, max_offset)


@dataclass(frozen=True)
class ChecksumReply:
    start: int
    end: int  # clamped to the log end
    crc: int

    @classmethod
    def of(cls, reply: ReceivedReply) -> "ChecksumReply":
        return cls(*_ints(reply, "checksum", "start", "end", "crc"))


@dataclass(frozen=True)
class EpochEndReply:
    epoch: int  # the largest epoch <= the asked one
    end_offset: int  # where it ends in this log

    @classmethod
    def of(cls, reply: ReceivedReply) -> "EpochEndReply":
        return cls(*_ints(reply, "epoch_end", "epoch", "end_offset"))


@dataclass(frozen=True)
class EpochsReply:
    entries: list[tuple[int, int]]  # (epoch, start offset), oldest first

    @classmethod
    def of(cls, reply: ReceivedReply) -> "EpochsReply":
        header = _checked(reply, "epochs")
        with _well_formed("epochs"):
            return cls([(int(epoch), int(start)) for epoch, start in header["entries"]])


@dataclass(frozen=True)
class TopicsReply:
    topics: dict[str, int]  # name -> number of partitions
    role: str
    epoch: int
    replication_mode: str
    #: name -> the incarnation served (topics without one are left out, as the broker sends it).
    incarnations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, reply: ReceivedReply) -> "TopicsReply":
        header = _checked(reply, "topics")
        with _well_formed("topics"):
            topics = {str(name): int(parts) for name, parts in dict(header["topics"]).items()}
            mode = str(header.get("replication_mode", "async"))
            incarnations = {str(name): str(id_) for name, id_ in dict(header.get("incarnations") or {}).items()}
            return cls(topics, str(header.get("role", "")), int(header.get("epoch", 0)), mode, incarnations)

    def serves(self, topic: str, partitions: int | None, incarnation: str | None) -> bool:
        """Whether the broker serves ``topic`` as written: ``partitions`` (None: not at all) of
        ``incarnation`` (None or "": a topic without one). The count alone cannot tell a topic
        re-created with as many partitions from the old one a member has not dropped yet."""
        if self.topics.get(topic) != partitions:
            return False
        return partitions is None or self.incarnations.get(topic, "") == (incarnation or "")


@dataclass(frozen=True)
class ConfigReply:
    checksum: int
    raw: bytes  # the master's server.ini

    @classmethod
    def of(cls, reply: ReceivedReply) -> "ConfigReply":
        (checksum,) = _ints(reply, "config", "checksum")
        return cls(checksum, bytes(reply.body))


@dataclass(frozen=True)
class StatsReply:
    """A ``stats`` reply in ``format: "map"``: ``(name, value)`` pairs in the broker's order.

    A value is a scalar or a row (a dict of named fields): ``{topic}-{id}-{p}`` offsets
    rows (``min_offset``, ``max_offset``, ``committed``, ``flushed``), a master's
    ``slave{k} {topic}-{id}-{p}`` replication rows, a slave's ``replica {topic}-{id}-{p}`` rows.
    """

    pairs: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, reply: ReceivedReply) -> "StatsReply":
        header = _checked(reply, "stats")
        if header.get("format") != "map":
            raise ReplyError(INTERNAL_ERROR, "stats: the broker answered in text, not in format 'map'")
        try:
            decoded = msgpack.unpackb(bytes(reply.body), raw=False)
            return cls(tuple((str(name), value) for name, value in decoded))
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ReplyError(INTERNAL_ERROR, f"stats: malformed map body ({exc})") from None

    def get(self, name: str, default: Any = None) -> Any:
        for key, value in self.pairs:
            if key == name:
                return value
        return default

    def replica_rows(self) -> dict[str, dict[str, Any]]:
        """A slave's own view, ``replica {topic}-{id}-{p}`` rows, by partition name."""
        return {name[8:]: value for name, value in self.pairs if name.startswith("replica ") and isinstance(value, dict)}

    def slave_rows(self) -> list[tuple[int, str, dict[str, Any]]]:
        """A master's replication rows ``slave{k} {topic}-{id}-{p}``: ``(k, partition name, row)``."""
        rows = []
        for name, value in self.pairs:
            head, _, partition = name.partition(" ")
            if head.startswith("slave") and head[5:].isdigit() and partition and isinstance(value, dict):
                rows.append((int(head[5:]), partition, value))
        return rows

    def row(self, name: str) -> dict[str, Any] | None:
        value = self.get(name)
        return value if isinstance(value, dict) else None


class Requester(Protocol):
    def request(self, header: dict[str, Any], body: bytes = ..., timeout: float | None = ...) -> Awaitable[Any]: ...


async def fetch_stats(conn: Requester, item: str = "", timeout: float = 10.0) -> StatsReply:
    """A broker's stats for ``item`` as data (ReplyError if it refuses; the connection's
    errors, e.g. ConnectionClosed or a timeout, pass through)."""
    reply = await conn.request(StatsRequest(item=item, format="map").to_header(), timeout=timeout)
    return StatsReply.of(reply)
