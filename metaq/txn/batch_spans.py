"""Where the recent batches lie in a partition log, so a read bound never cuts one.

An idempotent or transactional put is appended as one *batch*: a BATCH header
followed by its records. A slave's replica fetch, and the position reports it
sends between pieces of a large reply, end at record boundaries, which may lie
inside such a batch. A sync master that took such a position as its committed
offset would let consumers read the first records of a batch it has not acked;
if it then died, the new master would cut that half batch (it was never acked)
and the producer's resend would store it again: those consumers would have read
records that were taken back, and would read them twice.

``BatchSpans`` keeps the ``[start, end)`` of the batches a partition's state has
seen (in log order, so sorted and disjoint) and answers ``boundary_at_or_below``:
the highest offset at or below a given one that is not strictly inside a batch;
``committed_bound`` is the question a sync master asks before it moves its
committed offset (metaq/ha/sync_set.py).

Invariant (kept by ``add``, ``forget_ending_by`` and the cap): every offset
strictly inside a batch that ends past ``known_from`` is strictly inside a listed
span, every listed span starts where a batch starts, and ``known_from`` is itself
a batch boundary. An offset below ``known_from`` may lie inside a batch that is no
longer listed: the answer is then ``None`` ("cannot tell"), and the caller keeps
the bound it already has. Dropped are only the batches that a caller's committed
offset has passed (no later question is about them). Past ``max_spans`` the
spans are coarsened instead, the shorter pairs of neighbouring spans merged into
one: an offset in between then gets the first one's start, a lower but still safe bound
(a broker that never asks, such as an async master or a slave, stays bounded;
``known_from`` does not move, so even more than ``max_spans`` batches appended
during one flush never leave a sync master's committed offset unable to move).

Arrays of 64-bit ints: 16 bytes a batch, nothing at all for a log of plain puts.
"""

from __future__ import annotations

import bisect
from array import array

#: At most this many spans are listed (coarsened past it).
DEFAULT_MAX_SPANS = 2048


class BatchSpans:
    def __init__(self, known_from: int = 0, max_spans: int = DEFAULT_MAX_SPANS) -> None:
        if max_spans < 2:
            raise ValueError(f"max_spans must be at least 2, got {max_spans}")
        self.max_spans = max_spans
        #: Every batch ending past this offset is listed (the state's position when it
        #: started: it knows nothing of the batches below).
        self.known_from = known_from
        self._starts = array("q")
        self._ends = array("q")

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: int, end: int) -> None:
        """A batch at [start, end), after every batch already listed (log order)."""
        if self._ends and start < self._ends[-1]:
            raise ValueError(f"batch at {start} starts before the end of the last one ({self._ends[-1]})")
        self._starts.append(start)
        self._ends.append(end)
        if len(self._starts) > self.max_spans:
            self._coarsen()

    def boundary_at_or_below(self, offset: int) -> int | None:
        """``offset`` if no batch strictly contains it, else that batch's start; None when unknown."""
        if offset < self.known_from:
            return None
        i = bisect.bisect_left(self._starts, offset) - 1  # the last batch starting before ``offset``
        if i >= 0 and self._ends[i] > offset:
            return self._starts[i]
        return offset

    def committed_bound(self, offset: int, committed: int) -> int:
        """Where a committed offset at ``committed`` may move towards ``offset``: the boundary at or
        below ``offset``, or ``committed`` itself (no move) when that cannot be told.

        Committed offsets never decrease, so the batches ending by ``committed`` are dropped first.
        """
        if not self._starts and offset >= self.known_from:
            return offset  # no batch since what it knows (a partition of plain puts): nothing to look up
        self.forget_ending_by(committed)
        boundary = self.boundary_at_or_below(offset)
        return committed if boundary is None else boundary

    def forget_ending_by(self, offset: int) -> None:
        """Drop the batches that end at or before ``offset`` (a committed offset passed them)."""
        self._drop(bisect.bisect_right(self._ends, offset))

    def _coarsen(self) -> None:
        """Merge neighbouring spans, pair by pair, where the merged span is no longer than the
        median pair: the shortest go first, so no region's spans grow much coarser than the rest
        (at least one pair merges)."""
        pairs = range(0, len(self._starts) - 1, 2)
        lengths = sorted(self._ends[i + 1] - self._starts[i] for i in pairs)
        threshold = lengths[(len(lengths) - 1) // 2]
        starts, ends = array("q"), array("q")
        i = 0
        while i < len(self._starts):
            if i % 2 == 0 and i + 1 < len(self._starts) and self._ends[i + 1] - self._starts[i] <= threshold:
                starts.append(self._starts[i])
                ends.append(self._ends[i + 1])
                i += 2
            else:
                starts.append(self._starts[i])
                ends.append(self._ends[i])
                i += 1
        self._starts, self._ends = starts, ends

    def _drop(self, count: int) -> None:
        if count <= 0:
            return
        self.known_from = max(self.known_from, self._ends[count - 1])
        del self._starts[:count]
        del self._ends[:count]
