"""The consumer-side filter: only committed, ordinary messages from fetched bytes.

Pure: it sees the bytes a fetch returned (starting at ``base_offset``) and the
aborted spans the broker sent with them (``TransactionIndex.aborted_between``),
and yields the records a read-committed consumer may deliver. It skips

* control records (batch headers, PREPARE, COMMIT, ABORT markers),
* every record inside an aborted span, wherever in the span the fetch starts,
* a partial record at the end (a fetch may end mid-record).

The broker never serves bytes past the last stable offset, so records of open
transactions never reach it; ``stable_end`` lets a caller enforce that too.
``next_offset`` is where to fetch next: past the skipped records as well.
"""

from __future__ import annotations

import bisect
from typing import Iterable, NamedTuple, Protocol, Sequence, TypeVar

from metaq.record import Record, iter_records
from metaq.txn.control import CONTROL_ATTRIBUTE


class Filtered(NamedTuple):
    records: list[Record]
    next_offset: int


def _sorted_spans(aborted: Iterable[Sequence[int]]) -> tuple[list[int], list[int]]:
    spans = sorted((int(s), int(e)) for s, e in aborted)
    return [s for s, _ in spans], [e for _, e in spans]


def committed_records(
    buf: bytes | bytearray | memoryview,
    base_offset: int,
    aborted: Iterable[Sequence[int]] = (),
    stable_end: int | None = None,
    verify: bool = True,
) -> Filtered:
    starts, ends = _sorted_spans(aborted)
    records: list[Record] = []
    next_offset = base_offset
    for record in iter_records(buf, base_offset, verify=verify):
        end = record.offset + record.size
        if stable_end is not None and end > stable_end:
            break
        next_offset = end
        if record.attribute == CONTROL_ATTRIBUTE:
            continue
        i = bisect.bisect_right(starts, record.offset) - 1
        # Spans never overlap (each is one batch), so only the last one starting at or before can hold it.
        if i >= 0 and record.offset < ends[i]:
            continue
        records.append(record)
    return Filtered(records, next_offset)


class VisibleRecords:
    """The per-record form of ``committed_records`` for readers that decode records themselves.

    The client consumer and the Spark source decode a fetched range column-wise
    (``record.decode_columns``); they ask ``visible(offset, attribute)`` of each record
    instead: False for a control record and for a record inside an aborted span.
    ``add`` merges the spans of a later fetch reply (spans are absolute offsets).
    """

    def __init__(self, aborted: Iterable[Sequence[int]] = ()) -> None:
        self._spans: set[tuple[int, int]] = set()
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.add(aborted)

    def add(self, aborted: Iterable[Sequence[int]]) -> None:
        new = {(int(s), int(e)) for s, e in aborted} - self._spans
        if new:
            self._spans |= new
            self.starts, self.ends = _sorted_spans(self._spans)

    def forget_before(self, offset: int) -> None:
        """Spans wholly below ``offset`` can hide nothing a reader will still decode."""
        if self.ends and self.ends[0] <= offset:
            self._spans = {span for span in self._spans if span[1] > offset}
            self.starts, self.ends = _sorted_spans(self._spans)

    def visible(self, offset: int, attribute: str | None) -> bool:
        if attribute == CONTROL_ATTRIBUTE:
            return False
        i = bisect.bisect_right(self.starts, offset) - 1
        return not (i >= 0 and offset < self.ends[i])


class _Decoded(Protocol):
    @property
    def offset(self) -> int | None: ...

    @property
    def attribute(self) -> str | None: ...


M = TypeVar("M", bound=_Decoded)


def drop_aborted(messages: list[M], aborted: Iterable[Sequence[int]]) -> list[M]:
    """The decoded messages (a fetch reply's, with its ``aborted`` spans) a read-committed reader delivers."""
    spans = list(aborted)
    if not spans:
        return messages
    visible = VisibleRecords(spans)
    return [m for m in messages if visible.visible(m.offset, m.attribute)]  # type: ignore[arg-type]
