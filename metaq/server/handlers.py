"""Request handlers: what the broker does for each command.

A handler returns either its reply at once, as ``(header, body)``, or an
awaitable of it when it has to wait (fsync, sync replication, long-poll). All
the checks and the append itself happen in the synchronous part, so a put is
in the log, in arrival order, before the next request on the connection is
looked at.

Each command has exactly one handler, registered for its request type with
``@handles(...)`` (``HANDLERS``). A handler gets the request already authorized by its
connection, with the ``RequestContext`` it was decided with; any further decision about
who may do what (a producer's token, a transaction branch) is asked of ``broker.authz``
(metaq/server/authz.py).

Invariants kept here:
* nothing is appended unless the whole batch validated (lengths, CRCs, flags),
  so a malformed put never leaves a partial message in a log;
* a consumer fetch never returns bytes past the partition's last stable offset
  (the committed offset, capped before the first open transaction), and carries
  the aborted transaction spans of its range; only a slave's replica fetch reads
  up to the log end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, TypeVar

import msgpack

from .. import __version__
from ..config import BrokerConfig, TopicConfig
from ..deferred import Deferred
from ..ha.answerer import NotMasterRefusal, answerer_fields
from ..ha.node import HaNode
from ..ha.sync_set import SyncWaitFailed
from ..protocol import commands as c
from ..protocol import messages as m
from ..protocol.replication_stream import decode_report
from ..record import HEADER, HEADER_SIZE, RecordError, validate_batch
from ..security.principals import BROKER_PREFIX
from ..store.log import CorruptRange, OffsetOutOfRange, SegmentVanished
from ..store.manager import MessageStoreManager, UnknownPartition, UnknownTopic
from ..store.incarnation import same_life
from ..store.refused import RefusedLog
from ..txn.control import Control, find_forged_control
from ..txn.producer_state import Decision, Verdict
from ..txn.put import PutRefused, plan_put
from . import stats as stats_text
from .authz import Authz, RequestContext
from .connection import SENDFILE_MIN_BYTES, FileBody
from .partitions import Appended, Partition, Partitions
from .producer_ids import ProducerIdAllocator
from .registry import BrokerRegistry
from .stats import BrokerStats
from .transactional_ids import NotOwner, TooManyNames, TransactionalIds, check_transactional_id
from .transactions import Fence, TransactionService, aborted_spans, fenced_message, stable_end
from .waiters import EndWaiters

if TYPE_CHECKING:
    from ..store.log import PartitionLog

logger = logging.getLogger(__name__)

MAX_BATCH_COUNT = 4096
MAX_CHECKSUM_RANGE = 256 * 1024 * 1024
#: A slave's fetch may carry more than maxTransferSize: sync acks wait on its round trips.
MAX_REPLICA_TRANSFER = 16 * 1024 * 1024
Reply = tuple[dict[str, Any], Any]
Handler = Callable[["RequestHandlers", Any, RequestContext], "Reply | Awaitable[Reply]"]
H = TypeVar("H", bound=Handler)
#: The one handler of each command, by request type (``handles``). ``quit`` has none: the
#: connection closes itself (connection.CONNECTION_COMMANDS).
HANDLERS: dict[type[c.Request], Handler] = {}


def handles(request_type: type[c.Request]) -> Callable[[H], H]:
    """Register the decorated method as the handler of ``request_type``'s requests."""

    def register(handler: H) -> H:
        if request_type in HANDLERS:
            raise TypeError(f"two handlers for {request_type.OP!r}")
        HANDLERS[request_type] = handler
        return handler

    return register


class ServedBroker(Protocol):
    """What the handlers use of the broker (metaq.server.broker.Broker); role questions go to ``ha``."""

    config: BrokerConfig
    store: MessageStoreManager
    stats: BrokerStats
    waiters: EndWaiters
    ha: HaNode
    registry: BrokerRegistry | None
    partitions: Partitions
    producer_ids: ProducerIdAllocator | None
    transactional_ids: TransactionalIds | None
    transactions: TransactionService
    authz: Authz

    def topic_config(self, topic: str) -> TopicConfig | None: ...

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> Awaitable[None] | None: ...

    def general_pairs(self) -> list[tuple[str, object]]: ...

    def offset_pairs(self, only_topic: str | None = None) -> list[tuple[str, object]]: ...

    def config_text(self) -> str: ...


class RequestHandlers:
    def __init__(self, broker: ServedBroker) -> None:
        self.broker = broker
        self.stats = broker.stats
        self._round_robin = itertools.count()

    def handle(self, req: c.Request, ctx: RequestContext) -> Reply | Awaitable[Reply]:
        """Serve ``req`` (authorized by its connection, metaq/server/authz.py) with its command's handler."""
        try:
            return HANDLERS[type(req)](self, req, ctx)
        except c.RequestError as exc:
            if exc.code == c.BAD_REQUEST:
                self.stats.bad_request()
            return exc.reply(req.opaque), b""

    def connection_closed(self, origin: Any) -> None:
        """A client connection closed (a slave replicating over it is gone)."""
        self.broker.ha.connection_closed(origin)

    def handle_text(self, req: c.Request) -> bytes:
        if req.op == "version":
            return f"metaq-py {__version__}\r\n".encode()
        return self.stats_body(req.item).encode()

    # --- lookups ------------------------------------------------------------------

    def _topic(self, topic: str) -> "TopicConfig":
        config = self.broker.topic_config(topic)
        if config is None:
            raise c.RequestError(c.NOT_FOUND, f"unknown topic {topic!r} on broker {self.broker.config.broker_id}")
        return config

    def _log(self, topic: str, partition: int) -> "PartitionLog":
        try:
            log = self.broker.store.get_log(topic, partition)
        except UnknownTopic as exc:
            raise c.RequestError(c.NOT_FOUND, str(exc)) from None
        except UnknownPartition as exc:
            raise c.RequestError(c.BAD_REQUEST, str(exc)) from None
        if isinstance(log, RefusedLog):  # its files are not the log this broker knew
            raise c.RequestError(c.INTERNAL_ERROR, log.reason)
        return log

    # --- put ----------------------------------------------------------------------

    @handles(m.PutRequest)
    def _put(self, req: c.Request, ctx: RequestContext) -> Reply | Awaitable[Reply]:
        broker = self.broker
        topic = self._topic(req.topic)
        if not topic.accept_publish:
            raise c.RequestError(c.FORBIDDEN, f"topic {req.topic!r} does not accept publishing on this broker")
        refusal = broker.ha.write_refusal()
        if refusal is not None:
            raise c.RequestError(refusal[0], refusal[1])
        partition = req.partition
        if partition == -1:
            partition = next(self._round_robin) % topic.num_partitions
        log = self._log(req.topic, partition)
        body = req.body
        if not body:
            raise c.RequestError(c.BAD_REQUEST, "put carries no messages")
        try:
            count = validate_batch(body, broker.config.max_message_size)
        except RecordError as exc:
            self.stats.partition(req.topic, partition).put_failed += 1
            raise c.RequestError(c.BAD_REQUEST, f"bad message batch: {exc}") from None
        if req.count is not None and req.count != count:
            raise c.RequestError(c.BAD_REQUEST, f"put announced {req.count} messages but carries {count}")
        if count > MAX_BATCH_COUNT:
            raise c.RequestError(c.BAD_REQUEST, f"a put carries at most {MAX_BATCH_COUNT} messages, got {count}")
        if req.txid is not None and req.producer_id is None:
            raise c.RequestError(c.BAD_REQUEST, "put: a transactional put (txid) needs producer_id, producer_epoch and sequence")
        if req.producer_id is not None:
            return self._put_idempotent(req, ctx, partition, log, body, count)
        # Control records are the broker's own: a producer that sends one would forge a
        # batch header or a transaction outcome in the replicated log.
        forged = find_forged_control(body)
        if forged is not None:
            raise c.RequestError(c.BAD_REQUEST, f"bad message batch: record {forged} uses the reserved control attribute")
        # No record of body is a control record (checked above): the partition's state takes
        # the batch as plain without a second search of it.
        owner = broker.partitions.serving(req.topic, partition, log)  # the log just looked up: no second lookup
        appended = self._append(req, partition, owner, body, count, count, no_control=True)
        return self._ack(req, partition, appended.offset, appended.end, appended.first_id, count, count)

    def _append(self, req: c.Request, partition: int, owner: Partition, data: bytearray, count: int, records: int,
                header: Control | None = None, no_control: bool = False) -> Appended:
        """A put's bytes through the partition's one leader append entry (``Partition.append_as_leader``:
        msg ids stamped, appended, pushed to streaming slaves, parked fetches woken); ``count``
        messages in ``records`` records; RequestError 500 if the store fails."""
        try:
            return owner.append_as_leader(data, records, header, no_control=no_control)
        except OSError as exc:
            self.stats.partition(req.topic, partition).put_failed += count
            if not isinstance(exc, SegmentVanished):  # that one the store has logged, once
                logger.error("append of %d messages to %s-%d failed: %s", count, req.topic, partition, exc)
            raise c.RequestError(c.INTERNAL_ERROR, f"append to {req.topic}-{partition} failed: {exc.strerror}") from None

    def _ack(self, req: c.Request, partition: int, offset: int, end: int, first_id: int, count: int,
             records: int) -> Reply | Awaitable[Reply]:
        """Account an appended put ([offset, end) holds its ``count`` messages; ``records`` with a
        BATCH header) and ack it once it is as durable as the flush and replication settings say."""
        broker = self.broker
        counters = self.stats.partition(req.topic, partition)
        counters.put_messages += count
        counters.put_bytes += end - offset
        reply = c.reply_header(
            req.opaque, c.OK, partition=partition, offset=offset, msg_id=first_id, count=count, end_offset=end,
            epoch=broker.ha.epoch,
        )
        return self._ack_durable(req, partition, end, records, reply)

    def _ack_durable(self, req: c.Request, partition: int, end: int, records: int,
                     reply: dict[str, Any]) -> Reply | Awaitable[Reply]:
        try:
            wait = self.broker.durability_wait(req.topic, partition, end, records)
        except SyncWaitFailed as exc:
            raise c.RequestError(exc.code, exc.message) from None
        if wait is None:
            return reply, b""
        if isinstance(wait, Deferred):
            # The sync wait alone: acked inside the slave's fetch that covers the put, no task.
            return wait.then(lambda done: (reply, b"") if done.exception() is None
                             else self._not_acked(done.exception(), req, partition))
        return self._ack_after(wait, req, partition, reply)

    def _put_idempotent(self, req: c.Request, ctx: RequestContext, partition: int, log: "PartitionLog",
                        body: bytearray, count: int) -> Reply | Awaitable[Reply]:
        """A put from an idempotent producer: appended once behind its BATCH header, or re-acked.

        Between ``plan_put`` and the append nothing yields to the event loop, so no other
        append can slip in: the verdict is taken on the state at the log end.
        """
        broker = self.broker
        if req.producer_epoch is None or req.sequence is None:
            raise c.RequestError(c.BAD_REQUEST, "put: producer_id needs producer_epoch and sequence too")
        # The BATCH record stores them as int64 and int16.
        if not 0 <= req.producer_id < 1 << 63 or not 0 <= req.producer_epoch < 1 << 15:
            raise c.RequestError(c.BAD_REQUEST, f"put: producer_id {req.producer_id} or producer_epoch "
                                                f"{req.producer_epoch} out of range (0..2^63-1, 0..32767)")
        broker.authz.check_producer(ctx, req.producer_id, req.producer_epoch, req.producer_token)
        owner = broker.partitions.serving(req.topic, partition, log)
        # One verdict: the partition's producer table and the newest epoch of the producer's
        # transactional id on this master (its fence) decide together whether this is a zombie.
        fence = broker.transactions.fence_of(req.producer_id)
        try:
            plan = plan_put(owner.state.producers, body, count, producer_id=req.producer_id, producer_epoch=req.producer_epoch,
                            first_seq=req.sequence, timestamp_ms=int(time.time() * 1000), txid=req.txid or "",
                            fence_epoch=fence.epoch if fence is not None else 0)
        except (PutRefused, ValueError) as exc:
            raise c.RequestError(c.BAD_REQUEST, f"bad message batch: {exc}") from None
        decision = plan.decision
        if decision.verdict is Verdict.DUPLICATE:
            return self._ack_duplicate(req, partition, log, decision, count)
        if decision.verdict is Verdict.OUT_OF_ORDER:
            message = (f"out of order: producer {req.producer_id} sent sequence {req.sequence} to "
                       f"{req.topic}-{partition}, expected {decision.expected_seq}")
            return c.reply_header(req.opaque, c.BAD_REQUEST, message, expected_seq=decision.expected_seq), b""
        if decision.verdict is Verdict.FENCED:
            assert decision.current_epoch is not None
            newest = Fence(decision.current_epoch, fence.name if fence is not None else None)
            message = fenced_message(req.producer_id, req.producer_epoch, newest)
            return c.reply_header(req.opaque, c.FORBIDDEN, message, current_epoch=decision.current_epoch), b""
        if req.txid:
            # The branch must be ACTIVE on this master and this put its own (RequestError if not); a
            # DUPLICATE above needs no check: it appends nothing.
            broker.transactions.enlist(req.txid, req.topic, partition, req.producer_id, ctx.principal)
        framed = plan.append
        assert framed is not None
        # The BATCH header is a record and takes a msg id too.
        appended = self._append(req, partition, owner, framed, count, count + 1, plan.header)
        return self._ack(req, partition, appended.offset + plan.data_start, appended.end, appended.first_id + 1, count,
                         count + 1)

    def _ack_duplicate(self, req: c.Request, partition: int, log: "PartitionLog", decision: Decision,
                       count: int) -> Reply | Awaitable[Reply]:
        """A retry of a batch already in the log: its original offsets, once it is as durable as its first ack."""
        self.stats.partition(req.topic, partition).put_duplicates += 1
        first, end = decision.first_offset, decision.end_offset
        epoch = self.broker.ha.epoch
        if first is None or end is None:  # older than the producer's cached batches: acked long ago
            return c.reply_header(req.opaque, c.OK, partition=partition, offset=-1, msg_id=-1, count=count,
                                  end_offset=-1, epoch=epoch, duplicate=True), b""
        _length, _crc, msg_id, _flag = HEADER.unpack(log.read(first, HEADER_SIZE))
        reply = c.reply_header(req.opaque, c.OK, partition=partition, offset=first, msg_id=msg_id, count=count,
                               end_offset=end, epoch=epoch, duplicate=True)
        return self._ack_durable(req, partition, end, 0, reply)

    async def _ack_after(self, wait: Awaitable[None], req: c.Request, partition: int, reply: dict[str, Any]) -> Reply:
        """Acks follow durability: the flush policy's wait, then (sync mode) the replication wait."""
        try:
            await wait
        except (SyncWaitFailed, OSError) as exc:
            return self._not_acked(exc, req, partition)
        return reply, b""

    @staticmethod
    def _not_acked(exc: BaseException, req: c.Request, partition: int) -> Reply:
        """Why a put's wait ended without its ack (anything but these two is a bug: re-raised)."""
        if isinstance(exc, SyncWaitFailed):
            return c.reply_header(req.opaque, exc.code, exc.message, partition=partition), b""
        if isinstance(exc, OSError):
            logger.error("flush of %s-%d failed, put not acked: %s", req.topic, partition, exc)
            return c.reply_header(req.opaque, c.INTERNAL_ERROR, f"flush of {req.topic}-{partition} failed: {exc}"), b""
        raise exc

    # --- init_producer --------------------------------------------------------------

    @handles(m.InitProducerRequest)
    def _init_producer(self, req: c.Request, ctx: RequestContext) -> Reply | Awaitable[Reply]:
        allocator, names = self.broker.producer_ids, self.broker.transactional_ids
        if allocator is None or names is None:
            raise c.RequestError(c.SERVICE_UNAVAILABLE, "this broker is still starting: no producer ids yet")
        if req.transactional_id is None:
            return self._allocate_producer_id(req, ctx, allocator)
        try:
            name = check_transactional_id(req.transactional_id)
        except ValueError as exc:
            raise c.RequestError(c.BAD_REQUEST, f"init_producer: {exc}") from None
        # Only the master that serves the name's transactions may fence them (a slave: 403, retry there).
        refusal = self.broker.transactions.refusal()
        if refusal is not None:
            raise c.RequestError(*refusal)
        user, admin = self.broker.authz.transactional_owner(ctx.principal)  # user None: security off
        return self._init_transactional(req, ctx, names, name, user, admin)

    async def _init_transactional(self, req: c.Request, ctx: RequestContext, names: TransactionalIds, name: str,
                                  user: str | None, admin: bool) -> Reply:
        try:
            owner, previous = await names.init(name, user, admin=admin)
        except (NotOwner, TooManyNames) as exc:
            return c.reply_header(req.opaque, c.FORBIDDEN, f"init_producer: {exc}"), b""
        except Exception as exc:  # ZooKeeper unreachable, a full disk: the producer asks again
            logger.warning("init of transactional id %s failed: %s", name, exc)
            return c.reply_header(req.opaque, c.SERVICE_UNAVAILABLE, f"cannot init transactional id {name}: {exc}"), b""
        await self.broker.transactions.fence(name, owner, previous)  # RequestError: the producer asks again
        return c.reply_header(req.opaque, c.OK, producer_id=owner.producer_id, epoch=owner.epoch,
                              **self.broker.authz.issued_token(ctx, owner.producer_id, owner.epoch)), b""

    async def _allocate_producer_id(self, req: c.Request, ctx: RequestContext, allocator: ProducerIdAllocator) -> Reply:
        try:
            producer_id = await allocator.allocate()
        except Exception as exc:  # ZooKeeper unreachable, a full disk: the producer asks again
            logger.warning("producer id allocation failed: %s", exc)
            return c.reply_header(req.opaque, c.SERVICE_UNAVAILABLE, f"cannot allocate a producer id: {exc}"), b""
        return c.reply_header(req.opaque, c.OK, producer_id=producer_id, epoch=0,
                              **self.broker.authz.issued_token(ctx, producer_id, 0)), b""

    # --- get ----------------------------------------------------------------------

    @handles(m.GetRequest)
    def _get(self, req: c.Request, ctx: RequestContext) -> Reply | Awaitable[Reply]:
        topic = self._topic(req.topic)
        replica = req.replica
        if not topic.accept_subscribe and replica is None:
            raise c.RequestError(c.FORBIDDEN, f"topic {req.topic!r} does not accept subscribing on this broker")
        if req.max_size <= 0:
            raise c.RequestError(c.BAD_REQUEST, f"get: max_size must be positive, got {req.max_size}")
        log = self._log(req.topic, req.partition)
        cap = topic.max_transfer_size if replica is None else max(topic.max_transfer_size, MAX_REPLICA_TRANSFER)
        max_bytes = min(req.max_size, cap)
        if replica is not None:
            self._replica_progress(req, req.offset, log, topic, ctx)
        # A replica reads to the log end: at or past it ``_read`` finds nothing (as in
        # ParkedFetch.read), so a slave's fetch at our end, the next fetch after every
        # reply, parks without building the committed offset it would not send.
        at_end = replica is not None and req.offset >= log.log_end
        reply = None if at_end else self._read(req, log, max_bytes)
        if reply is not None or req.max_wait_ms <= 0:
            return reply if reply is not None else self._no_data(req, log)
        # Parked until its partition has data for it, or ``max_wait_ms`` passes.
        return ParkedFetch(self, req, log, max_bytes).parked

    @handles(m.PositionRequest)
    def _position(self, req: c.Request, ctx: RequestContext) -> Reply:
        """A slave's log end, reported between fetches (see replica.py: pieces of a large reply)."""
        topic = self._topic(req.topic)
        log = self._log(req.topic, req.partition)
        replica = req.replica
        log_end = replica.get("log_end")
        if not isinstance(log_end, int) or log_end < 0:
            raise c.RequestError(c.BAD_REQUEST, "position: replica needs a non-negative integer 'log_end'")
        self._replica_progress(req, log_end, log, topic, ctx, report=True)
        self.stats.partition(req.topic, req.partition).replica_positions += 1
        header = c.reply_header(
            req.opaque,
            c.OK,
            committed=self.broker.ha.committed(req.topic, req.partition, log),
            log_end=log.log_end,
            epoch=self.broker.ha.epoch,
        )
        return header, b""

    @handles(m.StreamRequest)
    def _stream(self, req: c.Request, ctx: RequestContext) -> Reply:
        """A caught-up slave subscribes to a partition's stream (metaq/ha/stream.py): checked as
        its fetch would be, and accepted only at our log end with ``replicationStream=true``."""
        if not self.broker.config.replication_stream:
            raise c.RequestError(c.SERVICE_UNAVAILABLE, "replicationStream is off on this master: fetch")
        topic = self._topic(req.topic)
        log = self._log(req.topic, req.partition)
        replica = req.replica
        log_end = replica.get("log_end")
        if not isinstance(log_end, int) or isinstance(log_end, bool) or log_end < 0:
            raise c.RequestError(c.BAD_REQUEST, "stream: replica needs a non-negative integer 'log_end'")
        self._replica_progress(req, log_end, log, topic, ctx, report=True)
        if log_end != log.log_end:
            raise c.RequestError(c.SERVICE_UNAVAILABLE, f"stream: not caught up ({log_end} of {log.log_end}): fetch")
        ha = self.broker.ha
        if not ha.streams.subscribe(req.origin, replica["slave_id"], (req.topic, req.partition), req.opaque, ha.epoch, log_end):
            raise c.RequestError(c.NOT_FOUND, f"stream: {req.topic}-{req.partition} is no longer served")
        return c.reply_header(req.opaque, c.OK, epoch=ha.epoch,
                              committed=ha.committed(req.topic, req.partition, log)), b""

    @handles(m.StreamAckRequest)
    def _stream_ack(self, req: c.Request, ctx: RequestContext) -> None:
        """A slave's position report on its stream: recorded as a fetch's would be, or refused
        and logged (another connection's stream, another epoch, past what was sent or our log end).
        Never answered: the slave's next report, or the stream's close, says everything."""
        ha = self.broker.ha
        try:
            stream_id, epoch, end = decode_report(req.body)
        except ValueError as exc:
            ha.streams.reports_refused += 1
            logger.warning("refused a stream report from %s: %s", ctx.peer, exc)
            return None
        proved = ha.streams.report(req.origin, stream_id, epoch, end)
        if proved is None:
            return None
        slave_id, (topic, partition), position = proved
        log = self.broker.store.open_log(topic, partition)
        if log is None or isinstance(log, RefusedLog) or position > log.log_end or epoch != ha.epoch:
            ha.streams.close_partition((topic, partition), "the log changed under the stream")
            return None
        ha.replica_fetched(slave_id, epoch, topic, partition, position, req.origin)
        return None

    @handles(m.NewsRequest)
    def _news(self, req: c.Request, ctx: RequestContext) -> Reply | Deferred[Reply]:
        """A slave's one long-poll for its quiet partitions (metaq/ha/news.py): registers the
        ones its body names and answers with those that have news, now or once one has."""
        replica = req.replica
        slave_id = self._replica_slave_id(replica, ctx)
        self._check_replica_epoch(replica)
        try:
            entries = msgpack.unpackb(req.body) if req.body else []
        except (ValueError, msgpack.UnpackException) as exc:
            raise c.RequestError(c.BAD_REQUEST, f"news: the body is not msgpack: {exc}") from None
        if not isinstance(entries, list):
            raise c.RequestError(c.BAD_REQUEST, "news: the body must be a list of [topic, partition, log_end, committed, incarnation]")
        ha = self.broker.ha
        session = ha.news_session(req.origin, slave_id, self._news_reply)
        for entry in entries:
            session.register(*self._quiet_partition(entry))
        return session.poll(req.opaque, req.max_wait_ms / 1000)

    def _quiet_partition(self, entry: Any) -> tuple[tuple[str, int], bool]:
        """One ``[topic, partition, log_end, committed, incarnation]`` of a news request: its key,
        and whether it has news already (a log that moved or is not the one the slave holds)."""
        if (not isinstance(entry, list) or len(entry) != 5 or not isinstance(entry[0], str)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry[1:4])
                or not isinstance(entry[4], str)):
            raise c.RequestError(c.BAD_REQUEST, f"news: bad entry {entry!r}: want [topic, partition, log_end, committed, incarnation]")
        topic_name, partition, log_end, committed, incarnation = entry
        key = (topic_name, partition)
        topic = self.broker.topic_config(topic_name)
        log = self.broker.store.open_log(topic_name, partition) if topic is not None else None
        if log is None or isinstance(log, RefusedLog) or not same_life(incarnation, topic.incarnation):
            return key, True  # its fetch hears what is wrong (404, another life, a refused log)
        moved = log.log_end != log_end or self.broker.ha.committed(topic_name, partition, log) > committed
        return key, moved

    def _news_reply(self, opaque: int, keys: list[tuple[str, int]]) -> Reply:
        return c.reply_header(opaque, c.OK, epoch=self.broker.ha.epoch), msgpack.packb([list(key) for key in keys])

    def _replica_progress(self, req: c.Request, log_end: int, log: "PartitionLog", topic: "TopicConfig",
                          ctx: RequestContext, report: bool = False) -> None:
        """A slave's fetch or position report: check who sends it, fence by epoch, record where it is
        (``log`` and ``topic``: the request's, as the handler looked them up).

        Invariant: a recorded position is never past our log end. A slave's log is a prefix
        of ours; one that claims more holds bytes we never wrote (a divergent tail, or another
        log's end). Recorded, it would count once our log grew past it and release sync acks
        for messages the slave never had; the fetch's answer (our log end) lets the slave
        find its divergence instead."""
        replica = req.replica
        slave_id = self._replica_slave_id(replica, ctx)
        self._check_replica_epoch(replica)
        # A slave replicates only the life of the topic it serves: bytes of a deleted topic
        # must never fill a re-created one's log, nor a position in one count for the other.
        if not same_life(replica.get("incarnation", ""), topic.incarnation):
            raise c.RequestError(c.NOT_FOUND, f"topic {req.topic!r}: this master serves another incarnation of it"
                                              " (deleted and re-created); retry once both apply the change")
        if log_end > log.log_end:
            if report:
                # A ``position`` is of bytes the slave appended from us: one past our log end
                # is no copy of our log, refused and logged (a fetch there is answered instead:
                # its reply's log end is how the slave finds its divergence).
                logger.warning("refused a position report of slave%d from %s for %s-%d: log end %d is past ours (%d)",
                               slave_id, ctx.peer, req.topic, req.partition, log_end, log.log_end)
                raise c.RequestError(c.BAD_REQUEST,
                                     f"position: log end {log_end} is past the master's log end {log.log_end}")
            logger.debug("slave%d reports %s-%d at %d, past our log end %d: not recorded",
                         slave_id, req.topic, req.partition, log_end, log.log_end)
            return
        self.broker.ha.replica_fetched(slave_id, replica["epoch"], req.topic, req.partition, log_end, req.origin)

    def _replica_slave_id(self, replica: dict[str, Any], ctx: RequestContext) -> int:
        """The slave id of a fetch, position report or news request, checked (see below)."""
        slave_id = replica.get("slave_id")
        if not isinstance(slave_id, int) or isinstance(slave_id, bool) or slave_id < 0:
            raise c.RequestError(c.BAD_REQUEST, "replica needs a non-negative integer 'slave_id'")
        self._check_registered_slave(slave_id, ctx)
        return slave_id

    def _check_registered_slave(self, slave_id: int, ctx: RequestContext) -> None:
        """Replication progress and reads past the committed offset only for a slave ZooKeeper names,
        and (security on) only from the connection that logged in as that slave.

        With security on the connection has already proved it is a broker of this group
        (connection.py), under the name ``broker:{brokerId}:slave{k}``: a request for any other
        slave id is refused and logged, so one slave cannot report (or hold up the sync set)
        for another. This holds with security off too: a phantom slave id (one that is not
        registered as ``slave{k}`` of this group) is refused, so it never joins the sync set
        and never reads bytes that a failover may take back.
        """
        broker_id = self.broker.config.broker_id
        principal = ctx.principal
        if principal is not None and principal.name != f"{BROKER_PREFIX}{broker_id}:slave{slave_id}":
            logger.warning("refused replication for slave%d from %s (%s): not that slave's login", slave_id, principal, ctx.peer)
            raise c.RequestError(c.FORBIDDEN, f"{principal} may not replicate as slave{slave_id}")
        registry = self.broker.registry
        if registry is None or slave_id not in registry.slave_ids:
            raise c.RequestError(c.FORBIDDEN, f"slave{slave_id} is not registered in ZooKeeper for broker {broker_id}")

    def _check_replica_epoch(self, replica: dict[str, Any]) -> None:
        """Replication only between a master and slaves of the same epoch (fencing)."""
        ha = self.broker.ha
        self._check_acting_master()
        epoch = replica.get("epoch")
        if not isinstance(epoch, int):
            raise c.RequestError(c.BAD_REQUEST, "replica fetch needs an integer 'epoch'")
        serving = ha.epoch
        if epoch > serving:
            ha.saw_higher_epoch(epoch)  # checked against ZooKeeper: a claim alone never fences
            raise c.RequestError(c.FORBIDDEN, f"stale master: epoch {serving} < the slave's epoch {epoch}")
        if epoch < serving:
            raise c.RequestError(c.FORBIDDEN, f"stale epoch {epoch}: the master is in epoch {serving}; re-sync")

    def _check_acting_master(self) -> None:
        """Only the acting master serves replication and ``epoch_end``: anyone else refuses with
        ``reason: "not_master"``, its ``role`` and ``serving_epoch`` (ha/answerer.py), so a slave
        acts on fields (it asks ZooKeeper who leads), never on the words."""
        ha = self.broker.ha
        if not ha.acting_master:
            raise NotMasterRefusal(self.broker.config.broker_id, ha.role_name, ha.epoch)

    def _answerer(self) -> dict[str, Any]:
        """Who answers a question about the log (``epoch_end``, ``epochs``): a rejoining broker
        uses the answer only from the acting master of the epoch it read from ZooKeeper."""
        ha = self.broker.ha
        return answerer_fields(ha.role_name, ha.epoch)

    def _visible_end(self, req: c.Request, log_end: int, committed: int) -> int:
        """A replica reads to the log end; a consumer to the last stable offset below ``committed``."""
        if req.replica is not None:
            return log_end
        return stable_end(self.broker.partitions, req.topic, req.partition, committed)

    def _consumer_end(self, topic: str, partition: int, log: "PartitionLog") -> int:
        """The last stable offset: committed, and before the first open transaction."""
        return stable_end(self.broker.partitions, topic, partition, self.broker.ha.committed(topic, partition, log))

    def _read(self, req: c.Request, log: "PartitionLog", max_bytes: int) -> Reply | None:
        """The reply for data at ``req.offset``, or None when there is none yet."""
        committed = self.broker.ha.committed(req.topic, req.partition, log)
        log_end = log.log_end
        upto = self._visible_end(req, log_end, committed)
        offset = req.offset
        if offset < log.min_offset:
            return c.reply_header(req.opaque, c.MOVED, f"offset {offset} is before the log start", offset=log.min_offset), b""
        if offset >= upto:
            return None
        try:
            segment, position, length = log.file_range(offset, max_bytes, upto)
        except OffsetOutOfRange as exc:
            raise c.RequestError(c.MOVED, str(exc)) from None
        except CorruptRange as exc:  # never garbage: the reader is told which bytes and why
            raise c.RequestError(c.INTERNAL_ERROR, exc.strerror, reason="corrupt") from None
        if length == 0:
            return None
        counters = self.stats.partition(req.topic, req.partition)
        if req.replica is not None:
            counters.replica_get_requests += 1
            counters.replica_get_bytes += length
        else:
            counters.get_requests += 1
            counters.get_bytes += length
        header = c.reply_header(
            req.opaque,
            c.OK,
            offset=offset,
            committed=committed,
            log_end=log_end,
            epoch=self.broker.ha.epoch,
        )
        if req.replica is None:
            # Only partitions with transactions carry these: plain topics' replies stay byte-identical.
            if upto < committed:
                header["lso"] = upto
            aborted = aborted_spans(self.broker.partitions, req.topic, req.partition, offset, offset + length)
            if aborted:
                header["aborted"] = aborted
        if length < SENDFILE_MIN_BYTES:
            # What the connection would do with a small FileBody (copy it and write it with the
            # reply), done here: no closure and no FileBody per reply (a slave's fetch per put).
            return header, segment.read(offset, length)
        return header, FileBody(segment.fileno(), position, length, lambda: segment.read(offset, length))

    def _no_data(self, req: c.Request, log: "PartitionLog") -> Reply:
        committed = self.broker.ha.committed(req.topic, req.partition, log)
        upto = self._visible_end(req, log.log_end, committed)
        if req.replica is None:
            self.stats.partition(req.topic, req.partition).get_miss += 1
        if req.offset > log.log_end:
            message = f"offset {req.offset} is beyond the log end {log.log_end}"
        elif req.offset > upto:
            message = f"offset {req.offset} is beyond the committed offset {upto}"
        else:
            message = "no new messages"
        return (
            c.reply_header(req.opaque, c.NOT_FOUND, message, committed=committed, log_end=log.log_end, epoch=self.broker.ha.epoch),
            b"",
        )

    # --- transactions -----------------------------------------------------------------

    @handles(m.TransactionRequest)
    def _transaction(self, req: c.Request, ctx: RequestContext) -> Awaitable[Reply]:
        """A local or XA transaction step (metaq/server/transactions.py)."""
        return self.broker.transactions.serve(req, ctx)  # type: ignore[arg-type]

    # --- offset, topics, config, version, stats -------------------------------------

    @handles(m.OffsetRequest)
    def _offset(self, req: c.Request, _ctx: RequestContext) -> Reply | Awaitable[Reply]:
        self._topic(req.topic)
        store = self.broker.store
        if store.open_log(req.topic, req.partition) is None and not store.has_log(req.topic, req.partition):
            # A partition nobody wrote yet: an empty slave asks for each of a new topic's (up to
            # 256 at once). Its log is laid out with the others asked for meanwhile, in one batch
            # off the event loop (``create_log``), not one at a time on it with an fsync each.
            return self._offset_after_creating(req)
        return self._offset_reply(req)

    async def _offset_after_creating(self, req: c.Request) -> Reply:
        with contextlib.suppress(UnknownTopic, UnknownPartition):  # ``_log`` answers them, as for any request
            await self.broker.store.create_log(req.topic, req.partition)
        reply = self._offset_reply(req)
        return await reply if asyncio.iscoroutine(reply) else reply

    def _offset_reply(self, req: c.Request) -> Reply | Awaitable[Reply]:
        log = self._log(req.topic, req.partition)
        readable = self._consumer_end(req.topic, req.partition, log)
        if req.realign:
            return self._realigned(req, log, readable)
        nearest = min(log.nearest_offset(req.offset), readable) if req.offset >= log.min_offset else log.min_offset
        return (
            c.reply_header(req.opaque, c.OK, offset=nearest, min_offset=log.min_offset, max_offset=readable),
            b"",
        )

    async def _realigned(self, req: c.Request, log: "PartitionLog", readable: int) -> Reply:
        """``offset`` with ``realign``: where a consumer whose position no longer starts a record
        resumes (``realign_position``). It walks the log between two time-index entries: off the
        event loop, with a copy of the epoch history taken on it."""
        entries = list(self.broker.ha.epoch_entries(req.topic, req.partition))
        offset, how, epoch = await asyncio.to_thread(realign_position, log, req.offset, entries)
        fields: dict[str, Any] = {"epoch": epoch} if epoch is not None else {}
        return (
            c.reply_header(req.opaque, c.OK, offset=offset, realign=how, min_offset=log.min_offset,
                           max_offset=readable, **fields),
            b"",
        )

    @handles(m.OffsetForTimeRequest)
    def _offset_for_time(self, req: c.Request, _ctx: RequestContext) -> Awaitable[Reply]:
        """The first readable offset whose record time is >= ``time_ms``, from the time index
        (docs/storage.md, "Time index"); a master and its slaves answer it alike. It reads an
        index file and one index interval of the log: off the event loop."""
        self._topic(req.topic)
        log = self._log(req.topic, req.partition)
        return self._offset_for_time_lookup(req, log, self._consumer_end(req.topic, req.partition, log))

    async def _offset_for_time_lookup(self, req: c.Request, log: "PartitionLog", readable: int) -> Reply:
        found = await asyncio.to_thread(log.offset_for_time, req.time_ms, readable)
        min_offset = log.min_offset
        offset = readable if found is None else max(found, min_offset)
        return (
            c.reply_header(req.opaque, c.OK, offset=offset, latest=found is None, min_offset=min_offset,
                           max_offset=readable),
            b"",
        )

    @handles(m.TopicsRequest)
    def _topics(self, req: c.Request, _ctx: RequestContext) -> Reply:
        broker = self.broker
        topics = {name: cfg.num_partitions for name, cfg in broker.config.topics.items()}
        # Slaves start a partition only once we serve the incarnation they serve (follower.py).
        incarnations = broker.topic_incarnations()
        return (
            c.reply_header(
                req.opaque, c.OK, topics=topics, broker_id=broker.config.broker_id, role=broker.ha.role_name,
                epoch=broker.ha.epoch, replication_mode=broker.config.replication_mode, incarnations=incarnations,
                replication_stream=broker.config.replication_stream,
            ),
            b"",
        )

    @handles(m.ChecksumRequest)
    def _checksum(self, req: c.Request, _ctx: RequestContext) -> Reply | Awaitable[Reply]:
        """CRC32 of a byte range of the log, for ``metaq verify`` (computed off the event loop)."""
        self._topic(req.topic)
        log = self._log(req.topic, req.partition)
        start, end = req.start, min(req.end, log.log_end)
        if start < log.min_offset or start > end:
            raise c.RequestError(
                c.BAD_REQUEST, f"checksum: range [{start}, {req.end}) is outside the log [{log.min_offset}, {log.log_end})"
            )
        if end - start > MAX_CHECKSUM_RANGE:
            raise c.RequestError(c.BAD_REQUEST, f"checksum: at most {MAX_CHECKSUM_RANGE} bytes per request")
        return self._checksum_range(req, log, start, end)

    async def _checksum_range(self, req: c.Request, log: "PartitionLog", start: int, end: int) -> Reply:
        try:
            crc = await asyncio.to_thread(log.crc32, start, end)
        except CorruptRange as exc:  # named, so a rejoining slave compares around it (ha/truncation.py)
            return c.reply_header(req.opaque, c.INTERNAL_ERROR, exc.strerror, reason="corrupt",
                                  corrupt_start=exc.start, corrupt_end=exc.end), b""
        return c.reply_header(req.opaque, c.OK, start=start, end=end, crc=crc), b""

    @handles(m.EpochEndRequest)
    def _epoch_end(self, req: c.Request, _ctx: RequestContext) -> Reply:
        """Where epoch ``req.epoch`` ends in this log: a rejoining broker truncates there, so only
        the acting master answers (a slave's or a deposed master's log is another log's history)."""
        self._check_acting_master()
        self._topic(req.topic)
        self._log(req.topic, req.partition)
        found = self.broker.ha.epoch_end(req.topic, req.partition, req.epoch)
        if found is None:
            raise c.RequestError(c.NOT_FOUND, "this broker keeps no epochs (not in ZooKeeper)")
        epoch, end = found
        return c.reply_header(req.opaque, c.OK, epoch=epoch, end_offset=end, **self._answerer()), b""

    @handles(m.EpochsRequest)
    def _epochs(self, req: c.Request, _ctx: RequestContext) -> Reply:
        """This broker's epoch history of a partition, from any member (tools read slaves' too);
        the reply says who answers, and a slave copies it only from the acting master."""
        self._topic(req.topic)
        self._log(req.topic, req.partition)
        entries = self.broker.ha.epoch_entries(req.topic, req.partition)
        return c.reply_header(req.opaque, c.OK, entries=[list(e) for e in entries], **self._answerer()), b""

    @handles(m.ConfigRequest)
    def _config(self, req: c.Request, _ctx: RequestContext) -> Reply:
        config = self.broker.config
        return c.reply_header(req.opaque, c.OK, checksum=config.checksum), config.raw

    @handles(m.VersionRequest)
    def _version(self, req: c.Request, _ctx: RequestContext) -> Reply:
        return c.reply_header(req.opaque, c.OK, version=f"metaq-py {__version__}"), f"metaq-py {__version__}".encode()

    @handles(m.StatsRequest)
    def _stats(self, req: c.Request, _ctx: RequestContext) -> Reply:
        item = req.item
        if item == "reset":
            self.stats.reset()
        if req.format == "map":
            if item == "config":
                raise c.RequestError(c.BAD_REQUEST, "stats config is server.ini text: ask without format 'map'")
            pairs = self.stats_pairs(item)
            return c.reply_header(req.opaque, c.OK, format="map"), stats_text.encode_map(pairs)
        return c.reply_header(req.opaque, c.OK), self.stats_body(item).encode()

    def stats_body(self, item: str) -> str:
        """The text form (``nc``, ``metaq stats``); an unknown item is an ``ERROR`` line, as in MetaQ."""
        if item == "config":
            return self.broker.config_text()
        try:
            return stats_text.render(self.stats_pairs(item))
        except c.RequestError as exc:
            return f"ERROR {exc.message}\r\n"

    def stats_pairs(self, item: str) -> stats_text.StatsPairs:
        """The stats of one item as data (RequestError 400 for an unknown item)."""
        broker = self.broker
        if item == "help":
            return list(stats_text.ITEM_HELP.items())
        if item == "topics":
            return [(topic, stats_text.counters_row(t)) for topic, t in sorted(self.stats.topic_totals().items())]
        if item == "offsets":
            return broker.offset_pairs()
        if item in broker.config.topics:
            return broker.offset_pairs(item)
        if item and item not in ("realtime", "reset"):
            raise c.RequestError(c.BAD_REQUEST, f"unknown stats item {item!r} (try: stats help)")
        return broker.general_pairs()


class ParkedFetch:
    """A fetch waiting for its partition to have data for it, or for ``max_wait_ms`` to pass.

    Woken by ``EndWaiters.notify`` inside the append, commit or flush that moved the
    partition, and answered right there (no task, no turn of the loop: a slave gets a
    put's bytes within the handling of the read that carried the put; an append's
    notify is held until that read's replies are written, see waiters.py).

    A sync master parks one replica fetch per put. This is an object that lets go of its
    timer and its watch once answered, rather than closures over each other: those formed
    a reference cycle per fetch (~35 objects: the Deferred, its release, the watch, the
    timer), which only the cyclic garbage collector freed, a collection every ~20 puts and
    now and then a full one of tens of ms in the middle of a put
    (tests/unit/test_server_handlers.py checks that an answered fetch leaves no cycle).
    """

    __slots__ = ("handlers", "req", "log", "max_bytes", "parked", "timer", "withdraw")

    def __init__(self, handlers: RequestHandlers, req: c.Request, log: "PartitionLog", max_bytes: int) -> None:
        self.handlers = handlers
        self.req = req
        self.log = log
        self.max_bytes = max_bytes
        self.parked: Deferred[Reply] = Deferred()
        self.timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(req.max_wait_ms / 1000, self.expired)
        # A slave's fetch reads to the log end: a commit or flush alone has nothing for it.
        self.withdraw: Callable[[], None] | None = handlers.broker.waiters.watch(
            req.topic, req.partition, self.woken, on_commit=req.replica is None)
        self.parked.on_cancel(self.release)

    def woken(self) -> None:
        self.answer(self.read)

    def read(self) -> Reply | None:
        handlers, req = self.handlers, self.req
        if handlers.broker.store.open_log(req.topic, req.partition) is not self.log:
            self.log = handlers._log(req.topic, req.partition)  # dropped while parked (topic deleted): 404
        elif req.replica is not None and self.log.log_end <= req.offset:
            return None  # a commit, not an append: nothing new for a slave
        return handlers._read(req, self.log, self.max_bytes)

    def expired(self) -> None:
        if self.withdraw is not None:
            self.withdraw()
        self.answer(self.no_data)

    def no_data(self) -> Reply:
        return self.handlers._no_data(self.req, self.log)

    def answer(self, reply: Callable[[], Reply | None]) -> None:
        try:
            result = reply()
        except c.RequestError as exc:
            result = exc.reply(self.req.opaque), b""
        except Exception as exc:  # noqa: BLE001 - answered as the connection answers handler bugs
            self.let_go()
            self.parked.set_exception(exc)
            return
        if result is None:
            req = self.req
            self.withdraw = self.handlers.broker.waiters.watch(req.topic, req.partition, self.woken,
                                                               on_commit=req.replica is None)
            return
        self.let_go()
        self.parked.set_result(result)

    def release(self) -> None:
        """The fetch's connection closed while it waited."""
        withdraw = self.withdraw
        self.let_go()
        if withdraw is not None:
            withdraw()

    def let_go(self) -> None:
        """Cancel the timer and drop it and the watch: nothing refers back to this fetch any more."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.withdraw = None


def realign_position(log: "PartitionLog", offset: int, epochs: list[tuple[int, int]]) -> tuple[int, str, int | None]:
    """``(offset, how, epoch)``: where a consumer resumes whose position ``offset`` may no longer
    start a record of ``log`` (the ``offset`` request's ``realign``, docs/protocol.md). ``how``:

    * ``record_start``: a record starts at ``offset`` (or it is the log end): resume there;
    * ``log_start``: ``offset`` is before the log start;
    * ``epoch_start``: the start of ``epoch``, the last one in ``epochs`` (the partition's
      history) that starts at or before ``min(offset, log end)``. A position inside a record, or
      past the end, of a partition with a history came from a log that diverged (an async
      failover took its tail back, docs/guarantees.md A3): that epoch's start is where the new
      master's writes began, so resuming there skips none of them;
    * ``next_record``: without a history (no failover: a wrong offset), the first record
      start after ``offset``; ``log_end``: past the end.

    Reads up to one time-index interval of the log (``record_start_at_or_after``): a worker thread's.
    """
    if offset < log.min_offset:
        return log.min_offset, "log_start", None
    log_end = log.log_end
    found = log.record_start_at_or_after(offset) if offset <= log_end else log_end
    if found == offset:
        return offset, "record_start", None
    until = min(offset, log_end)
    began = [(epoch, start) for epoch, start in epochs if start <= until]
    if began:
        epoch, start = began[-1]
        return max(start, log.min_offset), "epoch_start", epoch
    return found, "next_record" if offset < log_end else "log_end", None
