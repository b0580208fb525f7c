"""Typed requests of the metaq protocol, for both sides of a connection.

One small dataclass per command (the table is in commands.py). The sending side builds
one and writes ``to_header()`` (the connection adds ``opaque``); the receiving side gets
one from ``parse_request(frame)``, which checks every field against the class's
declaration and turns a missing or ill-typed field into a 400 with a one-line message.
Handlers read fields as attributes (``req.topic``, ``req.partition``, ``req.replica``).

Each command also declares what a principal must hold to make it: ``operation=`` in its
class statement (read as ``OPERATION``), and ``access`` for the two whose need depends on
a field. metaq/server/authz.py decides with that declaration, before the fields are checked.

A field is declared with ``required(kind)`` or ``optional(kind, default)``. ``None``
on the wire means "absent" (msgpack clients send it for unset optionals), and an absent
optional field takes its default; ``to_header()`` leaves out fields that are None.
Replies are read through the views in replies.py.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Hashable, Mapping, Protocol

from .codes import BAD_REQUEST, RequestError
from .frames import Frame

try:  # compiled during setup (setup.py, metaq/_speedups.c); the same requests without it
    from .._speedups import request_from  # the unit tests run both
except ImportError:
    request_from = None

#: Commands that may be sent as a plain-text line.
TEXT_COMMANDS = frozenset({"stats", "version", "quit"})
STATS_FORMATS = ("text", "map")
DEFAULT_MAX_SIZE = 1024 * 1024


class Operation(enum.Enum):
    """What a principal may do (security on); who holds which is metaq/security/acl.py's table."""

    PRODUCE = "produce"
    CONSUME = "consume"
    DESCRIBE = "describe"
    ADMIN = "admin"
    REPLICATION = "replication"


#: The operations by name, for the commands' declarations below.
PRODUCE, CONSUME, DESCRIBE, ADMIN, REPLICATION = (
    Operation.PRODUCE, Operation.CONSUME, Operation.DESCRIBE, Operation.ADMIN, Operation.REPLICATION,
)
#: Operations on one topic: a request needing one is authorized for the topic it names.
ON_A_TOPIC = (Operation.PRODUCE, Operation.CONSUME, Operation.REPLICATION)
#: What a request needs: (operation, topic or None); None: open before login.
Access = tuple[Operation, str | None] | None


class Origin(Hashable, Protocol):
    """The connection a request came on, as the broker uses it: a key (compared by
    identity) under which it remembers the slaves fetching on it, dropped when it closes."""

    peer: str


_UNDECLARED = object()


def required(kind: type) -> Any:
    return field(metadata={"kind": kind, "required": True})


def optional(kind: type, default: Any) -> Any:
    return field(default=default, metadata={"kind": kind, "required": False})


@dataclass(kw_only=True, eq=False)
class Request:
    """A request: its command's fields, plus ``opaque``, ``body`` and (received) ``origin``."""

    OP: ClassVar[str] = ""
    #: What a principal must hold to make this request; None: open before login. Each command
    #: declares its own in its class statement (``class PutRequest(Request, operation=...)``).
    OPERATION: ClassVar[Operation | None] = Operation.ADMIN
    opaque: int = -1
    body: bytes | bytearray = field(default=b"", repr=False)
    #: The connection it came on (set by the server; lets the broker notice a slave's
    #: replication connection closing).
    origin: Origin | None = field(default=None, repr=False)

    def __init_subclass__(cls, *, operation: Any = _UNDECLARED, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if operation is _UNDECLARED:  # a new command is never open by accident
            raise TypeError(f"{cls.__name__}: declare the operation it needs: class {cls.__name__}(Request, operation=...)")
        cls.OPERATION = operation

    @property
    def op(self) -> str:
        return self.OP

    @classmethod
    def access(cls, header: Mapping[str, Any]) -> Access:
        """What a request of this command needs, read from its raw header (it is authorized before
        its fields are checked, so a principal that may not make it learns nothing from their checks).
        The topic is the header's ``topic`` when it is a string and the operation is on a topic."""
        return cls._access(cls.OPERATION, header)

    @staticmethod
    def _access(operation: Operation | None, header: Mapping[str, Any]) -> Access:
        if operation is None:
            return None
        topic = header.get("topic")
        return operation, topic if operation in ON_A_TOPIC and isinstance(topic, str) else None

    def check(self) -> None:
        """Checks of a decoded request's values beyond their kinds (RequestError); none by default."""

    def to_header(self) -> dict[str, Any]:
        """The frame header to send (without ``opaque``: the connection numbers requests)."""
        header: dict[str, Any] = {"op": self.OP}
        for name, _kind, _required, _default in _fields(type(self)):
            value = getattr(self, name)
            if value is not None:
                header[name] = value
        return header


@cache
def _fields(cls: type[Request]) -> tuple[tuple[str, type, bool, Any], ...]:
    """``(name, kind, required, default)`` of a command's own fields."""
    return tuple(
        (f.name, f.metadata["kind"], f.metadata["required"], f.default)
        for f in dataclasses.fields(cls)
        if "kind" in f.metadata
    )


@dataclass(kw_only=True, eq=False)
class PutRequest(Request, operation=PRODUCE):
    OP = "put"
    topic: str = required(str)
    partition: int = optional(int, -1)  # -1: the broker picks
    count: int | None = optional(int, None)  # checked against the records in the body
    #: An idempotent producer's put (all three or none): its id from ``init_producer``, its
    #: epoch, and the sequence number of the batch's first message in this partition.
    producer_id: int | None = optional(int, None)
    producer_epoch: int | None = optional(int, None)
    sequence: int | None = optional(int, None)
    #: With security on: the ``producer_token`` init_producer answered for this id and epoch.
    producer_token: str | None = optional(str, None)
    #: The transaction the batch belongs to (a transactional producer's put).
    txid: str | None = optional(str, None)


@dataclass(kw_only=True, eq=False)
class InitProducerRequest(Request, operation=DESCRIBE):
    """A new producer id, unique in the cluster, for an idempotent producer (reply: producer_id, epoch).
    DESCRIBE: no topic yet, anyone who may look at the cluster.

    With ``transactional_id``: that name's producer id with its epoch raised by one, once
    every unprepared transaction of the older epochs is rolled back
    (metaq/server/transactional_ids.py).
    """

    OP = "init_producer"
    transactional_id: str | None = optional(str, None)


@dataclass(kw_only=True, eq=False)
class GetRequest(Request, operation=CONSUME):
    # A consumer's fetch needs CONSUME; a slave's (``replica`` set) REPLICATION (``access``).
    OP = "get"
    topic: str = required(str)
    partition: int = required(int)
    offset: int = required(int)
    max_size: int = optional(int, DEFAULT_MAX_SIZE)
    group: str = optional(str, "")
    max_wait_ms: int = optional(int, 0)
    #: A slave's fetch: ``replica_field(slave_id, epoch, log_end)``.
    replica: dict[str, Any] | None = optional(dict, None)

    @classmethod
    def access(cls, header: Mapping[str, Any]) -> Access:
        return cls._access(Operation.REPLICATION if header.get("replica") is not None else cls.OPERATION, header)


@dataclass(kw_only=True, eq=False)
class OffsetRequest(Request, operation=CONSUME):
    """MetaQ's ``offset``: the start of the segment holding ``offset``. With ``realign`` (a
    consumer whose position no longer starts a record, docs/client.md): where to resume
    instead, and how it was found (docs/protocol.md). A broker that predates ``realign``
    ignores it, as every broker ignores header fields its command does not declare."""

    OP = "offset"
    topic: str = required(str)
    partition: int = required(int)
    offset: int = required(int)
    realign: bool | None = optional(bool, None)  # None (left out of the header): a plain `offset`


@dataclass(kw_only=True, eq=False)
class OffsetForTimeRequest(Request, operation=CONSUME):
    """The first offset whose record time (its msg id's timestamp part) is >= ``time_ms``
    (docs/storage.md, "Time index"). CONSUME: the ACL of a fetch of the topic."""

    OP = "offset_for_time"
    topic: str = required(str)
    partition: int = required(int)
    time_ms: int = required(int)

    def check(self) -> None:
        if not -(1 << 63) <= self.time_ms < 1 << 63:
            raise RequestError(BAD_REQUEST, f"offset_for_time: time_ms {self.time_ms} out of range (int64)", self.opaque)


@dataclass(kw_only=True, eq=False)
class StatsRequest(Request, operation=DESCRIBE):
    # Plain stats need DESCRIBE; the items in ``ADMIN_ITEMS`` ADMIN (``access``).
    OP = "stats"
    ADMIN_ITEMS: ClassVar[frozenset[str]] = frozenset({"reset", "config"})
    item: str = optional(str, "")
    format: str = optional(str, "text")  # "map": the stats as msgpack data (StatsReply)

    @classmethod
    def access(cls, header: Mapping[str, Any]) -> Access:
        item = str(header.get("item") or "").strip()
        return cls._access(Operation.ADMIN if item in cls.ADMIN_ITEMS else cls.OPERATION, header)

    def check(self) -> None:
        if self.format not in STATS_FORMATS:
            raise RequestError(BAD_REQUEST, f"stats: field 'format' must be one of {', '.join(STATS_FORMATS)}", self.opaque)


@dataclass(kw_only=True, eq=False)
class VersionRequest(Request, operation=None):
    OP = "version"


@dataclass(kw_only=True, eq=False)
class QuitRequest(Request, operation=None):
    OP = "quit"


@dataclass(kw_only=True, eq=False)
class ConfigRequest(Request, operation=ADMIN):
    OP = "config"


@dataclass(kw_only=True, eq=False)
class TopicsRequest(Request, operation=DESCRIBE):
    OP = "topics"


@dataclass(kw_only=True, eq=False)
class EpochEndRequest(Request, operation=REPLICATION):
    # REPLICATION: the truncation answer of a rejoining broker.
    OP = "epoch_end"
    topic: str = required(str)
    partition: int = required(int)
    epoch: int = required(int)


@dataclass(kw_only=True, eq=False)
class EpochsRequest(Request, operation=ADMIN):
    # ADMIN: a read for operators (a drill); it carries no epoch claim, so it never fences.
    OP = "epochs"
    topic: str = required(str)
    partition: int = required(int)


@dataclass(kw_only=True, eq=False)
class ChecksumRequest(Request, operation=ADMIN):
    OP = "checksum"
    topic: str = required(str)
    partition: int = required(int)
    start: int = required(int)
    end: int = required(int)


@dataclass(kw_only=True, eq=False)
class PositionRequest(Request, operation=REPLICATION):
    OP = "position"
    topic: str = required(str)
    partition: int = required(int)
    replica: dict[str, Any] = required(dict)


@dataclass(kw_only=True, eq=False)
class NewsRequest(Request, operation=REPLICATION):
    """A slave's one long-poll for all of its quiet partitions (metaq/ha/news.py).

    The body is a msgpack list of partitions that went quiet on the slave since its last
    ``news`` request, each ``[topic, partition, log_end, committed, incarnation]`` (what the
    slave holds and has been told). The reply (200, ``epoch``) has a msgpack body listing
    ``[topic, partition]`` of the quiet partitions that have news for it: bytes past its log
    end, a committed offset past what it was told, or a log it must hear about (dropped,
    re-created). It is answered at once when there is news, else at the first news or after
    ``max_wait_ms``; a newer ``news`` on the same connection answers an older parked one.
    """

    OP = "news"
    replica: dict[str, Any] = required(dict)  # {slave_id, epoch}
    max_wait_ms: int = optional(int, 0)


@dataclass(kw_only=True, eq=False)
class StreamRequest(Request, operation=REPLICATION):
    """A caught-up slave subscribes to a partition's replication stream
    (metaq/protocol/replication_stream.py); checked as a replica fetch is. 200 opens it: every
    later frame with this request's ``opaque`` is a chunk of the partition (or, 503, its end)."""

    OP = "stream"
    topic: str = required(str)
    partition: int = required(int)
    replica: dict[str, Any] = required(dict)  # {slave_id, epoch, log_end, incarnation}


@dataclass(kw_only=True, eq=False)
class StreamAckRequest(Request, operation=REPLICATION):
    """A slave's position report on a stream: a 16-byte body (stream id, epoch, end offset),
    bound to the connection that subscribed. One-way: never answered."""

    OP = "stream_ack"


#: ``transaction`` actions, MetaQ's TransactionalProducer and XAResource calls (metaq/txn/xa.py's events):
#: begin = start, send = a put carrying ``txid``, commit = end + commit_one_phase, rollback = end + rollback.
TRANSACTION_ACTIONS = (
    "start", "start_join", "end", "end_fail", "prepare", "commit", "commit_one_phase", "rollback", "forget", "recover",
)


@dataclass(kw_only=True, eq=False)
class TransactionRequest(Request, operation=DESCRIBE):
    """One step of a local or XA transaction branch on the master of a broker group.

    DESCRIBE: any principal that may look at the cluster reaches the coordinator, which decides
    per action and branch with metaq/server/authz.py (who started a branch is known only there).
    """

    OP = "transaction"
    action: str = required(str)
    xid: str = optional(str, "")  # every action but recover
    timeout_s: int = optional(int, 0)  # start: the branch's timeout (0: maxTxTimeoutInSeconds)
    producer_id: int = optional(int, -1)  # start: the producer whose puts carry this xid
    producer_epoch: int = optional(int, 0)
    #: With security on: the ``producer_token`` of producer_id/producer_epoch (when they are sent).
    producer_token: str | None = optional(str, None)

    def check(self) -> None:
        if self.action not in TRANSACTION_ACTIONS:
            raise RequestError(
                BAD_REQUEST, f"transaction: action {self.action!r} is not one of {', '.join(TRANSACTION_ACTIONS)}", self.opaque
            )
        if self.action != "recover" and not self.xid:
            raise RequestError(BAD_REQUEST, f"transaction: action {self.action!r} needs an 'xid'", self.opaque)
        # The fields packed into the branch's markers: one that does not fit would let a decision
        # be journaled whose markers cannot be written (the LSO would stay pinned).
        if self.producer_id != -1 and not 0 <= self.producer_id < 1 << 63 or not 0 <= self.producer_epoch < 1 << 15:
            raise RequestError(BAD_REQUEST, f"transaction: producer_id {self.producer_id} or producer_epoch "
                                            f"{self.producer_epoch} out of range (-1 or 0..2^63-1, 0..32767)", self.opaque)
        if not 0 <= self.timeout_s < 1 << 31:
            raise RequestError(BAD_REQUEST, f"transaction: timeout_s {self.timeout_s} out of range (0..2^31-1)", self.opaque)
        if len(self.xid.encode("utf-8", "surrogatepass")) >= 1 << 16:
            raise RequestError(BAD_REQUEST, "transaction: xid longer than 65535 bytes", self.opaque)


REQUESTS: dict[str, type[Request]] = {
    cls.OP: cls
    for cls in (
        PutRequest, GetRequest, OffsetRequest, StatsRequest, VersionRequest, QuitRequest, ConfigRequest,
        TopicsRequest, EpochEndRequest, EpochsRequest, ChecksumRequest, PositionRequest,
        InitProducerRequest, TransactionRequest, OffsetForTimeRequest,
        NewsRequest, StreamRequest, StreamAckRequest,
    )
}


def _sets_only_its_fields(cls: type[Request]) -> bool:
    """Whether ``cls(**fields)`` does nothing but set them (so request_from may build it):
    object's __new__, a dataclass __init__ with no __post_init__, and no field without a kind
    besides the base's."""
    names = {f.name for f in dataclasses.fields(cls)}
    init = getattr(cls.__init__, "__code__", None)
    generated = init is not None and init.co_filename == "<string>"  # dataclass's, not one written in the class
    return (generated and cls.__new__ is object.__new__ and not hasattr(cls, "__post_init__")
            and names == {"opaque", "body", "origin"} | {name for name, *_ in _fields(cls)})


#: The commands request_from builds (every one today; a new one with an __init__ of its own is left out).
_PLAIN_INIT = frozenset(cls for cls in REQUESTS.values() if _sets_only_its_fields(cls))


def replica_field(slave_id: int, epoch: int, log_end: int) -> dict[str, int]:
    """The ``replica`` field of a slave's fetch or position report."""
    return {"slave_id": slave_id, "epoch": epoch, "log_end": log_end}


def _is_kind(value: Any, kind: type) -> bool:
    # bool is an int subclass, but True is never a partition or an offset.
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def parse_request(frame: Frame) -> Request:
    """The typed request of a frame; RequestError 400 (with the opaque, if readable) if it is not one."""
    header = frame.header
    opaque = header.get("opaque")
    op = header.get("op")
    # Exact types (what msgpack decodes) pass at once; anything else is checked as ever.
    if type(opaque) is not int or type(op) is not str:
        if not _is_kind(opaque, int):
            raise RequestError(BAD_REQUEST, "request header needs an integer 'opaque'", None)
        if not isinstance(op, str):
            raise RequestError(BAD_REQUEST, "request header needs a string 'op'", opaque)
    cls = REQUESTS.get(op)
    if cls is None:
        raise RequestError(BAD_REQUEST, f"unknown command {op!r}", opaque)
    if request_from is not None and cls in _PLAIN_INIT:
        # The fields checked and the request built in C; None: a field is missing or ill-typed,
        # and the loop below says which.
        request = request_from(cls, _fields(cls), header, frame.body)
        if request is not None:
            request.check()
            return request
    values: dict[str, Any] = {}
    for name, kind, is_required, default in _fields(cls):
        value = header.get(name)
        if value is None:
            if is_required:
                raise RequestError(BAD_REQUEST, f"{op}: missing field {name!r}", opaque)
            value = default
        elif not _is_kind(value, kind):
            raise RequestError(BAD_REQUEST, f"{op}: field {name!r} must be {kind.__name__}", opaque)
        values[name] = value
    request = cls(opaque=opaque, body=frame.body, **values)
    request.check()
    return request


def text_request(words: list[str]) -> Request:
    """A plain-text line as a request (RequestError for a command with no text form)."""
    op = words[0].lower() if words else ""
    if op not in TEXT_COMMANDS:
        raise RequestError(BAD_REQUEST, f"unknown text command {op!r} (try: stats, version, quit)")
    if op == "stats":
        # MetaQ's text form is "stats [item] [opaque]"; a trailing number is the opaque.
        rest = [w for w in words[1:] if not w.isdigit()]
        return StatsRequest(item=rest[0] if rest else "")
    return REQUESTS[op]()
