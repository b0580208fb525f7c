"""The transaction state's walk of a log (``PartitionTxnState.catch_up``): what a slave runs
on its event loop over every fetch it appends, and a broker over a log at open.

The log here is a master's: plain puts (one with the control attribute's bytes in a
message body), idempotent and transactional batches, transaction markers. The master's
state is built the way its put path builds it (``appended``, ``passed_plain``); the
follower's by walking the bytes, at once and in pieces that end anywhere, mid-batch too.
"""

from __future__ import annotations

import struct

import pytest

import metaq.record
from metaq.record import HEADER, buffer_reader, encode_batch, record_ends
from metaq.txn.control import CONTROL_ATTRIBUTE, Kind, frame_batch, marker
from metaq.txn.rebuild import PartitionTxnState, Reader

#: The control attribute block as it stands in a control record, here inside an ordinary message's body.
ATTRIBUTE_BLOCK = struct.pack(">i", len(CONTROL_ATTRIBUTE.encode())) + CONTROL_ATTRIBUTE.encode()


class MasterLog:
    """A master's log and state, and where its top-level records (those outside batches) start."""

    def __init__(self) -> None:
        self.log = bytearray()
        self.state = PartitionTxnState()
        self.top_level: list[int] = []  # plain records, BATCH headers, markers
        self.batches: list[tuple[int, int]] = []

    def plain(self, *bodies: bytes) -> None:
        data = encode_batch([(body, None) for body in bodies])
        at = len(self.log)
        self.log += data
        self.top_level += [at] + record_ends(data, at)[:-1]
        _length, crc, msg_id, _flag = HEADER.unpack_from(data)
        self.state.passed_plain(at, len(self.log), (msg_id, crc))

    def batch(self, pid: int, seq: int, count: int, txid: str = "") -> None:
        body = encode_batch([(f"{pid}-{seq + i}".encode(), None) for i in range(count)])
        framed = frame_batch(bytearray(body), count, producer_id=pid, producer_epoch=0, first_seq=seq,
                             timestamp_ms=1_000 + len(self.log), txid=txid)
        at = len(self.log)
        self.log += framed
        self.top_level.append(at)
        self.batches.append((at, len(self.log)))
        self.state.appended(at, framed)

    def mark(self, kind: Kind, txid: str) -> None:
        at = len(self.log)
        self.log += marker(kind, txid, producer_id=9, producer_epoch=0, timestamp_ms=1_000 + at, timeout_s=30)
        self.top_level.append(at)
        self.state.catch_up(buffer_reader(self.log, 0), len(self.log))


def busy_master(rounds: int) -> MasterLog:
    """Rounds of a plain put, an idempotent batch and, every third, a committed transaction."""
    master = MasterLog()
    for n in range(rounds):
        master.plain(b"plain", b"looks like a control record: " + ATTRIBUTE_BLOCK if n % 4 == 0 else b"plain too")
        master.batch(1, 3 * n, 3)
        if n % 3 == 0:
            txid = f"TX:2:{n}"
            master.batch(2, n, 2, txid)
            master.mark(Kind.COMMIT, txid)
    return master


def counted_reader(log: bytearray) -> tuple[Reader, list[int]]:
    read, total = buffer_reader(log, 0), [0]

    def counted(offset: int, length: int) -> memoryview:
        data = read(offset, length)
        total[0] += len(data)
        return data

    return counted, total


def assert_follows(follower: PartitionTxnState, master: MasterLog) -> None:
    assert follower == master.state  # position, producers, transaction index
    assert list(follower.batches._starts) == [start for start, _ in master.batches]
    # The snapshot's anchor is a top-level record from which whole records run to the position.
    assert follower.anchor is not None and follower.anchor[0] == master.top_level[-1]


@pytest.fixture(params=[None, 1000], ids=["4 MiB chunks", "1000-byte chunks"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int | None:
    """The walk's read size: the default, and one that batches and markers straddle."""
    if request.param is not None:
        monkeypatch.setattr(metaq.record, "WALK_CHUNK", request.param)
    return request.param


def test_a_walk_reads_each_byte_of_a_log_of_many_batches_once(chunk: int | None) -> None:
    # A slave that fetched 1,900 batches between plain puts and markers follows them in one
    # call. The walk started again after each batch and read and scanned the rest of the chunk
    # each time: seed 6003's slaves spent seconds on their event loop catching up with a master
    # (0.4 s for 1,195 batches in 314 KB on a quiet machine), and held pre-login connections
    # past their bound meanwhile.
    master = busy_master(600)
    read, total = counted_reader(master.log)
    follower = PartitionTxnState()
    follower.catch_up(read, len(master.log))
    assert_follows(follower, master)
    assert total[0] <= 2 * len(master.log), f"read {total[0]:,} bytes to follow a log of {len(master.log):,}"


def test_a_walk_in_pieces_that_end_anywhere_stops_before_a_batch_not_all_here(chunk: int | None) -> None:
    master = busy_master(60)
    ends = record_ends(master.log)
    follower = PartitionTxnState()
    for end in ends[::7] + [len(master.log)]:  # a slave's fetches end at record boundaries, mid-batch too
        follower.catch_up(buffer_reader(master.log, 0), end)
        inside = [start for start, stop in master.batches if start < end < stop]
        assert follower.position == (inside[0] if inside else end)
    assert_follows(follower, master)
