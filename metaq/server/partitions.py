"""Every partition this broker serves (master or slave), each with one owner: ``Partition``.

A ``Partition`` holds a log (metaq/store/log.py), its epoch history (metaq/ha/epochs.py),
and the transaction state derived from its bytes (``PartitionTxnState``, metaq/txn/rebuild.py:
the producer dedup table, the transaction index, the batch spans and ``position``). It is
the only writer of all four (Kafka's ``UnifiedLog``), through one path per change:

* ``append_as_leader(data, records, header)``: the one leader append entry, used alike by a
  master's put (plain or an idempotent batch, its BATCH ``header`` planned by
  ``txn/put.py : plan_put``, from ``server/handlers.py``) and a transaction marker (from
  ``server/transactions.py``): stamp the msg ids, append, push to streaming slaves, record
  the append and wake parked fetches, in one step (Kafka's ``ReplicaManager.appendRecords``);
  the caller then waits for durability (``LeaderHost.durability_wait``);
* ``append_as_follower(data)``: a slave's replica append (``ha/replica.py``);
* ``truncate_to(offset)`` / ``restart_at(offset)``: HA truncation, the cut of an incomplete
  batch at start and at promotion (``cut_incomplete_tail``), a slave restarting an empty
  log at its master's log start; each fixes the epoch history and the state itself;
* ``Partitions.drop(keys)``: a topic deleted or re-created;
* ``Partitions.assign_epoch(topics, epoch)`` (a new master's epoch on every served log) and
  ``Partition.adopt_epochs(entries)`` (a slave copying its master's history): the two
  writers of the epoch history besides ``truncate_to``.

Invariants (kept here, because nothing else writes these objects):

* the state follows the log end: after every append and truncation ``state.position ==
  log.log_end`` (an append that failed after writing part of its bytes is caught up by the
  next append), and the state is a pure function of the log bytes below ``position`` (but
  for the idle producers forgotten, judged by the newest batch timestamp in those bytes,
  never the wall clock, so every replica forgets the same ones once it has read as far).
  Master and slaves hold byte-identical logs, so they derive the same state, and a promoted
  slave knows every batch its master acked;
* a put or fetch never loads a snapshot nor walks the log, and never waits for either on
  the event loop: a state is loaded when its partition is opened (``open_all`` at start,
  before serving), rebuilt inside ``truncate_to``, and for a log first opened at run time
  (a topic created or re-added, partitions added: ``open_added`` from
  ``Broker.update_topics``, or a first ``get``) loaded in a worker thread; meanwhile
  ``serving`` answers the put and fetch paths ``PartitionLoading`` (503, retriable: Kafka's
  LOAD_IN_PROGRESS), and the owner's other callers (HA truncation, promotion, the
  reconcile) wait for that load (``Partition.state``). A log with no bytes and no snapshot
  (a partition just created) has nothing to load and is ready at once;
* a snapshot never describes bytes that are gone: ``truncate_to`` discards it before the
  cut (a crash between cut and rebuild finds none and walks the log), and a snapshot
  serialized before a cut is not written after it (``cuts``);
* no batch is half in a log that is served or appended to (``cut_incomplete_tail``);
* the epoch history never names an offset past the log end (``truncate_to``);
* only the leader appends on a master, and nothing is appended to a partition once it was
  dropped (``append_as_leader``, ``_append``: see there).

Snapshots are written on close and every ``SNAPSHOT_INTERVAL_S``; each round first
forgets the producers idle for ``producerExpiryMs`` (``expire_producers``). A sync
master's committed offset is moved down to a batch boundary here (``batch_boundary``),
so readers never get part of a batch that is not acked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Iterator, NamedTuple, Protocol

from ..ha.epochs import EpochCache, save_all
from ..ha.record import ReplicationRecord
from ..protocol import commands as c
from ..record import HEADER, stamp_msg_ids
from ..store.refused import RefusedLog
from ..txn import rebuild
from ..txn.control import Control, ControlError, may_hold_control
from ..txn.index import TransactionIndex
from ..txn.producer_state import DEFAULT_EXPIRY_MS, DEFAULT_MAX_BATCHES, ProducerStateTable
from ..txn.rebuild import PartitionTxnState
from .stats import PartitionCounters, add_counters
from .waiters import ParkedFetches

if TYPE_CHECKING:
    from ..ha.stream import StreamHub
    from ..store.msgid import MsgIdGenerator

log = logging.getLogger(__name__)

#: How often the snapshots of the states that moved are rewritten (bounds the walk at a restart).
SNAPSHOT_INTERVAL_S = 60.0
#: Snapshot files written at once when the broker stops (each is fsynced; one after another
#: 2,000 of them took 10 s).
CLOSE_SNAPSHOT_WORKERS = 16
Key = tuple[str, int]


class PartitionLoading(c.RequestError):
    """A put or fetch on a partition whose transaction state a worker thread is still loading."""

    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(c.SERVICE_UNAVAILABLE, f"{topic}-{partition}: its transaction state is still being loaded "
                                                "after it was opened; retry")


class PartitionDropped(c.RequestError):
    """An append to a partition no longer served (its topic deleted or re-created meanwhile)."""

    def __init__(self, name: str) -> None:
        super().__init__(c.NOT_FOUND, f"{name} is no longer served (its topic was deleted or re-created); nothing appended")


class NotLeader(c.RequestError):
    """A leader append on a broker that may not write now (a slave, a fenced or resigning master)."""


class LeaderGate(Protocol):
    """The HA side of a leader append (metaq.ha.node.HaNode)."""

    @property
    def epoch(self) -> int: ...

    @property
    def streams(self) -> "StreamHub": ...

    def write_refusal(self) -> tuple[int, str] | None: ...


class LeaderHost(Protocol):
    """What a master's append needs beside the log (metaq.server.broker.Broker), and nothing more."""

    @property
    def ids(self) -> "MsgIdGenerator | None": ...

    @property
    def ha(self) -> LeaderGate: ...

    def appended(self, topic: str, partition: int, end: int, count: int) -> None:
        """Record the append (slaves' lag) and wake the fetches parked on the partition."""

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> Awaitable[None] | None:
        """What an append ending at ``end`` waits for before it is acked (flush, sync slaves)."""


class Appended(NamedTuple):
    """Where a leader append went: ``[offset, end)``, its records' msg ids from ``first_id``."""

    offset: int
    end: int
    first_id: int


class Partition:
    """One partition's log, epoch history and transaction state, and their only writer."""

    def __init__(self, owner: "Partitions", key: Key, partition_log: Any, *, in_background: bool = False) -> None:
        self._owner = owner
        self.key = key
        self.log = partition_log  # PartitionLog | RefusedLog
        self.directory = Path(owner.store.partition_dir(*key))
        self._state: PartitionTxnState | None = None
        #: The worker thread's load of the state (``in_background``), until ``state`` adopts it.
        self._loading: concurrent.futures.Future[PartitionTxnState] | None = None
        if not self._has_state_to_load():
            self._state = self._empty_state()
        elif in_background:
            self._loading = owner.loader.submit(self._load)
        else:
            self._state = self._load()
        self._epochs: EpochCache | None = None
        self.snapshot_position = -1  # position of the last snapshot written (-1: none)
        self.cuts = 0  # truncations and drops: a snapshot serialized before one is stale
        #: Set once by ``Partitions.drop`` (and ``close``): nothing is appended after it.
        self.dropped = False
        #: Its stats counters (metaq/server/stats.py: puts, fetches, a slave's fetches), made at
        #: the first count (``Partitions.counters``): an idle partition holds none, and its row
        #: is listed only once it counted something.
        self.counters: PartitionCounters | None = None
        #: The fetches parked on it (metaq/server/waiters.py), made at the first; woken when it is dropped.
        self.parked: ParkedFetches | None = None
        #: What replication knows of this partition (metaq/ha/record.py): slaves' positions,
        #: the append history, the share of this term's writes slaves fetched. Goes with it.
        self.replication = ReplicationRecord()

    @property
    def ready(self) -> bool:
        """Whether the state is loaded (never blocks)."""
        return self._state is not None or (self._loading is not None and self._loading.done())

    @property
    def state(self) -> PartitionTxnState:
        """The transaction state at the log end; waits for a load still running in its worker
        thread (the put and fetch paths never get here before ``ready``: ``Partitions.serving``)."""
        return self._join_load()

    def _join_load(self) -> PartitionTxnState:
        """The state, once a load in the worker thread finished: every change of the log or the
        snapshot comes after it (nothing moves under the walk)."""
        if self._state is None:
            assert self._loading is not None
            self._state = self._loading.result()  # a failed load raises here, as it would have at open
            self._loading = None
        return self._state

    @state.setter
    def state(self, state: PartitionTxnState) -> None:
        self._state = state

    def _has_state_to_load(self) -> bool:
        """Whether opening this log means reading a snapshot or walking bytes (a stat, no read)."""
        return not self.refused and (self.log.log_end > self.log.min_offset
                                     or (self.directory / rebuild.SNAPSHOT_FILE).exists())

    @property
    def name(self) -> str:
        return f"{self.key[0]}-{self.key[1]}"

    @property
    def refused(self) -> bool:
        return isinstance(self.log, RefusedLog)

    @property
    def epochs(self) -> EpochCache:
        """The log's epoch history (read from its checkpoint on first use)."""
        if self._epochs is None:
            self._epochs = EpochCache.load(self.log.directory)
        return self._epochs

    def _empty_state(self) -> PartitionTxnState:
        return PartitionTxnState(self._owner.new_table(), TransactionIndex(), self.log.log_end)

    def _load(self) -> PartitionTxnState:
        """The snapshot, then a walk of the log past it (only at open and after a truncation)."""
        if self.refused:  # no bytes to derive anything from
            return self._empty_state()
        marked: set[int] = set()
        while True:
            try:
                return rebuild.load_state(self.directory, self.log.read_as_stored, self.log.min_offset, self.log.log_end,
                                          producers=self._owner.new_table, unreadable_end=self.log.corrupt_end_at)
            except ControlError as exc:
                # A marker whose body a bit flip broke (the walk does not check CRCs): in a
                # sealed segment that is corruption like any other, unserved until a replica
                # puts it back, and the walk passes it. Anything else stays fatal, as does a
                # range already marked (the walk should have passed it).
                if exc.offset is None or exc.offset in marked or not self.log.mark_if_corrupt_record(exc.offset):
                    raise
                marked.add(exc.offset)

    # --- appends: the one path of each kind --------------------------------------------------

    def append_as_leader(self, data: bytearray, records: int, header: Control | None = None, *,
                         no_control: bool = False) -> Appended:
        """The one leader append entry: a master's put and a transaction marker alike.

        ``data``: whole records (``records`` of them, a BATCH header counted), msg ids stamped
        here; ``header``: the BATCH header ``plan_put`` framed an idempotent batch with;
        ``no_control``: the caller found that no record of ``data`` is a control record (the
        put handler's ``find_forged_control``), so the state need not search it again. In one
        step with no ``await`` (nothing else appends in between): refuse, stamp, append (the
        state follows), push the bytes to streaming slaves (before any bookkeeping: the
        critical path), record the append and wake parked fetches (``LeaderHost.appended``).
        The caller then waits for durability (``LeaderHost.durability_wait``) before its ack.
        OSError from the store (nothing recorded; the state catches up at the next append).

        Invariants, kept here for every writer of a master's log:

        * only the leader appends: ``write_refusal`` is asked right before (the callers asked it
          too, before any work, with no ``await`` since), so a slave, a fenced or resigning
          master, a master handing over or one whose lease lapsed appends nothing here;
        * epochs only grow: the bytes are pushed in the epoch this broker serves, which every
          partition's history names before the first ack in it (``Partitions.assign_epoch``);
          nothing here writes the history;
        * nothing is appended to a dropped partition (``dropped``; also ``_append``, for the
          follower's writes): a put or marker that raced a topic delete gets 404.
        """
        leader = self._owner.leader
        if leader is None:
            raise RuntimeError(f"{self.name}: this broker's partitions have no leader side (Partitions(leader=...))")
        if self.dropped:
            raise PartitionDropped(self.name)
        refusal = leader.ha.write_refusal()
        if refusal is not None:
            raise NotLeader(refusal[0], refusal[1])
        ids = leader.ids
        assert ids is not None  # set in Broker.start, before anything is served
        first_id = ids.allocate(records)
        stamped = stamp_msg_ids(data, first_id)
        assert stamped == records, f"{self.name}: {records} records announced, {stamped} in the bytes"
        offset = self._append(data, header, no_control)
        end = offset + len(data)
        topic, partition = self.key
        streams = self.replication.streams
        if streams:  # no slave streams it: one truth test
            leader.ha.streams.push(streams, offset, leader.ha.epoch, data)
        leader.appended(topic, partition, end, records)
        return Appended(offset, end, first_id)

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> int:
        """Append whole records fetched from the master, byte for byte (a slave's log is a
        prefix of its master's: the caller asked for them at exactly this log end)."""
        return self._append(data, None)

    def _append(self, data: bytes | bytearray | memoryview, header: Control | None, no_control: bool = False) -> int:
        if self.dropped:  # a replica task that outlived its partition's drop
            raise PartitionDropped(self.name)
        state = self._join_load()  # first: no byte is appended while a worker thread walks the log
        offset = self.log.append(data)
        end = offset + len(data)
        if state.position != offset:
            # An earlier append failed after writing (its bytes are in the log): follow them first.
            state.catch_up(self.log.read_as_stored, offset, self.log.corrupt_end_at)
        if header is not None:
            state.appended(offset, data, header)
        elif state.position == offset and (no_control or not may_hold_control(data)):
            _length, crc, msg_id, _flag = HEADER.unpack_from(data, 0)
            state.passed_plain(offset, end, (msg_id, crc))
        else:  # a marker, or a replicated BATCH: the state reads its own bytes
            state.catch_up(self.log.read_as_stored, end, self.log.corrupt_end_at)
        return offset

    # --- truncation: the one path -------------------------------------------------------------

    def truncate_to(self, offset: int) -> Path | None:
        """Cut every byte at and after ``offset`` (a record boundary; kept aside in a
        ``truncated-*`` file, returned; None if nothing is cut); the epoch history and the
        state follow at once. Every truncation of a served log comes through here or
        ``restart_at``: nothing else has to notice one."""
        if offset == self.log.log_end:
            return None
        self._discard_snapshot()  # after any load in the worker thread (it may be reading the snapshot)
        aside = self.log.truncate_to(offset)
        self._after_cut(offset)
        return aside

    def restart_at(self, offset: int) -> Path | None:
        """Drop the whole log and restart it empty at ``offset`` (a slave whose log cannot
        continue its master's); the old bytes are kept aside (returned)."""
        self._discard_snapshot()
        aside = self.log.truncate_fully_and_start_at(offset)
        # The epoch history stays: it is the master's, adopted before the first fetch, and
        # names no offset of the bytes just dropped (the log was empty: nothing to cut).
        self._after_cut(-1)
        return aside

    def truncate_corrupt(self) -> tuple[int, int, Path | None] | None:
        """A replica's repair: cut the log at its first corrupt range (metaq/store/scrub.py,
        recovery; kept aside like any truncation) so the bytes are fetched again from the
        master. Returns ``(offset, bytes cut, aside file)``, or None if nothing is known
        corrupt. Only for a log that follows a master: a master's bytes exist nowhere else."""
        bad = self.log.first_corrupt_offset()
        if bad is None:
            return None
        removed = self.log.log_end - bad
        return bad, removed, self.truncate_to(bad)

    def repair_corrupt(self, start: int, data: bytes) -> bool:
        """A master's repair: a corrupt or missing range put back from a replica
        (``PartitionLog.repair_corrupt``); the state, which passed the range without reading
        it (or read it as stored), is then rebuilt from the log now that it is whole."""
        self._join_load()
        if not self.log.repair_corrupt(start, data):
            return False
        self._discard_snapshot()
        self.state = self._load()
        return True

    def cut_incomplete_tail(self, when: str) -> int | None:
        """Cut a batch whose records are not all in the log (never acked); return the cut offset.

        At start (a torn write) and at promotion (the part of a batch the old master had
        not finished replicating): a batch is never half-there when the log is appended to.
        """
        cut = self.state.incomplete_tail(self.log.log_end)
        if cut is None or self.log.mark_if_corrupt_record(cut):
            return None  # a flipped record in a sealed segment: repaired, never cut (the walk passes it)
        removed = self.log.log_end - cut
        aside = self.truncate_to(cut)
        log.warning("%s: cut an incomplete batch %s at %d: %d bytes moved aside to %s",
                    self.name, when, cut, removed, aside)
        return cut

    # --- the epoch history: its writers besides truncation -------------------------------------

    async def adopt_epochs(self, entries: list[tuple[int, int]]) -> bool:
        """A slave copying its master's epoch history of this partition (its bytes are the
        master's, verified by truncation first); True if ours changed. Saved off the event
        loop: a new slave starts many partitions at once, and their saves overlap."""
        if not self.epochs.replace_all(entries):
            return False
        await asyncio.to_thread(self.epochs.save)
        return True

    def _discard_snapshot(self) -> None:
        # Before the cut: a snapshot must never describe bytes that are gone. After a load still
        # running in a worker thread: nothing is cut under its walk.
        self._join_load()
        with self._owner.files:
            self.cuts += 1
            rebuild.discard_snapshot(self.directory)
        self.snapshot_position = -1

    def _after_cut(self, offset: int) -> None:
        """The log was cut at ``offset`` (-1: all of it): fix the epoch history and the state."""
        if offset >= 0:
            epochs = self.epochs
            before = list(epochs.entries)
            epochs.truncate_from_end(offset)  # no epoch may start past the log end
            if epochs.entries != before:
                epochs.save()
        if 0 <= offset and self.state.position <= offset:
            return  # a pure function of bytes that stay: still valid (no walk at promotion)
        log.info("%s: log truncated; transaction state rebuilt from the log", self.name)
        self.state = self._load()


class Partitions:
    """``get(topic, partition)``: the ``Partition`` of each open log of one broker."""

    def __init__(self, store: Any, *, leader: LeaderHost | None = None, max_batches: int = DEFAULT_MAX_BATCHES,
                 expiry_ms: int = DEFAULT_EXPIRY_MS) -> None:
        self.store = store  # MessageStoreManager: get_log, logs, partition_dir
        #: What a master's appends need beside the log (``Partition.append_as_leader``): the
        #: broker; None for a registry that only follows or reads (tools, tests).
        self.leader = leader
        self.max_batches = max_batches
        self.expiry_ms = expiry_ms
        self._partitions: dict[Key, Partition] = {}
        self._snapshots: asyncio.Task[None] | None = None
        #: Loads the state of a log first opened at run time (``Partition(in_background=True)``).
        self.loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="partition-load")
        #: Orders snapshot writes (a worker thread) and deletions before a cut (the loop), so
        #: a snapshot serialized before a cut is never written after it.
        self.files = threading.Lock()
        #: What dropped partitions had counted (``drop``): the broker's totals never go down.
        self.retired = PartitionCounters()

    def new_table(self) -> ProducerStateTable:
        return ProducerStateTable(self.max_batches, self.expiry_ms)

    def get(self, topic: str, partition: int, partition_log: Any = None) -> Partition:
        """The partition's owner; opened if its log is new to this registry (its state then
        loads in a worker thread: see ``serving``, ``Partition.state``). ``partition_log``: the
        store's ``get_log(topic, partition)``, when the caller has just asked it (a put)."""
        if partition_log is None:
            partition_log = self.store.get_log(topic, partition)
        owner = self._partitions.get((topic, partition))
        if owner is None or owner.log is not partition_log:  # a new log, or a new incarnation's
            old, owner = owner, Partition(self, (topic, partition), partition_log, in_background=True)
            self._partitions[(topic, partition)] = owner
            if old is not None:
                self._retire(old)  # after: a fetch it wakes that parks again parks on the new owner
        return owner

    # --- stats: each partition's counters, with it (metaq/server/stats.py : CountedPartitions) ----

    def counters(self, topic: str, partition: int) -> PartitionCounters:
        """The partition's counters (asked per request: an open owner at one lookup)."""
        owner = self._partitions.get((topic, partition)) or self.get(topic, partition)
        counters = owner.counters
        if counters is None:
            counters = owner.counters = PartitionCounters()
        return counters

    def counted(self) -> Iterator[tuple[Key, PartitionCounters]]:
        """Every open partition that counted something, with its counters."""
        return iter([(key, owner.counters) for key, owner in self._partitions.items() if owner.counters is not None])

    def reset_counters(self) -> None:
        for owner in self._partitions.values():
            owner.counters = None
        self.retired = PartitionCounters()

    # --- parked fetches: each partition's, with it (metaq/server/waiters.py : ParkingPartitions) ---

    def parking(self, topic: str, partition: int) -> ParkedFetches:
        owner = self._partitions.get((topic, partition)) or self.get(topic, partition)
        parked = owner.parked
        if parked is None:
            parked = owner.parked = ParkedFetches(owner.name)
        return parked

    def parked(self, topic: str, partition: int) -> ParkedFetches | None:
        owner = self._partitions.get((topic, partition))  # asked per append: one lookup, never an open
        return owner.parked if owner is not None else None

    def every_parked(self) -> Iterator[ParkedFetches]:
        return iter([owner.parked for owner in self._partitions.values() if owner.parked is not None])

    def replication(self, topic: str, partition: int) -> ReplicationRecord | None:
        """The partition's replication record (metaq/ha/record.py); None if its log is not open
        (a report or heartbeat naming a partition this broker does not serve opens nothing)."""
        owner = self._partitions.get((topic, partition))
        if owner is None:
            partition_log = self.store.open_log(topic, partition)
            if partition_log is None:
                return None
            owner = self.get(topic, partition, partition_log)
        return owner.replication

    def replications(self) -> Iterator[tuple[Key, ReplicationRecord]]:
        """Every open partition's replication record."""
        return iter([(key, owner.replication) for key, owner in self._partitions.items()])

    def serving(self, topic: str, partition: int, partition_log: Any = None) -> Partition:
        """The owner, for the put and fetch paths: ``PartitionLoading`` (503, retriable) while its
        state still loads in a worker thread, so the event loop never waits for that load.
        ``partition_log`` as for ``get``."""
        owner = self.get(topic, partition, partition_log)
        if not owner.ready:
            raise PartitionLoading(topic, partition)
        return owner

    def open_added(self) -> None:
        """After a topic change: open every configured partition with files on disk that is not
        open yet (a topic re-added, partitions added), its state loading in a worker thread at
        once rather than at its first put or fetch."""
        for topic, config in self.store.topics.items():
            for partition in range(config.num_partitions):
                if (topic, partition) not in self._partitions and self.store.has_log(topic, partition):
                    self.get(topic, partition)

    def serves(self, topic: str, partition: int) -> bool:
        """Whether this broker serves the partition now (a deleted topic's is gone)."""
        try:
            self.store.get_log(topic, partition)
        except LookupError:  # UnknownTopic, UnknownPartition
            return False
        return True

    def state(self, topic: str, partition: int) -> PartitionTxnState:
        """The partition's transaction state, at its log end (``PartitionLoading`` while it loads)."""
        return self.serving(topic, partition).state

    def owners(self) -> list[Partition]:
        """The owner of every open log, in key order (opened into this registry if new)."""
        return [self.get(*key) for key in sorted(self.store.logs())]

    def all(self) -> dict[Key, PartitionTxnState]:
        """The state of every open partition log (waiting for any still loading: the reconcile
        of a take-over must see every partition's transactions)."""
        return {owner.key: owner.state for owner in self.owners()}

    def batch_boundary(self, topic: str, partition: int, offset: int, committed: int) -> int:
        """The highest offset <= ``offset`` that is not inside a batch; ``committed`` if unknown.

        A sync master's committed offset goes through here (``SyncReplication``): the
        positions its slaves report are record boundaries, not batch boundaries.
        """
        owner = self.get(topic, partition)
        if not owner.ready:
            return committed  # unknown yet: the committed offset stays where it was
        return owner.state.committed_bound(offset, committed)

    def drop(self, keys: list[Key]) -> None:
        """Partitions no longer served (topic deleted or re-created): their producers,
        transactions, epoch history, replication record (slaves' positions, append history,
        the sync set's waiting puts, the slaves streaming it), stats counters and parked
        fetches never apply to another incarnation of the topic; they go with the owner, in
        one ``pop`` each (the fetches woken, the waiting puts ended, the streams closed)."""
        dropped = []
        with self.files:
            for key in keys:
                owner = self._partitions.pop(key, None)
                if owner is not None:
                    dropped.append(owner)
                    owner.cuts += 1  # a snapshot serialized before now is not written (``_write_all``)
        for owner in dropped:  # outside the lock: a woken fetch answers at once
            self._retire(owner)
            owner.replication.close()  # puts waiting for its slaves end (404)

    def _retire(self, owner: Partition) -> None:
        """An owner left the map: nothing is appended to it from here (``_append``); its stats
        row goes, its counts stay in the broker's totals (``retired``); the fetches parked on it
        wake and find its log gone (answered "unknown topic", or from the new log)."""
        owner.dropped = True
        if owner.counters is not None:
            add_counters(self.retired, owner.counters)
        if owner.parked is not None:
            owner.parked.wake(True)

    # --- epochs ----------------------------------------------------------------------------------

    async def assign_epoch(self, topics: dict[str, Any], epoch: int) -> int:
        """A new master's first step on its logs: every served partition of ``topics`` gets
        ``(epoch, log end)`` in its epoch history, durably, in one batch (a takeover of 10,000
        partitions must not cost 10,000 event-loop stalls). Returns how many histories changed.

        Invariants: epochs only grow (``EpochCache.assign`` refuses an older one); every
        partition's history names the epoch, fsynced, before this returns, and the caller
        acks as master in it only after that."""
        served = [(name, partition) for name, topic in topics.items() for partition in range(topic.num_partitions)]
        # Partitions without files yet are created as one batch off the event loop.
        await self.store.create_logs([(name, partition, 0) for name, partition in served])
        assigned = []
        for name, partition in served:
            owner = self.get(name, partition)
            # Before the epoch's start offset is recorded and before any put: a batch the old
            # master had only partly replicated to us was never acked; cut it, so no batch is
            # ever half in the log we now serve and extend.
            owner.cut_incomplete_tail("at promotion")
            if owner.epochs.assign(epoch, owner.log.log_end):
                assigned.append(owner.epochs)
        await asyncio.to_thread(save_all, assigned)  # every file and directory fsynced, one thread hop
        return len(assigned)

    async def adopt_epochs(self, topic: str, partition: int, entries: list[tuple[int, int]]) -> bool:
        """``Partition.adopt_epochs`` of one partition (a slave following its master)."""
        return await self.get(topic, partition).adopt_epochs(entries)

    # --- start -------------------------------------------------------------------------------

    def open_all(self) -> None:
        """At start, before serving: load every open log's state and cut torn batches."""
        for topic, partition in sorted(self.store.logs()):
            self.get(topic, partition).cut_incomplete_tail("at start")

    # --- snapshots -----------------------------------------------------------------------------

    def snapshot_all(self) -> None:
        """Write the snapshot of every state that moved since its last one (blocking: fsync)."""
        self._write_all(self._changed_snapshots())

    def _changed_snapshots(self) -> list[tuple[Partition, int, bytes]]:
        """(partition, its cuts, content) of each state that moved: serialized now, on the loop."""
        changed = []
        for owner in list(self._partitions.values()):
            if owner.refused or not owner.ready:
                continue
            if owner.state.position != owner.snapshot_position:
                changed.append((owner, owner.cuts, rebuild.snapshot_bytes(owner.state)))
                owner.snapshot_position = owner.state.position
        return changed

    def expire_producers(self) -> int:
        """Forget, in every state, the producers idle for ``expiry_ms``; how many.

        Idle by the log's clock (the newest batch timestamp the state has seen), not this
        broker's: replicas with the same bytes forget the same producers.
        """
        gone = 0
        for owner in list(self._partitions.values()):
            if owner.refused or not owner.ready:
                continue
            table = owner.state.producers
            log_clock = max((p.last_timestamp_ms for p in table.producers.values()), default=0)
            gone += len(table.expire(log_clock))
        return gone

    def start(self, interval_s: float = SNAPSHOT_INTERVAL_S) -> None:
        self._snapshots = asyncio.ensure_future(self._snapshot_loop(interval_s))

    async def _snapshot_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._snapshot_round()
            except Exception as exc:  # the loop must outlive one bad round; the next one tries again
                log.warning("transaction state snapshot failed (rebuilt from the log at start): %r", exc)

    async def _snapshot_round(self) -> None:
        gone = self.expire_producers()
        if gone:
            log.info("forgot %d producers idle for %d ms", gone, self.expiry_ms)
        # Serialized on the event loop (the states change there), written in a thread.
        bodies = self._changed_snapshots()
        await asyncio.to_thread(self._write_all, bodies)

    def _write_all(self, bodies: list[tuple[Partition, int, bytes]], workers: int = 1) -> None:
        def write(item: tuple[Partition, int, bytes]) -> None:
            owner, cuts, body = item
            if owner.cuts == cuts:  # else the log was cut since: this content may describe gone bytes
                rebuild.write_snapshot_bytes(owner.directory, body)

        if workers <= 1 or len(bodies) < 2:
            for item in bodies:
                with self.files:
                    write(item)
            return
        # At close nothing else writes or cuts: the lock is held once, and the files (each
        # fsynced) are written ``workers`` at a time, so a stop with thousands of changed
        # partitions takes seconds, not one fsync after another.
        with self.files, concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="snapshot") as pool:
            for _ in pool.map(write, bodies):
                pass

    async def stop(self) -> None:
        if self._snapshots is not None:
            self._snapshots.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._snapshots
            self._snapshots = None

    def close(self) -> None:
        """Before the logs close: snapshot every state (a restart then walks only what is new)."""
        try:
            self._write_all(self._changed_snapshots(), workers=CLOSE_SNAPSHOT_WORKERS)
        except OSError as exc:
            log.warning("transaction state snapshot at close failed (rebuilt from the log at start): %s", exc)
        for owner in self._partitions.values():
            owner.dropped = True  # its log closes next: nothing more is appended
        self._partitions.clear()
        self.loader.shutdown(wait=True)  # before the logs close: no load reads a closed log
