"""Per-partition transaction index: open transactions, the last stable offset, aborted spans.

Theory
------
A transaction's records sit in the partition log between other records, each
batch behind a BATCH header that names the transaction. The first such header
opens the transaction in this partition (BEGIN is implicit); a PREPARE marker
marks it prepared (still open); a COMMIT or ABORT marker closes it. The index
follows those control records in log order (``observe``) and keeps:

* ``open``: every open transaction with the offset of its first header and the
  byte spans of its batches;
* ``aborted``: the byte spans of every batch of every aborted transaction, so a
  reader can skip exactly those records wherever its fetch starts;
* ``outcomes``: the last ``max_outcomes`` decisions (commit or abort, and why),
  so a commit retried after a failover is answered from the log.

The last stable offset (LSO) is ``min(committed, position, first offset of the
earliest open transaction)``, lowered further by two rules about transactions the index
has seen closed (``closing`` keeps the recent ones, with their first offset, the end of
their last batch and the end of their marker):

* a transaction counts as open for a reader until its COMMIT or ABORT marker lies below
  the reader's bound (``committed``): the index follows the log to its end, past what
  readers may see, and a marker past ``committed`` may still be taken back;
* the LSO never cuts through a closed transaction: when it falls between such a
  transaction's first record and its last (another producer's transaction, still open,
  began between them), it moves back to that transaction's first record.

Consumers read only below the LSO, so they never see a record of a transaction that
may still abort, and a committed transaction's records in a partition become visible
together, when the LSO moves past all of them.
(``position`` is where the index's walk of the log stopped: bytes past it are not
accounted for yet, e.g. half a batch a slave has only partly fetched.)

Invariant (enforced here, tested on random interleavings): LSO <= first offset of
every open transaction, and of every closed one whose marker ends past ``committed``;
no transaction has records on both sides of the LSO. Like the producer table, the index is a pure function of
the control records in the log, so every replica derives the same one.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from metaq.txn.control import AbortReason, Control, Kind

DEFAULT_MAX_OUTCOMES = 10000


class Span(NamedTuple):
    start: int  # the BATCH header's offset
    end: int  # the end of the batch's last record


@dataclass
class OpenTransaction:
    txid: str
    first_offset: int
    producer_id: int
    producer_epoch: int
    spans: list[Span] = field(default_factory=list)
    prepared_at_ms: int | None = None
    timeout_s: int = 0
    #: The starter's tag from its PREPARE marker ("" unknown: not prepared, or an older marker).
    starter: str = ""

    @property
    def prepared(self) -> bool:
        return self.prepared_at_ms is not None


class Outcome(NamedTuple):
    kind: Kind  # COMMIT or ABORT
    reason: AbortReason | None
    marker_offset: int


class TransactionIndex:
    def __init__(self, max_outcomes: int = DEFAULT_MAX_OUTCOMES) -> None:
        self.max_outcomes = max_outcomes
        self.open: dict[str, OpenTransaction] = {}
        self.aborted: list[Span] = []
        self.outcomes: OrderedDict[str, Outcome] = OrderedDict()
        #: (marker end, first offset, end of its last batch) of the transactions closed most
        #: recently, in log order.
        self.closing: deque[tuple[int, int, int]] = deque(maxlen=max_outcomes)

    def observe(self, control: Control, offset: int, size: int) -> None:
        """Follow one control record of ``size`` bytes at ``offset`` (log order)."""
        txid = control.txid
        if not txid:
            return
        txn = self.open.get(txid)
        if control.kind is Kind.BATCH:
            if txn is None:
                txn = self.open[txid] = OpenTransaction(txid, offset, control.producer_id, control.producer_epoch)
                self.outcomes.pop(txid, None)  # the id is reused for a new transaction
            txn.spans.append(Span(offset, offset + size + control.data_bytes))
        elif txn is None:
            return  # a marker for a transaction with no records here: nothing to close
        elif control.kind is Kind.PREPARE:
            txn.prepared_at_ms, txn.timeout_s, txn.starter = control.timestamp_ms, control.timeout_s, control.starter
        else:
            del self.open[txid]
            aborted = control.kind is Kind.ABORT
            if aborted:
                for span in txn.spans:
                    bisect.insort(self.aborted, span)
            self.outcomes[txid] = Outcome(control.kind, control.reason if aborted else None, offset)
            self.closing.append((offset + size, txn.first_offset, txn.spans[-1].end))
            while len(self.outcomes) > self.max_outcomes:
                self.outcomes.popitem(last=False)

    def first_open_offset(self) -> int | None:
        return min((t.first_offset for t in self.open.values()), default=None)

    def last_stable_offset(self, committed: int, position: int) -> int:
        first_open = self.first_open_offset()
        bound = lso = min(committed, position)
        if first_open is not None:
            lso = min(lso, first_open)
        moved = True
        while moved:  # a step back can land inside an older closed transaction: until none is cut
            moved = False
            # Markers are in log order: only transactions whose marker ends past the LSO can reach over it.
            for marker_end, first, last_end in reversed(self.closing):
                if marker_end <= lso:
                    break
                if first < lso and (marker_end > bound or last_end > lso):
                    lso, moved = first, True
        return lso

    def aborted_between(self, start: int, end: int) -> list[Span]:
        """Aborted spans that overlap [start, end): what a fetch of that range must carry."""
        i = bisect.bisect_left(self.aborted, Span(start, start))
        # A span that starts before ``start`` may still reach into the range.
        if i > 0 and self.aborted[i - 1].end > start:
            i -= 1
        found = []
        while i < len(self.aborted) and self.aborted[i].start < end:
            if self.aborted[i].end > start:
                found.append(self.aborted[i])
            i += 1
        return found

    def prepared(self) -> list[OpenTransaction]:
        return [t for t in self.open.values() if t.prepared]

    def forget_before(self, log_start: int) -> None:
        """Retention removed bytes below ``log_start``: drop the aborted spans that ended there."""
        self.aborted = [s for s in self.aborted if s.end > log_start]

    def to_json(self) -> dict[str, Any]:
        return {
            "open": [[t.txid, t.first_offset, t.producer_id, t.producer_epoch, [list(s) for s in t.spans],
                      t.prepared_at_ms, t.timeout_s, t.starter] for t in self.open.values()],
            "aborted": [list(s) for s in self.aborted],
            "outcomes": [[txid, o.kind.value, None if o.reason is None else o.reason.value, o.marker_offset]
                         for txid, o in self.outcomes.items()],
            "closing": [list(c) for c in self.closing],
        }

    def load_json(self, data: dict[str, Any]) -> None:
        # A snapshot written before starters were recorded has 7 fields per open transaction.
        self.open = {
            txid: OpenTransaction(txid, first, pid, epoch, [Span(*s) for s in spans], prepared_at, timeout, *starter)
            for txid, first, pid, epoch, spans, prepared_at, timeout, *starter in data["open"]
        }
        self.aborted = [Span(*s) for s in data["aborted"]]
        self.outcomes = OrderedDict(
            (txid, Outcome(Kind(kind), None if reason is None else AbortReason(reason), at))
            for txid, kind, reason, at in data["outcomes"]
        )
        self.closing = deque((tuple(c) for c in data.get("closing", [])), maxlen=self.max_outcomes)  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransactionIndex) and self.to_json() == other.to_json()
