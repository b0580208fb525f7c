"""Every partition's transaction state on this broker (master or slave): the registry.

One ``PartitionTxnState`` (metaq/txn/rebuild.py: the producer dedup table, the
transaction index and ``position``) per partition log, loaded on first use from
its snapshot plus a walk of the rest of the log, and kept caught up with the log:

* the master's put path records each idempotent batch it appends (``appended``)
  and each plain put (``note_append``);
* a slave follows every replica append (``note_append``, called by the replica);
* at start, and at promotion, a batch whose records are not all in the log (a torn
  write, or the half of a batch a slave had fetched when its master died) is cut
  off (``cut_incomplete_tail``) before anything is served or appended;
* a truncation of the log (HA rejoin, a slave reset) is seen through the log's
  ``truncations`` counter: the snapshot is discarded and the state rebuilt from the
  log, because the bytes it had seen may be gone;
* snapshots are written on close and every ``SNAPSHOT_INTERVAL_S``; each round first
  forgets the producers idle for ``producerExpiryMs`` (``expire_producers``);
* a sync master's committed offset is moved down to a batch boundary here
  (``batch_boundary``, from the batches each state has seen), so readers never get
  part of a batch that is not acked.

Invariant (kept by ``partition``, which every reader goes through): a state's
``position`` is at a batch boundary and <= its log's end, and the state is a pure
function of the log bytes below ``position`` (but for the idle producers forgotten,
which is judged by the newest batch timestamp in those bytes, never the wall clock, so
every replica forgets the same ones once it has read as far). Master and slaves hold byte-identical
logs, so they derive the same state, and a promoted slave knows every batch its
master acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..record import HEADER
from ..store.refused import RefusedLog
from ..txn import rebuild
from ..txn.control import may_hold_control
from ..txn.index import TransactionIndex
from ..txn.producer_state import DEFAULT_EXPIRY_MS, DEFAULT_MAX_BATCHES, ProducerStateTable
from ..txn.rebuild import PartitionTxnState

log = logging.getLogger(__name__)

#: How often the snapshots of the states that moved are rewritten (bounds the walk at a restart).
SNAPSHOT_INTERVAL_S = 60.0
Key = tuple[str, int]


@dataclass
class _Entry:
    state: PartitionTxnState
    log: Any  # PartitionLog | RefusedLog: the log object the state was derived from
    truncations: int  # log.truncations when the state was derived
    snapshot_position: int = -1  # position of the last snapshot written (-1: none)
    cuts: int = 0  # truncations announced (before_truncate): a snapshot serialized before one is stale


class TxnStates:
    """``partition(topic, partition)`` and ``all()``: the per-partition states of one broker."""

    def __init__(self, store: Any, *, max_batches: int = DEFAULT_MAX_BATCHES, expiry_ms: int = DEFAULT_EXPIRY_MS) -> None:
        self.store = store  # MessageStoreManager: get_log, logs, partition_dir
        self.max_batches = max_batches
        self.expiry_ms = expiry_ms
        self._entries: dict[Key, _Entry] = {}
        self._snapshots: asyncio.Task[None] | None = None
        #: Orders snapshot writes (a worker thread) and deletions before a cut (the loop), so
        #: a snapshot serialized before a cut is never written after it.
        self._files = threading.Lock()

    # --- the API ---------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> PartitionTxnState:
        """The partition's state, caught up to its log end (loaded, or rebuilt after a truncation)."""
        partition_log = self.store.get_log(topic, partition)
        entry = self._entries.get((topic, partition))
        if entry is None or entry.log is not partition_log or entry.truncations != partition_log.truncations:
            entry = self._load(topic, partition, partition_log, rebuilt=entry is not None)
        elif entry.state.position < partition_log.log_end:
            entry.state.catch_up(partition_log.read_as_stored, partition_log.log_end)
        return entry.state

    def all(self) -> dict[Key, PartitionTxnState]:
        """The state of every open partition log, each caught up."""
        return {key: self.partition(*key) for key in sorted(self.store.logs())}

    # --- the master's put path ----------------------------------------------------------------

    def note_append(self, topic: str, partition: int, offset: int, data: bytes | bytearray | memoryview,
                    end: int | None = None) -> None:
        """Whole records ``data`` were appended at ``offset`` (a plain put, or a replica append).

        Without a control record among them (one substring search) the state just moves
        to their end; else it follows them (``partition``'s catch-up).
        """
        end = offset + len(data) if end is None else end
        state = self.partition_if_loaded(topic, partition)
        if state is not None and state.position == offset and not may_hold_control(data):
            _length, crc, msg_id, _flag = HEADER.unpack_from(data, 0)
            state.passed_plain(offset, end, (msg_id, crc))
        else:
            self.partition(topic, partition)

    # --- the sync master's committed offset ---------------------------------------------------

    def batch_boundary(self, topic: str, partition: int, offset: int, committed: int) -> int:
        """The highest offset <= ``offset`` that is not inside a batch; ``committed`` if unknown.

        A sync master's committed offset goes through here (``SyncReplication``): the
        positions its slaves report are record boundaries, not batch boundaries.
        """
        return self.partition(topic, partition).committed_bound(offset, committed)

    def partition_if_loaded(self, topic: str, partition: int) -> PartitionTxnState | None:
        entry = self._entries.get((topic, partition))
        if entry is None or entry.truncations != entry.log.truncations:
            return None
        return entry.state

    def forget(self, keys: list[Key]) -> None:
        """Partitions no longer served (topic deleted or re-created): their producers and
        transactions never apply to another incarnation of the topic."""
        with self._files:
            for key in keys:
                entry = self._entries.pop(key, None)
                if entry is not None:
                    entry.cuts += 1  # a snapshot serialized before now is not written (``_write_all``)

    # --- start and promotion --------------------------------------------------------------------

    def open_all(self) -> None:
        """At start, before serving: load every open log's state and cut torn batches."""
        for topic, partition in sorted(self.store.logs()):
            self.cut_incomplete_tail(topic, partition, "at start")

    def cut_incomplete_tail(self, topic: str, partition: int, when: str) -> int | None:
        """Cut a batch whose records are not all in the log (never acked); return the cut offset.

        At start (a torn write) and at promotion (the part of a batch the old master had
        not finished replicating): a batch is never half-there when the log is appended to.
        The removed bytes are kept aside by ``truncate_to`` (``truncated-*`` file).
        """
        state = self.partition(topic, partition)
        partition_log = self.store.get_log(topic, partition)
        cut = state.incomplete_tail(partition_log.log_end)
        if cut is None:
            return None
        removed = partition_log.log_end - cut
        aside = partition_log.truncate_to(cut)
        log.warning("%s-%d: cut an incomplete batch %s at %d: %d bytes moved aside to %s",
                    topic, partition, when, cut, removed, aside)
        return cut

    # --- loading and snapshots --------------------------------------------------------------------

    def _dir(self, topic: str, partition: int) -> Path:
        return Path(self.store.partition_dir(topic, partition))

    def _new_table(self) -> ProducerStateTable:
        return ProducerStateTable(self.max_batches, self.expiry_ms)

    def _load(self, topic: str, partition: int, partition_log: Any, rebuilt: bool) -> _Entry:
        directory = self._dir(topic, partition)
        if isinstance(partition_log, RefusedLog):  # no bytes to derive anything from
            state = PartitionTxnState(self._new_table(), TransactionIndex(), partition_log.log_end)
        else:
            if rebuilt:
                # The log was cut under the state: its snapshot may describe bytes that are gone.
                rebuild.discard_snapshot(directory)
                log.info("%s-%d: log truncated; transaction state rebuilt from the log", topic, partition)
            state = rebuild.load_state(directory, partition_log.read_as_stored, partition_log.min_offset,
                                       partition_log.log_end, producers=self._new_table)
        entry = _Entry(state, partition_log, partition_log.truncations)
        if not isinstance(partition_log, RefusedLog):
            partition_log.before_truncate = lambda offset: self._before_truncate(entry, directory, offset)
        self._entries[(topic, partition)] = entry
        return entry

    def _before_truncate(self, entry: _Entry, directory: Path, offset: int) -> None:
        """The log is about to be cut at ``offset`` (-1: all of it).

        The snapshot goes first: it must never describe bytes that are gone (a crash between
        the cut and the rebuild then finds none, and walks the log). A state that has seen
        nothing past the cut stays valid (a pure function of bytes that stay): it is marked
        as knowing this truncation, so ``partition`` does not rebuild it (no walk of the
        whole log at promotion); any other is rebuilt on its next use.
        """
        with self._files:
            entry.cuts += 1
            rebuild.discard_snapshot(directory)
        if 0 <= offset and entry.state.position <= offset and entry.truncations == entry.log.truncations:
            entry.truncations += 1  # the log's count moves to this right after the cut
            entry.snapshot_position = -1

    def snapshot_all(self) -> None:
        """Write the snapshot of every state that moved since its last one (blocking: fsync)."""
        self._write_all(self._changed_snapshots())

    def _changed_snapshots(self) -> list[tuple[_Entry, int, Path, bytes]]:
        """(entry, its cuts, directory, content) of each state that moved: serialized now, on the loop."""
        changed = []
        for (topic, partition), entry in list(self._entries.items()):
            if isinstance(entry.log, RefusedLog) or entry.truncations != entry.log.truncations:
                continue
            if entry.state.position != entry.snapshot_position:
                changed.append((entry, entry.cuts, self._dir(topic, partition), rebuild.snapshot_bytes(entry.state)))
                entry.snapshot_position = entry.state.position
        return changed

    def expire_producers(self) -> int:
        """Forget, in every loaded state, the producers idle for ``expiry_ms``; how many.

        Idle by the log's clock (the newest batch timestamp the state has seen), not this
        broker's: replicas with the same bytes forget the same producers.
        """
        gone = 0
        for entry in list(self._entries.values()):
            if isinstance(entry.log, RefusedLog) or entry.truncations != entry.log.truncations:
                continue
            table = entry.state.producers
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

    def _write_all(self, bodies: list[tuple[_Entry, int, Path, bytes]]) -> None:
        for entry, cuts, directory, body in bodies:
            with self._files:
                if entry.cuts == cuts:  # else the log was cut since: this content may describe gone bytes
                    rebuild.write_snapshot_bytes(directory, body)

    async def stop(self) -> None:
        if self._snapshots is not None:
            self._snapshots.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._snapshots
            self._snapshots = None

    def close(self) -> None:
        """Before the logs close: snapshot every state (a restart then walks only what is new)."""
        try:
            self.snapshot_all()
        except OSError as exc:
            log.warning("transaction state snapshot at close failed (rebuilt from the log at start): %s", exc)
        self._entries.clear()

