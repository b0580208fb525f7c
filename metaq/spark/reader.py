"""Executor side: read one planned offset range of one partition as pyarrow RecordBatches.

A task gets a ``MetaQInputPartition`` (pickled from the driver), opens its own connection
inside ``read()``, and fetches ``[start, end)`` with large gets, one get always in flight
while the previous chunk is decoded and handed to Spark. Records are CRC-checked. Read
committed: control records (batch headers, transaction markers) and records of rolled-back
transactions (the replies' ``aborted`` spans) are left out. The
broker never returns bytes past the replica's last stable offset, and the reader never asks
past ``end`` (itself at most the committed offset of the replica planning asked).

Failover: when the replica fails (connection lost or refused, no reply in time, an error
reply other than 403, a corrupt record), the reader switches to the next replica the read-from policy
allows and continues at the same offset: the offset of the first record not yet handed to
Spark. Offsets and bytes are identical on every replica, so nothing is lost or repeated.
A replica that is behind (its committed offset below what we need) is waited for with
long-polls, up to ``timeoutMs``; then the next one is tried. When every planned replica
has failed, the reader re-reads ZooKeeper (a restarted or new slave) until ``timeoutMs``.
A refused login or ACL (``AccessRefused``) is not failed over: the group's replicas share
one users file, so the task fails at once with the options to fix.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa

from ..addresses import broker_url
from ..client.routing import Replica
from ..protocol import commands as c
from ..protocol.replies import aborted_spans
from ..record import RecordError, decode_columns
from ..txn.control import drop_control_columns
from ..txn.reader import VisibleRecords
from .fetch import ReplicaError, ReplicaSession
from .login import SparkLogin

log = logging.getLogger(__name__)

ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.string()),
        ("offset", pa.int64()),
        ("msg_id", pa.int64()),
        ("attribute", pa.string()),
        ("data", pa.binary()),
        ("broker", pa.string()),
    ]
)
SPARK_SCHEMA = "topic string, partition string, offset long, msg_id long, attribute string, data binary, broker string"

#: Long-poll of a get that waits for a lagging replica's committed offset to move.
BEHIND_POLL_MS = 500


try:  # pyspark is optional for the package, required for the source
    from pyspark.sql.datasource import InputPartition as _InputPartition
except ImportError:  # pragma: no cover
    _InputPartition = object  # type: ignore[misc,assignment]


@dataclass
class MetaQInputPartition(_InputPartition):  # type: ignore[misc]
    """One Spark task's work: records of ``topic`` partition ``name`` with start offset in ``[start, end)``."""

    topic: str
    name: str
    broker_id: int
    partition: int
    start: int
    end: int
    replicas: tuple[Replica, ...]
    read_from: str
    zk_connect: str
    zk_root: str
    fetch_bytes: int
    timeout_ms: int
    #: Which split of the partition this is (0 when not split), for logs.
    split: int = 0
    #: Paths only: the task reads the password file when it connects (login.py).
    login: SparkLogin = SparkLogin()
    value: object = field(default=None, repr=False)  # InputPartition's own attribute


def _batch(topic: str, name: str, url: str, offsets: list, ids: list, attrs: list, datas: list) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * n, pa.string()),
            pa.array([name] * n, pa.string()),
            pa.array(offsets, pa.int64()),
            pa.array(ids, pa.int64()),
            pa.array(attrs, pa.string()),
            pa.array(datas, pa.binary()),
            pa.array([url] * n, pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )


class RangeReader:
    """Reads one ``MetaQInputPartition``; ``batches()`` is the generator Spark consumes."""

    def __init__(self, part: MetaQInputPartition) -> None:
        self.part = part
        self.position = part.start  # offset of the first record not yet handed out
        self.used: list[str] = []  # urls of the replicas read from, in order (for tests/logs)
        self.errors: list[str] = []

    def batches(self) -> Iterator[pa.RecordBatch]:
        part = self.part
        timeout = part.timeout_ms / 1000
        candidates = list(part.replicas)
        dead: set[Replica] = set()
        deadline: float | None = None
        credentials = part.login.credentials()
        while self.position < part.end:
            replica = next((r for r in candidates if r not in dead), None)
            if replica is None:
                # Every replica we know failed: ask ZooKeeper again (until the deadline).
                now = time.monotonic()
                deadline = deadline or now + timeout
                if now > deadline:
                    raise RuntimeError(
                        f"metaq: no replica could serve {part.topic} partition {part.name} from offset "
                        f"{self.position} (to {part.end}) within {timeout:.0f}s: {'; '.join(self.errors[-6:])}"
                    )
                time.sleep(0.5)
                candidates = list(self._rediscover())
                dead.clear()
                continue
            try:
                session = ReplicaSession(replica, timeout=min(timeout, 10.0), credentials=credentials)
            except ReplicaError as exc:
                self._failed(replica, exc, dead)
                continue
            try:
                url = broker_url(replica.host, replica.port)
                self.used.append(url)
                for batch, position in self._read_from(session, url, timeout):
                    self.position = position
                    deadline = None  # progress: the give-up clock starts again
                    yield batch
            except (ReplicaError, RecordError) as exc:
                self._failed(replica, exc, dead)
            finally:
                session.close()

    def _failed(self, replica: Replica, exc: Exception, dead: set[Replica]) -> None:
        message = f"{broker_url(replica.host, replica.port)}: {exc}"
        log.warning("metaq: %s partition %s at offset %s: replica failed (%s); trying another", self.part.topic, self.part.name, self.position, message)
        self.errors.append(message)
        dead.add(replica)

    def _rediscover(self) -> tuple[Replica, ...]:
        from .options import SourceOptions
        from .planning import discover_replicas

        part = self.part
        options = SourceOptions(zk_connect=part.zk_connect, topic=part.topic, zk_root=part.zk_root, read_from=part.read_from, timeout_ms=part.timeout_ms)
        try:
            return discover_replicas(options, part.broker_id, part.partition)
        except Exception as exc:  # ZK down for now: keep trying until the deadline
            self.errors.append(f"zookeeper: {exc}")
            return ()

    def _read_from(self, session: ReplicaSession, url: str, timeout: float) -> Iterator[tuple[pa.RecordBatch, int]]:
        part = self.part
        topic, n, end, size = part.topic, part.partition, part.end, part.fetch_bytes
        position = self.position  # first byte of ``carry``
        fetch_at = position
        carry = b""
        visible = VisibleRecords()  # aborted spans of the replies so far (a record may span two)
        future = session.send_get(topic, n, fetch_at, min(size, end - fetch_at))
        behind_since: float | None = None
        while True:
            reply = session.wait(future, timeout + BEHIND_POLL_MS / 1000)
            code = reply.code
            if code == c.OK:
                behind_since = None
                body = reply.body
                if int(reply.get("offset", fetch_at)) != fetch_at or not body:
                    raise ReplicaError(f"get at {fetch_at} answered for offset {reply.get('offset')} with {len(body)} bytes")
                fetch_at += len(body)
                if fetch_at < end:  # keep one get in flight while this chunk is decoded
                    future = session.send_get(topic, n, fetch_at, min(size, end - fetch_at))
                buf = carry + body if carry else bytes(body)
                offsets, ids, attrs, datas, consumed = decode_columns(buf, position)
                carry = buf[consumed:]
                visible.add(aborted_spans(reply.header))
                if visible.starts:  # records of rolled-back transactions: no rows (nor control records)
                    offsets, ids, attrs, datas = _committed_columns(visible, offsets, ids, attrs, datas)
                else:  # batch headers, markers: no rows
                    offsets, ids, attrs, datas = drop_control_columns(offsets, ids, attrs, datas)
                position += consumed
                visible.forget_before(position)
                if offsets:  # a failover re-reads (and skips again) what was skipped since the last batch
                    yield _batch(topic, part.name, url, offsets, ids, attrs, datas), position
                if fetch_at >= end:
                    if carry:
                        raise RecordError(
                            f"partition {part.name}: end offset {end} is not a message boundary "
                            f"({len(carry)} bytes of a record before it)"
                        )
                    # The range is read even if its tail gave no row (rolled back, control
                    # records): without this the caller would read it again, forever.
                    self.position = position
                    return
            elif code == c.NOT_FOUND:
                # Nothing at fetch_at yet: this replica's committed offset is behind our end.
                now = time.monotonic()
                behind_since = behind_since or now
                if now - behind_since > timeout:
                    raise ReplicaError(
                        f"committed offset {reply.get('committed')} stayed below {fetch_at} for {timeout:.0f}s"
                    )
                future = session.send_get(topic, n, fetch_at, min(size, end - fetch_at), max_wait_ms=BEHIND_POLL_MS)
            elif code == c.MOVED:
                raise ReplicaError(f"offset {fetch_at} is no longer in this replica's log (moved to {reply.get('offset')})")
            else:
                raise ReplicaError(f"get at {fetch_at}: {code} {reply.message}")


def _committed_columns(visible: VisibleRecords, offsets: list, ids: list, attrs: list, datas: list) -> tuple[list, list, list, list]:
    """Only the columns' rows outside the aborted spans, and no control record's."""
    keep = [i for i, (offset, attribute) in enumerate(zip(offsets, attrs)) if visible.visible(offset, attribute)]
    if len(keep) == len(offsets):
        return offsets, ids, attrs, datas
    return [offsets[i] for i in keep], [ids[i] for i in keep], [attrs[i] for i in keep], [datas[i] for i in keep]


def read_partition(part: MetaQInputPartition) -> Iterator[pa.RecordBatch]:
    yield from RangeReader(part).batches()
