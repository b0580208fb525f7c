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
    stamp_msg_ids,
    valid_prefix,
    validate_batch,
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
    replication (``scan_valid``) now treat an impossible attribute block as damage."""
    from metaq.record import scan_valid

    damaged = bytearray(encode_record(b"\x00\x00\x00\x01"))
    damaged[19] ^= FLAG_BIT0
    assert scan_valid(damaged) == (0, 0) and valid_prefix(damaged) == 0
    good = encode_record(b"ok", "attr")
    assert scan_valid(good + damaged) == (len(good), 1)


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
