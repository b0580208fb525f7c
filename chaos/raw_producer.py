"""The workload's raw producers: puts straight to the group's master over ``BrokerConnection``.

How a put ends in the history (chaos/history.py): ``ok`` (acked, with the acked offset,
epoch and master), ``fail`` (definitely not stored) or ``info`` (unknown outcome).

``ProducerSettings`` decides what a raw producer does with an unknown outcome (a timeout,
the connection lost after the put went out, a 504/500 answer):

* ``retry_unknown`` off (the default): it records ``info`` and moves on. Nothing is ever
  sent twice, so a value stored twice is a broker bug.
* ``retry_unknown`` on: it resends the same bytes to the partition's current master (after
  a failover, the new one) until a resend is acked, or refused by a master that is not
  allowed to have stored it, or ``resend_budget_s`` runs out (then ``info``). A refusal
  after an unknown outcome does not make the put ``fail``: an earlier attempt may have been
  stored, so the producer keeps resending. Each completion carries ``attempts`` and
  ``resent_after_unknown`` (how many resends followed an unknown outcome). This is the
  at-least-once setting: without idempotence a resend can store a value twice.
* ``idempotent`` on (implies ``retry_unknown``): every put is numbered like the client's
  idempotent producer (a producer id from ``init_producer``, a sequence per partition,
  metaq/client/idempotence.py) and every resend carries the same numbers, so the broker
  must store it at most once and answer a resend of a stored batch with its original offset.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from metaq.client.connection import BrokerConnection, ConnectionClosed
from metaq.client.idempotence import Numbered, Sequencer
from metaq.protocol import commands as c
from metaq.protocol.messages import InitProducerRequest, PutRequest
from metaq.record import encode_batch

from .cluster import ChaosCluster
from .history import History


class Masters(Protocol):
    masters: dict[int, str | None]  # group -> the master registered in ZooKeeper now


class ProducerHost(Protocol):
    """What a raw producer needs of the workload that runs it (chaos/runner.py's
    ``Workload``): named here, so that this module does not import the runner that
    imports it."""

    cluster: ChaosCluster
    history: History
    monitor: Masters
    seed: int
    rate: float
    stopping: asyncio.Event
    conns: dict[str, BrokerConnection]  # url -> the producers' shared connection

    def acked(self, partition: str | None, offset: int | None, value: str) -> None: ...

    async def producer_conn(self, url: str) -> BrokerConnection: ...


@dataclass(frozen=True)
class ProducerSettings:
    """What every workload producer does about unknown outcomes (recorded in the history's meta)."""

    idempotent: bool = False
    retry_unknown: bool = False

    def __post_init__(self) -> None:
        if self.idempotent and not self.retry_unknown:
            # An idempotent producer exists to make resends safe: it always resends.
            object.__setattr__(self, "retry_unknown", True)

    def to_json(self) -> dict[str, bool]:
        return asdict(self)


@dataclass
class Attempt:
    """One put attempt: ``kind`` is ok / fail (not stored) / info (unknown); ``reply`` when ok."""

    kind: str
    error: str = ""
    reply: dict[str, Any] | None = None
    retriable: bool = False  # a refusal a later attempt (or another master) may not repeat
    renumber: bool = False  # the broker's numbering differs (out of order): start over under a new id


class RawProducer:
    """One put at a time, each resent (per ``settings``) until its outcome is known: so a
    numbered batch is alone in flight for its partition, as the broker's dedup requires."""

    def __init__(self, workload: ProducerHost, name: str, settings: ProducerSettings, resend_budget_s: float) -> None:
        self.workload = workload
        self.name = name
        self.settings = settings
        self.resend_budget_s = resend_budget_s
        #: One numbering per broker group (idempotent only): with security on a producer id's
        #: token verifies only on the brokers of the group that issued it.
        self.sequencers: dict[int, Sequencer] = {}

    def _sequencer(self, group: int) -> Sequencer | None:
        return self.sequencers.setdefault(group, Sequencer()) if self.settings.idempotent else None

    async def run(self) -> None:
        w = self.workload
        rng = random.Random(f"workload/{self.name}/{w.seed}")
        topic = w.cluster.topic
        seq = 0
        while not w.stopping.is_set():
            group = rng.randrange(w.cluster.num_groups)
            n = rng.randrange(w.cluster.partitions)
            if not w.monitor.masters.get(group):
                await asyncio.sleep(0.05)
                continue
            value = f"{self.name}-{seq}"
            seq += 1
            partition = f"{topic}/{group}-{n}"
            op = w.history.invoke(self.name, "put", value, partition)
            await self.put(op, group, n, partition, encode_batch([(value.encode(), None)]), value)
            await asyncio.sleep(1 / w.rate)

    async def put(self, op: int, group: int, n: int, partition: str, body: bytes, value: str) -> None:
        """Send ``body`` to partition ``n`` of ``group`` and record how the put ``op`` ended."""
        w = self.workload
        deadline = time.monotonic() + self.resend_budget_s
        numbered: Numbered | None = None
        sequencer = self._sequencer(group)
        attempts = unknown = 0
        while True:
            url = w.monitor.masters.get(group)
            if sequencer is not None and numbered is None and url is not None:
                numbered = await self._number(sequencer, url, (group, n))
            if url is None:
                result = Attempt("fail", "no master", retriable=True)
            elif sequencer is not None and numbered is None:
                result = Attempt("fail", f"no producer id from {url}", retriable=True)
            else:
                attempts += 1
                result = await self._attempt(url, n, body, numbered)
            if result.kind == "info":
                unknown += 1
            if self._settled(result, unknown) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        if result.kind == "info":
            unknown -= 1  # the last unknown outcome was not resent
        fields = {"attempts": attempts, "resent_after_unknown": unknown}
        if result.kind == "ok":
            assert result.reply is not None
            offset = int(result.reply["offset"])
            at = offset if offset >= 0 else None  # a duplicate too old for the broker to say where
            w.history.ok(op, at, result.reply.get("epoch"), url, duplicate=result.reply.get("duplicate"),
                         msg_id=result.reply.get("msg_id"), **fields)
            w.acked(partition, at, value)
        elif result.kind == "fail" and unknown == 0:
            w.history.fail(op, result.error, **fields)
        else:  # an unknown outcome that no resend settled (or a refusal after one)
            w.history.info(op, f"unknown: {result.error}", **fields)
        if numbered is not None and sequencer is not None:
            stored = True if result.kind == "ok" else (False if result.kind == "fail" and unknown == 0 else None)
            sequencer.end(numbered, None if result.renumber else stored)
        if result.kind != "ok":
            await asyncio.sleep(0.05 if result.kind == "fail" else 0.1)

    def _settled(self, result: Attempt, unknown: int) -> bool:
        """Whether the put's outcome is known (or resending is off): no further attempt."""
        if result.kind == "ok" or not self.settings.retry_unknown:
            return True
        if result.kind == "fail":
            # Not stored by this attempt; settled unless an earlier attempt may have been.
            return unknown == 0 or not result.retriable
        return False

    async def _number(self, sequencer: Sequencer, url: str, key: tuple[int, int]) -> Numbered | None:
        if not sequencer.has_id:
            try:
                conn = await self.workload.producer_conn(url)
                reply = await conn.request(InitProducerRequest().to_header(), timeout=3.0)
            except (ConnectionClosed, asyncio.TimeoutError, OSError):
                return None
            if not reply.ok:
                return None
            sequencer.set_id(int(reply["producer_id"]), int(reply["epoch"]), reply.header.get("producer_token"))
        return sequencer.try_begin(key, 1)

    async def _attempt(self, url: str, n: int, body: bytes, numbered: Numbered | None) -> Attempt:
        w = self.workload
        numbers = numbered.put_fields() if numbered is not None else {}
        try:
            conn: BrokerConnection = await w.producer_conn(url)
            future = conn.send(PutRequest(topic=w.cluster.topic, partition=n, count=1, **numbers).to_header(), body)
        except (ConnectionClosed, OSError, asyncio.TimeoutError) as exc:
            return Attempt("fail", f"not sent: {exc}", retriable=True)
        try:
            reply = await asyncio.wait_for(future, 3.0)
        except (ConnectionClosed, asyncio.TimeoutError) as exc:
            conn.close()
            w.conns.pop(url, None)
            return Attempt("info", str(exc) or "timeout")
        if reply.ok:
            return Attempt("ok", reply=dict(reply.header))
        error = f"{reply.code} {reply.message}"
        if reply.code in c.RETRIABLE_CODES:
            return Attempt("fail", error, retriable=True)
        if reply.code in (c.BAD_REQUEST, c.NOT_FOUND):
            return Attempt("fail", error, renumber="expected_seq" in reply.header)
        return Attempt("info", error)  # 504, 500: may or may not be stored
