"""Message ids: MetaQ's snowflake layout, made safe against clocks that go backwards.

Layout (MetaQ's ``IdWorker``)::

    (ms - EPOCH) << 22 | broker_id << 12 | seq12

Ids must be unique and increasing per broker group across restarts and failovers,
while the wall clock can step back (NTP) and a new master's clock can be behind the
old one's. So the timestamp part is a *logical* clock: ``ts = max(now, last_ts)``, it
starts above the largest id found in the logs (``floor``), and it moves one tick ahead
of the wall clock when the 12-bit sequence runs out. The timestamp in an id is then
"at least this late", which is all consumers use it for.
"""

from __future__ import annotations

import time
from typing import Callable

EPOCH = 1303895660503
_TS_SHIFT = 22
_BROKER_SHIFT = 12
SEQ_BITS = 12
MAX_BATCH = 1 << SEQ_BITS  # 4096 ids share one tick
MAX_BROKER_ID = (1 << (_TS_SHIFT - _BROKER_SHIFT)) - 1  # 1023


def msg_id_timestamp_ms(msg_id: int) -> int:
    """Wall-clock milliseconds encoded in an id (a lower bound once the logical clock ran ahead)."""
    return (msg_id >> _TS_SHIFT) + EPOCH


def msg_id_broker(msg_id: int) -> int:
    return (msg_id >> _BROKER_SHIFT) & MAX_BROKER_ID


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MsgIdGenerator:
    """Allocates contiguous runs of ids. Not thread-safe: used on the event-loop thread."""

    def __init__(self, broker_id: int, floor: int = 0, clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        if not 0 <= broker_id <= MAX_BROKER_ID:
            raise ValueError(f"broker_id must be in [0, {MAX_BROKER_ID}], got {broker_id}")
        if floor < 0:
            raise ValueError(f"floor must be >= 0, got {floor}")
        self.broker_id = broker_id
        self._clock_ms = clock_ms
        # (_ts, _seq) is the next free slot; every id handed out is below it.
        self._ts, self._seq = self._first_slot_above(floor)

    def _make(self, ts: int, seq: int) -> int:
        return ts << _TS_SHIFT | self.broker_id << _BROKER_SHIFT | seq

    def _first_slot_above(self, floor: int) -> tuple[int, int]:
        """The smallest (ts, seq) whose id is > ``floor`` (floor may carry another broker id)."""
        ts = floor >> _TS_SHIFT
        if self._make(ts, 0) > floor:
            return ts, 0
        floor_seq = floor & (MAX_BATCH - 1)
        if msg_id_broker(floor) == self.broker_id and floor_seq + 1 < MAX_BATCH:
            return ts, floor_seq + 1
        return ts + 1, 0

    def allocate(self, n: int = 1) -> int:
        """Reserve ``n`` consecutive ids and return the first; all exceed every earlier id."""
        if not 1 <= n <= MAX_BATCH:
            raise ValueError(f"can allocate 1 to {MAX_BATCH} ids at once, got {n}")
        now = self._clock_ms() - EPOCH
        if now > self._ts:
            self._ts, self._seq = now, 0
        if self._seq + n > MAX_BATCH:
            # The run must not carry into the broker bits: take the next tick, even if
            # it is ahead of the wall clock.
            self._ts, self._seq = self._ts + 1, 0
        first = self._make(self._ts, self._seq)
        self._seq += n
        return first
