"""Per-partition idempotence state: the last N batches of every producer.

The table answers one question for every idempotent put, before anything is
appended: is this batch new, a retry of one already in the log (then the broker
re-acks it with the original offsets), out of order, or from a fenced epoch?

Rules (``check``), for a batch ``(producer id, epoch, first seq, count)``:

* unknown producer (never seen, or expired): NEW, whatever its sequence;
* epoch below the producer's current one: FENCED (a zombie producer);
* epoch above it: NEW only if the sequence starts at 0 (a new epoch restarts
  sequences), else OUT_OF_ORDER;
* same epoch, the exact sequence range of a cached batch: DUPLICATE with that
  batch's offsets; a range behind the newest batch but no longer cached:
  DUPLICATE without offsets (the broker acks it as a duplicate it cannot place);
* same epoch, first seq = newest last seq + 1 (31-bit wrap): NEW;
* anything else: OUT_OF_ORDER, with the sequence expected.

Invariant: the table is a pure function of the BATCH headers in the log
(``apply`` is the only writer, and it never refuses: the log is the truth).
So a slave that walks the replicated bytes, or a broker that restarts and
rebuilds from its snapshot plus the tail of its log, holds the same table as the
master that acked the batches; ``tests/unit/test_txn_producer_state.py`` checks
rebuild == incremental on random histories.

Bounds: at most ``max_batches`` batches per producer (the client must keep no
more batches in flight per partition), and ``expire`` drops producers whose last
batch is older than ``expiry_ms`` by the log's own timestamps.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from metaq.txn.control import MAX_SEQUENCE, NO_PRODUCER, Control, Kind

DEFAULT_MAX_BATCHES = 5
DEFAULT_EXPIRY_MS = 24 * 3600 * 1000
#: A sequence at most this far behind the newest one counts as an old retry, not a gap.
_BEHIND_WINDOW = 1 << 30


class Verdict(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"


class Decision(NamedTuple):
    verdict: Verdict
    #: DUPLICATE: where the original batch's records start and end (None once out of the cache).
    first_offset: int | None = None
    end_offset: int | None = None
    #: OUT_OF_ORDER: the sequence the broker expects next.
    expected_seq: int | None = None
    #: FENCED: the producer's current epoch.
    current_epoch: int | None = None


class BatchEntry(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int  # the first data record, just after the BATCH header
    end_offset: int
    timestamp_ms: int


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchEntry] = field(default_factory=deque)

    @property
    def last_timestamp_ms(self) -> int:
        return self.batches[-1].timestamp_ms if self.batches else 0


def next_seq(seq: int) -> int:
    return (seq + 1) & MAX_SEQUENCE


def _behind(seq: int, newest: int) -> bool:
    """Is ``seq`` at or before ``newest`` (within half the sequence space)?"""
    return (newest - seq) & MAX_SEQUENCE < _BEHIND_WINDOW


class ProducerStateTable:
    def __init__(self, max_batches: int = DEFAULT_MAX_BATCHES, expiry_ms: int = DEFAULT_EXPIRY_MS) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self.max_batches = max_batches
        self.expiry_ms = expiry_ms
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, record_count: int, fence_epoch: int = 0) -> Decision:
        """The verdict on a batch; ``fence_epoch``: the producer's newest epoch known beyond this
        partition (the master's fence), so one verdict decides whether the batch is a zombie's."""
        if not 0 <= first_seq <= MAX_SEQUENCE or record_count < 1:
            raise ValueError(f"bad sequence range: first {first_seq}, count {record_count}")
        entry = self.producers.get(producer_id)
        current = max(fence_epoch, entry.epoch if entry is not None else 0)
        if epoch < current:
            return Decision(Verdict.FENCED, current_epoch=current)
        if entry is None:
            return Decision(Verdict.NEW)
        if epoch > entry.epoch:
            return Decision(Verdict.NEW) if first_seq == 0 else Decision(Verdict.OUT_OF_ORDER, expected_seq=0)
        last_seq = (first_seq + record_count - 1) & MAX_SEQUENCE
        for batch in entry.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return Decision(Verdict.DUPLICATE, batch.first_offset, batch.end_offset)
        if not entry.batches:
            return Decision(Verdict.NEW) if first_seq == 0 else Decision(Verdict.OUT_OF_ORDER, expected_seq=0)
        newest = entry.batches[-1].last_seq
        if first_seq == next_seq(newest):
            return Decision(Verdict.NEW)
        if _behind(last_seq, newest) and _behind(first_seq, newest):
            return Decision(Verdict.DUPLICATE)
        return Decision(Verdict.OUT_OF_ORDER, expected_seq=next_seq(newest))

    def apply(self, control: Control, header_offset: int, header_size: int) -> None:
        """Record a BATCH header found (or just appended) at ``header_offset``."""
        if control.kind is not Kind.BATCH or control.producer_id == NO_PRODUCER:
            return
        entry = self.producers.get(control.producer_id)
        if entry is None or control.producer_epoch > entry.epoch:
            entry = self.producers[control.producer_id] = ProducerEntry(control.producer_epoch)
        elif control.producer_epoch < entry.epoch:
            return  # never acked (check fences it); ignored the same way on every replica
        first_offset = header_offset + header_size
        entry.batches.append(BatchEntry(control.first_seq, control.last_seq, first_offset,
                                        first_offset + control.data_bytes, control.timestamp_ms))
        while len(entry.batches) > self.max_batches:
            entry.batches.popleft()

    def expire(self, now_ms: int) -> list[int]:
        """Forget producers idle for longer than ``expiry_ms``; return their ids."""
        gone = [pid for pid, entry in self.producers.items() if entry.last_timestamp_ms + self.expiry_ms < now_ms]
        for pid in gone:
            del self.producers[pid]
        return gone

    def to_json(self) -> dict[str, Any]:
        return {str(pid): {"epoch": e.epoch, "batches": [list(b) for b in e.batches]}
                for pid, e in sorted(self.producers.items())}

    def load_json(self, data: dict[str, Any]) -> None:
        self.producers = {
            int(pid): ProducerEntry(int(e["epoch"]), deque(BatchEntry(*map(int, b)) for b in e["batches"][-self.max_batches:]))
            for pid, e in data.items()
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProducerStateTable) and self.to_json() == other.to_json()
