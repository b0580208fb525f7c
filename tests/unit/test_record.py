"""The record format shared by the wire and the log."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.record import (
    HEADER_SIZE,
    RecordError,
    encode_batch,
    encode_record,
    iter_records,
    record_ends,
    buffer_reader,
    stamp_msg_ids,
    valid_prefix,
    validate_batch,
    walk_records,
)

messages = st.lists(st.tuples(st.binary(max_size=64), st.one_of(st.none(), st.text(max_size=8))), min_size=1, max_size=20)


@settings(max_examples=100, deadline=None)
@given(messages)
def test_batch_round_trip(msgs):
    buf = bytearray(encode_batch(msgs))
    assert validate_batch(buf, 1 << 20) == len(msgs)
    assert stamp_msg_ids(buf, 1000) == len(msgs)
    records = list(iter_records(buf, base_offset=500))
    assert [(r.data, r.attribute) for r in records] == msgs
    assert [r.msg_id for r in records] == list(range(1000, 1000 + len(msgs)))
    assert records[0].offset == 500
    assert record_ends(buf, 500)[-1] == 500 + len(buf)
    assert valid_prefix(buf) == len(buf)


@settings(max_examples=100, deadline=None)
@given(messages, st.data())
def test_valid_prefix_stops_at_a_cut_or_flip(msgs, data):
    buf = bytearray(encode_batch(msgs))
    ends = [0] + record_ends(buf)
    cut = data.draw(st.integers(min_value=0, max_value=len(buf)))
    assert valid_prefix(buf[:cut]) == max(e for e in ends if e <= cut)
    flip = data.draw(st.integers(min_value=0, max_value=len(buf) - 1))
    corrupted = bytearray(buf)
    corrupted[flip] ^= 0xFF
    prefix = valid_prefix(corrupted)
    # Everything before the record holding the flipped byte survives; nothing after it does.
    start_of_hit = max(e for e in ends if e <= flip)
    assert prefix <= start_of_hit or (8 <= flip - start_of_hit < 16)  # msg_id bytes are not covered by the CRC
    assert prefix in ends


def test_validate_batch_names_the_problem():
    good = encode_record(b"hello")
    with pytest.raises(RecordError, match="truncated header"):
        validate_batch(good + b"\x00\x00", 1024)
    with pytest.raises(RecordError, match="truncated payload"):
        validate_batch(good[:-1], 1024)
    with pytest.raises(RecordError, match="exceeds the limit"):
        validate_batch(encode_record(b"x" * 100), 50)
    bad_crc = bytearray(good)
    bad_crc[HEADER_SIZE] ^= 1
    with pytest.raises(RecordError, match="checksum mismatch"):
        validate_batch(bad_crc, 1024)
    bad_flag = bytearray(good)
    bad_flag[19] = 0x80
    with pytest.raises(RecordError, match="unknown flag"):
        validate_batch(bad_flag, 1024)


def test_attribute_block_is_checked():
    record = bytearray(encode_record(b"data", "attr"))
    record[HEADER_SIZE + 3] = 200  # attribute length beyond the payload
    # Fix the CRC so that only the attribute block is wrong.
    import struct, zlib

    struct.pack_into(">i", record, 4, zlib.crc32(record[HEADER_SIZE:]) & 0x7FFFFFFF)
    with pytest.raises(RecordError, match="attribute length"):
        validate_batch(record, 1024)


def test_iter_records_skips_partial_tail_and_reports_bad_crc():
    buf = encode_record(b"a") + encode_record(b"b")
    assert [r.data for r in iter_records(buf[:-1])] == [b"a"]
    broken = bytearray(buf)
    broken[-1] ^= 1
    with pytest.raises(RecordError, match="offset 21"):
        list(iter_records(broken))


def test_regression_flag_flip_to_impossible_attribute_block_is_not_valid():
    """Found by tests/unit/test_fuzz_store.py: the flag is outside the CRC, so a flipped
    attribute bit passed recovery's scan and then failed to decode. Recovery and
    replication (``walk_records``) now treat an impossible attribute block as damage."""
    damaged = bytearray(encode_record(b"\x00\x00\x00\x01"))
    damaged[19] ^= FLAG_BIT0
    assert walk(damaged) == [] and valid_prefix(damaged) == 0
    good = encode_record(b"ok", "attr")
    assert walk(good + damaged) == [(0, len(good), 1)]


def walk(buf: bytes | bytearray, base: int = 0, **options) -> list[tuple[int, int, int]]:
    """``(offset, end, count)`` of each run walk_records yields over ``buf``."""
    runs = walk_records(buffer_reader(buf, base), base, base + len(buf), **options)
    return [(run.offset, run.end, run.count) for run in runs]


@settings(max_examples=200, deadline=None)
@given(messages, st.data())
def test_walk_records_covers_exactly_the_valid_prefix_in_bounded_runs(msgs, data):
    buf = bytearray(encode_batch(msgs))
    if data.draw(st.booleans()):
        buf[data.draw(st.integers(min_value=0, max_value=len(buf) - 1))] ^= 0xFF
    walked = buf[: data.draw(st.integers(min_value=0, max_value=len(buf)))]
    chunk = data.draw(st.integers(min_value=1, max_value=len(buf) + 10))
    boundaries_only = data.draw(st.booleans())
    runs = list(walk_records(buffer_reader(walked, 1000), 1000, 1000 + len(walked), chunk_size=chunk,
                             boundaries_only=boundaries_only))
    # Boundaries only follow lengths; otherwise the walk stops where valid_prefix does.
    limit = len(walked) if boundaries_only else valid_prefix(walked)
    expected = [e for e in record_ends(walked, 1000) if e <= 1000 + limit]
    assert [r.offset for r in runs] == [1000] + [r.end for r in runs[:-1]] if runs else not expected
    assert (runs[-1].end if runs else 1000) == (expected[-1] if expected else 1000)
    assert sum(r.count for r in runs) == len(expected)
    for run in runs:
        # A run is at most one chunk, unless it is one record bigger than a chunk.
        assert len(run.data) <= chunk or run.count == 1
        assert run.end in expected
        assert run.ends == (expected[expected.index(run.end) - run.count + 1 : expected.index(run.end) + 1]
                            if boundaries_only else None)


def test_walk_records_boundaries_only_follows_lengths_and_lists_the_ends():
    first, second = encode_record(b"first"), encode_record(b"second")
    buf = bytearray(first + second)
    buf[HEADER_SIZE] ^= 1  # the first payload's CRC no longer matches
    assert walk(buf) == []
    (run,) = walk_records(buffer_reader(buf, 10), 10, 10 + len(buf), boundaries_only=True)
    assert (run.offset, run.end, run.count) == (10, 10 + len(buf), 2)
    assert run.ends == [10 + len(first), 10 + len(buf)]


def test_walk_records_reads_an_oversized_record_alone_and_follows_short_reads():
    big, small = encode_record(b"x" * 1000), encode_record(b"y")
    buf = small + big + small
    reads = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        # Like a log: a read never crosses the "segment" boundary after the big record.
        limit = len(small) + len(big) if offset < len(small) + len(big) else len(buf)
        return buf[offset : min(offset + length, limit)]

    runs = [(r.offset, r.end, r.count) for r in walk_records(read, 0, len(buf), chunk_size=100)]
    assert runs == [(0, len(small), 1), (len(small), len(small) + len(big), 1), (len(small) + len(big), len(buf), 1)]
    assert (len(small), len(big)) in reads, "the big record is read exactly, in one piece"
    # A record longer than max_message_size stops the walk instead of being read.
    assert walk(buf, chunk_size=100, max_message_size=500) == [(0, len(small), 1)]


FLAG_BIT0 = 1


def test_a_batch_with_a_non_utf8_attribute_is_refused_whole() -> None:
    import struct

    from metaq.record import FLAG_HAS_ATTRIBUTE, HEADER, RecordError, checksum, encode_batch, validate_batch

    attr = b"\xff\xfe"
    payload = struct.pack(">i", len(attr)) + attr + b"data"
    bad = HEADER.pack(len(payload), checksum(payload), 0, FLAG_HAS_ATTRIBUTE) + payload
    good = encode_batch([(b"a", "fine"), (b"b", None)])
    assert validate_batch(good, 1000) == 2
    with pytest.raises(RecordError, match="not UTF-8"):
        validate_batch(good + bad, 1000)
