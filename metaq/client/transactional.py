"""MetaQ's TransactionalProducer: begin_transaction, send_message, commit, rollback.

A transaction's messages go to partitions of **one broker group** (the group of the
first partition it sends to: its coordinator is that group's master) and become
visible to consumers all at once when ``commit`` returns, never after ``rollback``, a
timeout or a failover that caught the transaction unprepared (the broker rolls it
back; ``commit`` then raises ``TransactionRolledBack``).

How it talks to the broker (docs/transactions.md, docs/protocol.md ``transaction``):

* the producer asks any broker for a producer id once (``init_producer``); every put
  of a transaction carries that id, its epoch, a sequence number per partition and
  the transaction id ``TX:{producerId}.{epoch}:{n}``, so a put retried through a failover is
  appended once;
* the branch is started on the group's master before the first put (``start``),
  ended and committed in one phase (``end``, ``commit_one_phase``) or rolled back;
* every request goes to the group's current master and is retried, with back-off,
  through a failover (no connection, 403 from a slave, 503 while the new master
  recovers transactions, 504 or a lost reply): until ``send_timeout_s``
  (``retry.RetryPolicy``, the producers' one policy, with no bound on attempts). A
  retried step is safe: a put is deduplicated, and a commit or rollback retried on a
  decided branch answers its outcome.

The producer id, epoch and token are a ``ProducerIdentity`` and the puts' numbers a
``Sequencer`` (idempotence.py), the same as the idempotent producer's: this sender only
says where to ask (the group's master) and how to retry.

With a ``transactional_id`` (Kafka's ``transactional.id``), the producer id belongs to
that name: every new instance's ``init_producer`` gets the same id with the epoch
raised by one, and the broker rolls back the older instance's open, unprepared
transaction before it answers. The name's transactions run on the broker group that
holds the name (the one given, else the first group of the first topic sent to), so
every instance must use the same topic first or the same ``broker_id``. The older
instance's next put or step is refused with ``ProducerFenced``; it stops for good.

``metaq/client/xa.py`` builds the XA resource on the same sender.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..addresses import parse_broker_url
from ..errors import MetaqError
from ..protocol import commands as c
from ..protocol.messages import InitProducerRequest, PutRequest, TransactionRequest
from ..txn.xa import Code
from .cluster import Cluster
from .codec import encode_messages
from .config import MetaClientConfig
from .connection import ConnectionClosed, Reply
from .errors import access_denied
from .idempotence import ProducerIdentity, Sequencer
from .message import Message, Partition, SendResult
from .pool import ConnectionPool
from .producer import StoredResults, lane_key
from .retry import RetryPolicy
from .selector import NoPartitionAvailable, PartitionSelector, RoundRobinPartitionSelector

#: XA codes that mean the branch was rolled back (XA_RBBASE..XA_RBEND).
ROLLED_BACK_CODES = frozenset(range(100, 108))
#: What a step answers when our own earlier attempt of it already took effect (its reply
#: lost): a second start finds the branch (DUPID), a second end or prepare finds it already
#: idle or prepared (PROTO: nothing else this client did can have moved it there).
#: Commit and rollback need no entry: the XA table answers their repeats XA_OK.
_RETRIED_ANSWERS = frozenset({("start", Code.XAER_DUPID), ("end", Code.XAER_PROTO), ("end_fail", Code.XAER_PROTO),
                              ("prepare", Code.XAER_PROTO)})
#: Replies after which the same request may go again to the group's (new) master.
_RETRY_CODES = frozenset({c.FORBIDDEN, c.SERVICE_UNAVAILABLE, c.GATEWAY_TIMEOUT})


class TransactionError(MetaqError):
    """A transaction step failed; ``code`` is the XA code when the coordinator answered one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class ProducerFenced(TransactionError):
    """A newer instance of this producer's transactional id exists: this one may do nothing more."""


def _fenced(reply: Reply) -> bool:
    """The broker's refusal of an older epoch (403 ``fenced: ...``): final, never retried."""
    return reply.code == c.FORBIDDEN and reply.message.startswith("fenced:")


class TransactionRolledBack(TransactionError):
    """The broker rolled the transaction back (timeout, failover, end(TMFAIL)); nothing of it is visible."""


#: A branch's timeout travels as a non-negative int32 (``TransactionRequest.timeout_s``).
MAX_TIMEOUT_S = (1 << 31) - 1


def check_timeout(seconds: int) -> int:
    """A transaction timeout the broker accepts, refused here rather than at the first send."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be an int 0..{MAX_TIMEOUT_S} (0: the broker's maxTxTimeoutInSeconds), "
                         f"got {seconds!r}")
    return seconds


def xa_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return str(code)


@dataclass
class Branch:
    """The client's view of one branch: where it runs and what it has done there."""

    xid: str
    timeout_s: int = 0
    broker_id: int | None = None  # bound by the first send (or the resource's group)
    started: bool = False  # started on the broker
    partitions: set[Partition] = field(default_factory=set)


class TransactionalSender:
    """Puts and transaction steps for branches of one broker group (shared by both producers)."""

    def __init__(self, cluster: Cluster, pool: ConnectionPool, config: MetaClientConfig,
                 selector: PartitionSelector | None = None, broker_id: int | None = None,
                 transactional_id: str | None = None) -> None:
        self.cluster = cluster
        self.pool = pool
        self.config = config
        self.selector: PartitionSelector = selector or RoundRobinPartitionSelector()
        #: The broker group every branch of this sender runs on (None: the first send picks it).
        self.broker_id = broker_id
        #: Who this producer is (id, epoch, token) and its puts' numbers: one put at a time
        #: (``_lock``), so every partition's lane holds at most one batch.
        self.identity = ProducerIdentity(transactional_id)
        self.sequencer = Sequencer(1, self.identity)
        self.transactional_id = transactional_id
        #: Why this sender was fenced (None: it was not); set once, never cleared.
        self.fenced: str | None = None
        self._lock = asyncio.Lock()  # one put at a time: sequences stay in order on every partition

    @property
    def producer_id(self) -> int | None:
        return self.identity.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.identity.epoch

    # --- requests to the group's master, through failovers ---------------------------------

    async def request(self, broker_id: int, header: dict[str, Any], body: bytes = b"") -> tuple[Reply, int]:
        """The reply of the group's master (any code but the retried ones), and the attempts it took."""
        if self.fenced is not None:
            raise ProducerFenced(self.fenced)
        policy = RetryPolicy(self.config, max_attempts=None)
        while True:
            attempt = policy.attempted()
            why = await self._try(broker_id, header, body)
            if isinstance(why, Reply):
                if _fenced(why):
                    name = self.transactional_id
                    self.fenced = why.message if not name or name in why.message else f"{why.message} (transactional id {name})"
                    raise ProducerFenced(self.fenced, why.code)
                return why, attempt
            if policy.exhausted:
                raise TransactionError(f"{header['op']} to broker group {broker_id} gave up after {attempt} attempts: {why}")
            self.cluster.request_refresh()
            await policy.back_off()

    async def _try(self, broker_id: int, header: dict[str, Any], body: bytes) -> Reply | str:
        """One attempt: the reply, or why it may be tried again."""
        broker = self.cluster.snapshot.brokers.get(broker_id)
        if broker is None or not broker.master:
            return f"broker group {broker_id} has no master registered"
        try:
            conn = await self.pool.get(*parse_broker_url(broker.master))
            reply = await conn.request(header, body, timeout=self.config.request_timeout_s)
        except (ConnectionClosed, OSError, asyncio.TimeoutError) as exc:
            return f"{broker.master}: {exc or type(exc).__name__}"
        if reply.code in _RETRY_CODES and not _fenced(reply) and not access_denied(reply.code, reply.message, reply.reason):
            return f"{reply.code} {reply.message}"
        return reply  # an ACL's refusal too: no master of the group would answer otherwise

    async def any_master(self, topic: str) -> int:
        for partition in await self.partitions(topic):
            return partition.broker_id
        raise AssertionError("partitions() never returns an empty list")

    async def ensure_producer_id(self, topic: str) -> None:
        """A producer id from the cluster (once, and again after an unknown outcome): every
        transactional put carries it; a new id or epoch numbers every partition from 0."""
        if self.identity.known:
            return
        group = self.broker_id if self.broker_id is not None else await self.any_master(topic)
        # The name's mapping and its transactions live on this group, and (security on) only
        # this group's brokers can verify the id's producer_token.
        self.broker_id = group

        async def ask(request: InitProducerRequest) -> dict[str, Any]:
            reply, _ = await self.request(group, request.to_header())
            if reply.code != c.OK:
                raise TransactionError(f"init_producer: {reply.code} {reply.message}")
            return reply.header

        await self.identity.obtain(ask)

    def _identity_fields(self) -> dict[str, Any]:
        identity = self.identity
        return {"producer_id": identity.producer_id, "producer_epoch": identity.epoch}

    async def step(self, branch: Branch, action: str, **fields: Any) -> int:
        """One transaction step on the branch's master; its XA code."""
        assert branch.broker_id is not None
        if self.identity.known and self.transactional_id is not None:
            # so the broker can refuse a step of a fenced (older) instance
            for name, value in self._identity_fields().items():
                fields.setdefault(name, value)
        if fields.get("producer_id") is not None and self.identity.token is not None:
            fields.setdefault("producer_token", self.identity.token)
        header = TransactionRequest(action=action, xid=branch.xid, **fields).to_header()
        reply, attempts = await self.request(branch.broker_id, header)
        if reply.code != c.OK:
            raise TransactionError(f"transaction {action} {branch.xid}: {reply.code} {reply.message}")
        code = int(reply["xa_code"])
        if attempts > 1 and (action, code) in _RETRIED_ANSWERS:
            return int(Code.XA_OK)  # our own first attempt arrived and did it; its reply was lost
        return code

    async def start(self, branch: Branch) -> None:
        code = await self.step(branch, "start", timeout_s=branch.timeout_s, **self._identity_fields())
        if code != Code.XA_OK:
            raise TransactionError(f"transaction {branch.xid} could not start: {xa_name(code)}", code)
        branch.started = True

    # --- puts ------------------------------------------------------------------------------

    async def partitions(self, topic: str) -> list[Partition]:
        """Writable partitions of ``topic`` (of this sender's group once bound), waiting for them a while."""
        await self.cluster.watch_topic(topic, publish=True)
        deadline = time.monotonic() + self.config.send_timeout_s
        while True:
            found = [p for p in self.cluster.snapshot.writable_partitions(topic)
                     if self.broker_id is None or p.broker_id == self.broker_id]
            if found:
                return found
            if time.monotonic() > deadline:
                where = "" if self.broker_id is None else f" on broker group {self.broker_id} (a transaction stays in one group)"
                raise TransactionError(f"topic {topic!r} has no writable partition{where}")
            self.cluster.request_refresh()
            await asyncio.sleep(self.config.send_retry_max_wait_s)

    async def send(self, branch: Branch, messages: list[Message]) -> Sequence[SendResult]:
        """Put ``messages`` (one topic) in the branch, all in one put; raises if they are not stored.

        The results are built as they are read (``StoredResults``; the Spark sink never reads them)."""
        if not messages:
            return []
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("a batch goes to one topic")
        await self.ensure_producer_id(topic)
        candidates = await self.partitions(topic)
        try:
            partition = self.selector.select(topic, candidates, messages[0])
        except NoPartitionAvailable as exc:
            raise TransactionError(str(exc)) from None
        if self.broker_id is None:
            self.broker_id = partition.broker_id
        branch.broker_id = self.broker_id
        async with self._lock:
            if not branch.started:
                await self.start(branch)
            await self.ensure_producer_id(topic)  # an unknown outcome of the put before dropped it
            return await self._put(branch, topic, partition, messages)

    async def _put(self, branch: Branch, topic: str, partition: Partition, messages: list[Message]) -> Sequence[SendResult]:
        body, starts = encode_messages(messages)
        # One put at a time (``_lock``): the lane is empty, so the batch is numbered at once.
        numbered = self.sequencer.try_begin(lane_key(topic, partition), len(messages))
        assert numbered is not None, "numbered with no producer id, or beside another put"
        header = PutRequest(topic=topic, partition=partition.partition, count=len(messages), txid=branch.xid,
                            **numbered.put_fields()).to_header()
        try:
            reply, attempts = await self.request(partition.broker_id, header, body)
        except ProducerFenced:
            self.sequencer.end(numbered, False)
            raise
        except BaseException:
            # Stored or not, nobody knows: the transaction cannot be committed as the caller sent it,
            # and the numbering under this id is unknown: the sequencer drops it (a new one next).
            self.sequencer.end(numbered, None)
            raise
        if reply.code != c.OK:
            self.sequencer.end(numbered, False)
            raise TransactionError(f"put in transaction {branch.xid} to {topic}-{partition}: {reply.code} {reply.message}")
        self.sequencer.end(numbered, True)
        branch.partitions.add(partition)
        return StoredResults(topic, partition, reply.header, starts, attempts)


class AsyncTransactionalProducer:
    """Local transactions (MetaQ's TransactionalProducer). Create with ``factory.create_transactional_producer()``."""

    def __init__(self, sender: TransactionalSender) -> None:
        self.sender = sender
        self._numbers = itertools.count(1)
        self._branch: Branch | None = None

    @property
    def in_transaction(self) -> bool:
        return self._branch is not None

    async def begin_transaction(self, timeout_s: int = 0) -> None:
        """Open a transaction (``timeout_s``: rolled back by the broker after that; 0: its maximum)."""
        if self.sender.fenced is not None:
            # Nothing reaches the broker here, so the fence is checked where it was recorded:
            # a fenced producer refuses everything, a new transaction too.
            raise ProducerFenced(self.sender.fenced)
        if self._branch is not None:
            name = f"transaction {self._branch.xid}" if self._branch.xid else "a transaction"
            raise TransactionError(f"{name} is still open: commit or roll it back first")
        self._branch = Branch("", check_timeout(timeout_s))  # named at the first send, under the producer id

    async def send_message(self, message: Message) -> SendResult:
        return (await self.send_batch([message]))[0]

    async def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        """Send messages of one topic in the open transaction, in one put."""
        branch = self._open()
        batch = list(messages)
        if batch and not branch.xid:
            await self.sender.ensure_producer_id(batch[0].topic)
            # The epoch keeps a newer instance of a transactional id (same producer id) off the older one's ids.
            branch.xid = f"TX:{self.sender.producer_id}.{self.sender.producer_epoch}:{next(self._numbers)}"
        return list(await self.sender.send(branch, batch))

    async def commit(self) -> None:
        """Make every message of the transaction visible at once; TransactionRolledBack if the broker rolled it back."""
        branch = self._open()
        self._branch = None
        if not branch.started:
            return  # nothing sent: nothing to commit
        sender = self.sender
        code = await sender.step(branch, "end")
        if code == Code.XA_OK:
            code = await sender.step(branch, "commit_one_phase")
        if code in ROLLED_BACK_CODES:
            raise TransactionRolledBack(f"transaction {branch.xid} was rolled back by the broker ({xa_name(code)})", code)
        if code != Code.XA_OK:
            raise TransactionError(f"commit of transaction {branch.xid} failed: {xa_name(code)}", code)

    async def rollback(self) -> None:
        """Discard the transaction: none of its messages ever becomes visible."""
        branch = self._open()
        self._branch = None
        if not branch.started:
            return
        sender = self.sender
        code = await sender.step(branch, "end")
        if code == Code.XA_OK:
            code = await sender.step(branch, "rollback")
        if code != Code.XA_OK and code not in ROLLED_BACK_CODES:
            raise TransactionError(f"rollback of transaction {branch.xid} failed: {xa_name(code)}", code)

    def _open(self) -> Branch:
        if self._branch is None:
            raise TransactionError("no transaction is open: call begin_transaction() first")
        return self._branch

    async def close(self) -> None:
        """Roll back a transaction left open."""
        if self._branch is not None:
            await self.rollback()
