"""One partition's transaction state, rebuilt from its log, and the snapshot file that bounds the walk.

``PartitionTxnState`` holds the producer table and the transaction index of one
partition plus ``position``, the log offset up to which both have seen every
record. ``catch_up(read, end)`` walks [position, end) with ``record.walk_records``
and feeds every control record to both. The walk stops *before* a batch whose
records are not all below ``end`` (a BATCH header is appended together with its
records, so that is either the half of a batch a slave has fetched so far, or, at
start, a torn tail): ``position`` then stays at that header, the next call
resumes there, and ``incomplete_tail`` tells a starting broker to cut the log
back to it.

Snapshot: ``{partition dir}/txn-state-checkpoint``, JSON with a CRC, written
atomically (temporary file, fsync, rename). It records ``position`` and an
*anchor*: the offset, msg id and CRC of a record from which whole records run
exactly to ``position`` (the last record outside a batch, the header of the last
batch, or the first record of the last plain put, see ``passed_plain``). On load
the anchor must still be in the log and the records from it must end at
``position``, so a snapshot taken before an HA truncation cut the log (and the log
grew again past it) is refused instead of reused; the state is then rebuilt from
the log start. (The broker also deletes the snapshot before any truncation:
metaq/server/partitions.py, ``Partition.truncate_to``.)
"""

from __future__ import annotations

import bisect
import json
import logging
from pathlib import Path
from typing import Any, Callable

from metaq.record import HEADER, HEADER_SIZE, walk_records
from metaq.txn.batch_spans import BatchSpans
from metaq.txn.control import Control, ControlError, Kind, control_at, next_attribute_block
from metaq.txn.crcfile import read_crc_file, write_crc_file
from metaq.txn.index import TransactionIndex
from metaq.txn.producer_state import ProducerStateTable

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "txn-state-checkpoint"
_SNAPSHOT_VERSION = 1
Reader = Callable[[int, int], "bytes | memoryview"]


class PartitionTxnState:
    def __init__(self, producers: ProducerStateTable | None = None, index: TransactionIndex | None = None,
                 position: int = 0) -> None:
        self.producers = producers if producers is not None else ProducerStateTable()
        self.index = index if index is not None else TransactionIndex()
        self.position = position
        #: (offset, msg id, crc) of the last record below ``position``; None at a log start.
        self.anchor: tuple[int, int, int] | None = None
        #: The batches seen from ``position`` on (not in the snapshot, not part of ``==``:
        #: a cache for ``committed_bound``, which cannot tell below what it has seen).
        self.batches = BatchSpans(position)

    def catch_up(self, read: Reader, end: int, unreadable_end: Callable[[int], int | None] | None = None) -> int:
        """Follow every record in [position, end); return the new position.

        The records of a batch follow its header and are never control records (a
        put carrying one is refused), so the walk checks only the records outside
        batches: from a BATCH header it goes on at its batch's end, and the records
        between two that may be control records are passed in one step. Each byte is read
        and scanned once: the walk is linear in the bytes followed (a slave follows each
        fetch with it, on the event loop).

        ``unreadable_end(offset)``: where bytes that cannot be read from ``offset`` on end
        (a corrupt or missing range of the log, metaq/store/log.py), or None. The walk passes
        them (``pass_unreadable``) instead of stopping there for good.
        """
        while self.position < end:
            try:
                if self._pass_batch_at_position(read, end) or self._walk_from_position(read, end):
                    continue
            except ControlError as exc:
                # A marker a bit flip broke, in a range already known corrupt: passed with the
                # rest of it (the walk stands at that record: every record before it observed).
                if unreadable_end is None or exc.offset != self.position or unreadable_end(exc.offset) is None:
                    raise
            gap_end = unreadable_end(self.position) if unreadable_end is not None else None
            if gap_end is None or gap_end <= self.position:
                break
            self.pass_unreadable(gap_end)
        return self.position

    def pass_unreadable(self, end: int) -> None:
        """Go on at ``end`` (a segment's start: a record boundary) past bytes that cannot be read.

        What they held is unknown until a replica puts them back (through
        ``Partition.repair_corrupt``, which rebuilds this state from the log). Meanwhile
        no batch is known before ``end``: a committed offset does not move inside the range, it
        moves past it once a slave holds its end (so a slave can serve the bytes back).
        """
        log.warning("transaction state: bytes [%d, %d) cannot be read; passed until they are repaired",
                    self.position, end)
        self.position = end
        self.anchor = None  # a snapshot taken now does not fit at the next start: rebuilt there
        self.batches = BatchSpans(end)

    def _pass_batch_at_position(self, read: Reader, end: int) -> bool:
        """A whole batch starting at ``position``: pass it without reading its records (True)."""
        pos = self.position
        head = bytes(read(pos, HEADER_SIZE))
        if len(head) < HEADER_SIZE:
            return False
        length, crc, msg_id, _flag = HEADER.unpack(head)
        stop = pos + HEADER_SIZE + length
        if length < 0 or stop > end:
            return False
        record = bytes(read(pos, HEADER_SIZE + length))
        if len(record) < HEADER_SIZE + length:
            return False  # not all readable at once (a segment's end): the walk follows it
        try:
            control = control_at(record)
        except ControlError as exc:
            raise ControlError.at(pos, exc) from None
        if control is None or control.kind is not Kind.BATCH or stop + control.data_bytes > end:
            return False  # a marker (the walk follows it), or a batch not all here yet
        self._observe(control, pos, stop, (pos, msg_id, crc))
        return True

    def _walk_from_position(self, read: Reader, end: int) -> bool:
        """Follow records from ``position``, each chunk read once; True after passing a whole
        batch that reaches past the chunk read (walk again from its end).

        Within a chunk the walk goes on past a whole batch at once: restarting it there read
        and scanned the rest of the chunk again for every batch, so following a slave's fetch
        of N batches cost N times its records (seed 6003: 1,195 batches of a 314 KB log took
        0.4 s, on the event loop). Between control records, plain records are passed in one
        step (``next_attribute_block``), so a chunk costs its record boundaries and its control records.
        """
        for run in walk_records(read, self.position, end, boundaries_only=True):
            ends = run.ends
            assert ends is not None
            if not ends:
                return False
            data = run.data if isinstance(run.data, (bytes, bytearray)) else bytes(run.data)
            base, index = run.offset, 0  # the record at ``position`` is ``ends[index]``'s
            while index < len(ends):
                found = next_attribute_block(data, self.position - base)
                # Every record before the one holding ``found`` is plain: passed in one step.
                holder = len(ends) if found < 0 else bisect.bisect_right(ends, base + found, index)
                if holder > index:
                    last = ends[holder - 2] if holder >= 2 else base
                    _length, crc, msg_id, _flag = HEADER.unpack_from(data, last - base)
                    self._observe(None, last, ends[holder - 1], (last, msg_id, crc))
                    index = holder
                if index == len(ends):
                    break
                pos, stop = self.position, ends[index]
                at = pos - base
                try:
                    control = control_at(data, at)
                except ControlError as exc:
                    raise ControlError.at(pos, exc) from None
                if control is not None and control.kind is Kind.BATCH and stop + control.data_bytes > end:
                    return False  # the batch is not all here yet
                _length, crc, msg_id, _flag = HEADER.unpack_from(data, at)
                self._observe(control, pos, stop, (pos, msg_id, crc))
                if self.position > ends[-1]:
                    return True  # a batch reaching past this chunk: read again from its end
                # On past this record, or past its whole batch (its records are whole records of this chunk).
                index = bisect.bisect_right(ends, self.position, index)
                if ends[index - 1] != self.position:
                    return True  # not where a record of this chunk starts: read again from there
        return False

    def appended(self, offset: int, framed: bytes | bytearray | memoryview, header: Control | None = None) -> None:
        """The master appended ``framed`` (a BATCH header and its records, msg ids stamped) at ``offset``.

        The same result as ``catch_up`` over those bytes, without walking the records;
        ``header`` (``PutPlan.header``) saves decoding the header again.
        """
        if offset != self.position:
            raise ValueError(f"append at {offset}, but the state stands at {self.position}: catch up first")
        length, crc, msg_id, _flag = HEADER.unpack_from(framed, 0)
        control = header if header is not None else control_at(framed, 0)
        header_end = offset + HEADER_SIZE + length
        if control is None or control.kind is not Kind.BATCH or header_end + control.data_bytes != offset + len(framed):
            raise ValueError("appended bytes do not start with the BATCH header of exactly these records")
        self._observe(control, offset, header_end, (offset, msg_id, crc))

    def passed_plain(self, offset: int, end: int, first_record: tuple[int, int]) -> None:
        """The master appended whole records at [offset, end), none a control record (checked by the
        put handler with ``control.find_forged_control``): nothing to record but the new position.

        Costs nothing per record, unlike a walk; ``first_record`` is (msg id, CRC) of the first one,
        the snapshot's anchor.
        """
        if offset != self.position:
            raise ValueError(f"append at {offset}, but the state stands at {self.position}: catch up first")
        self.anchor = (offset, *first_record)
        self.position = end

    def _observe(self, control: Control | None, offset: int, stop: int, anchor: tuple[int, int, int]) -> None:
        """One record at [offset, stop): a BATCH header moves ``position`` past its whole batch."""
        if control is not None:
            self.producers.apply(control, offset, stop - offset)
            self.index.observe(control, offset, stop - offset)
        self.anchor = anchor
        if control is not None and control.kind is Kind.BATCH:
            self.position = stop + control.data_bytes
            self.batches.add(offset, self.position)
        else:
            self.position = stop

    def committed_bound(self, offset: int, committed: int) -> int:
        """Where a committed offset at ``committed`` may move towards ``offset`` without ending inside
        a batch (``BatchSpans.committed_bound``).

        Past ``position`` the state has not seen the bytes (the part of a batch a slave has
        fetched so far): ``position`` is the last boundary it can vouch for.
        """
        return self.batches.committed_bound(min(offset, self.position), committed)

    def incomplete_tail(self, log_end: int) -> int | None:
        """After ``catch_up(read, log_end)`` at start: the offset to cut a torn batch back to, or None."""
        return self.position if self.position < log_end else None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PartitionTxnState) and self.position == other.position
                and self.producers == other.producers and self.index == other.index)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def snapshot_bytes(state: PartitionTxnState) -> bytes:
    """The snapshot's content now (cheap; ``write_snapshot_bytes`` may then run in a thread)."""
    body = {"version": _SNAPSHOT_VERSION, "position": state.position, "anchor": state.anchor,
            "producers": state.producers.to_json(), "index": state.index.to_json()}
    return _canonical(body)


def write_snapshot_bytes(directory: Path, content: bytes) -> None:
    write_crc_file(directory / SNAPSHOT_FILE, content)


def write_snapshot(directory: Path, state: PartitionTxnState) -> None:
    write_snapshot_bytes(directory, snapshot_bytes(state))


def discard_snapshot(directory: Path) -> None:
    """Before an HA truncation cuts the log: the snapshot may describe bytes about to go."""
    (directory / SNAPSHOT_FILE).unlink(missing_ok=True)


def load_state(directory: Path, read: Reader, log_start: int, log_end: int,
               producers: Callable[[], ProducerStateTable] = ProducerStateTable,
               index: Callable[[], TransactionIndex] = TransactionIndex,
               unreadable_end: Callable[[int], int | None] | None = None) -> PartitionTxnState:
    """The state at ``log_end``: the snapshot if it still fits the log, then a walk of the rest.

    The caller cuts the log back to ``incomplete_tail(log_end)`` if that is not None.
    """
    state = PartitionTxnState(producers(), index(), log_start)
    snapshot = _read_snapshot(directory / SNAPSHOT_FILE)
    if snapshot is not None and _fits(snapshot, read, log_start, log_end):
        state.producers.load_json(snapshot["producers"])
        state.index.load_json(snapshot["index"])
        state.position = max(snapshot["position"], log_start)
        state.anchor = tuple(snapshot["anchor"]) if snapshot["anchor"] else None  # type: ignore[assignment]
        state.index.forget_before(log_start)
        state.batches = BatchSpans(state.position)  # the snapshot's batches are not listed
    state.catch_up(read, log_end, unreadable_end)
    return state


def _read_snapshot(path: Path) -> dict[str, Any] | None:
    try:
        raw = read_crc_file(path)
        if raw is None:
            return None
        body = json.loads(raw)
        if body.get("version") != _SNAPSHOT_VERSION:
            raise ValueError(f"version {body.get('version')!r}")
        return body
    except ValueError as exc:
        log.warning("%s: transaction snapshot ignored (%s); rebuilding from the log", path, exc)
        return None


def _fits(snapshot: dict[str, Any], read: Reader, log_start: int, log_end: int) -> bool:
    """Does the log still hold the record the snapshot ends with?"""
    position, anchor = snapshot["position"], snapshot["anchor"]
    if position > log_end:
        return False
    if anchor is None:
        return position <= log_start  # an empty state taken at a log start
    offset, msg_id, crc = anchor
    if offset < log_start:
        return True  # retention took the anchor's segment; nothing below log start can change
    header = bytes(read(offset, HEADER_SIZE))
    if len(header) < HEADER_SIZE:
        return False
    length, found_crc, found_id, _flag = HEADER.unpack(header)
    if (found_id, found_crc) != (msg_id, crc):
        return False
    # Whole records run from the anchor to the state's position (a batch's records after its header).
    reached = offset
    for run in walk_records(read, offset, position, boundaries_only=True):
        assert run.ends is not None
        reached = run.ends[-1] if run.ends else reached
    return reached == position
