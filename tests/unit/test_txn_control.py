"""The control-record codec (metaq/txn/control.py): exact bytes, round trips, refusals."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.record import HEADER_SIZE, encode_batch, iter_records, valid_prefix, validate_batch
from metaq.txn.control import (
    CONTROL_ATTRIBUTE, AbortReason, Control, ControlError, Kind, control_at, control_of, decode_body,
    encode_body, encode_control, find_forged_control, frame_batch, is_control, marker,
)


def test_a_batch_header_has_the_documented_bytes() -> None:
    body = encode_body(Control(Kind.BATCH, 7, 2, 1000, "", first_seq=5, record_count=3, data_bytes=90))
    assert body == struct.pack(">BBqhqH", 1, 1, 7, 2, 1000, 0) + struct.pack(">iii", 5, 3, 90)
    record = encode_control(Control(Kind.BATCH, 7, 2, 1000, "", 5, 3, 90))
    length, _crc, msg_id, flag = struct.unpack_from(">iiqi", record)
    assert (flag, msg_id, length) == (1, 0, len(record) - HEADER_SIZE)
    assert record[HEADER_SIZE:HEADER_SIZE + 4 + 14] == struct.pack(">i", 14) + b"\x00metaq.control"
    assert record[HEADER_SIZE + 18:] == body


def test_markers_carry_their_kind_specific_field() -> None:
    prepare = marker(Kind.PREPARE, "XID:1:ab:cd", producer_id=1, producer_epoch=0, timestamp_ms=9, timeout_s=30)
    abort = marker(Kind.ABORT, "TX:1:1", producer_id=1, producer_epoch=0, timestamp_ms=9, reason=AbortReason.HEURISTIC)
    assert prepare.endswith(struct.pack(">i", 30)) and abort.endswith(b"\x02")
    assert control_at(prepare).timeout_s == 30 and control_at(abort).reason is AbortReason.HEURISTIC


def test_control_records_are_valid_metaq_records_that_every_reader_accepts() -> None:
    log = frame_batch(bytearray(encode_batch([(b"a", None), (b"b", "tag")])), 2, producer_id=1,
                      producer_epoch=0, first_seq=0, timestamp_ms=1, txid="TX:1:0")
    log += marker(Kind.COMMIT, "TX:1:0", producer_id=1, producer_epoch=0, timestamp_ms=2)
    assert validate_batch(log, 1 << 20) == 4 and valid_prefix(log) == len(log)
    records = list(iter_records(log))
    assert [r.attribute == CONTROL_ATTRIBUTE for r in records] == [True, False, False, True]
    assert [is_control(log, r.offset) for r in records] == [True, False, False, True]
    assert control_of(records[0]).data_bytes == len(log) - records[0].size - records[3].size
    assert control_of(records[1]) is None


def test_an_ordinary_attribute_is_not_mistaken_for_the_mark() -> None:
    for attr in ("metaq.control", "\x00metaq.contro", "\x00metaq.controlX", ""):
        assert not is_control(encode_batch([(b"x" * 40, attr)]))


@given(
    kind=st.sampled_from(list(Kind)), pid=st.integers(-1, 2**63 - 1), epoch=st.integers(0, 2**15 - 1),
    ts=st.integers(0, 2**62), txid=st.text(max_size=40), seq=st.integers(0, 2**31 - 1),
    count=st.integers(1, 4096), size=st.integers(0, 2**31 - 1), timeout=st.integers(0, 2**31 - 1),
    reason=st.sampled_from(list(AbortReason)), starter=st.text(max_size=60),
)
def test_every_body_round_trips(kind, pid, epoch, ts, txid, seq, count, size, timeout, reason, starter) -> None:
    fields = {Kind.BATCH: dict(first_seq=seq, record_count=count, data_bytes=size),
              Kind.PREPARE: dict(timeout_s=timeout, starter=starter), Kind.ABORT: dict(reason=reason)}.get(kind, {})
    control = Control(kind, pid, epoch, ts, txid, **fields)
    assert decode_body(encode_body(control)) == control


def test_a_prepare_marker_carries_its_starter_and_an_old_one_decodes_as_unknown() -> None:
    tag = "5f" * 16
    prepare = marker(Kind.PREPARE, "XID:1:ab:cd", producer_id=1, producer_epoch=0, timestamp_ms=9, timeout_s=30,
                     starter=tag)
    assert prepare.endswith(struct.pack(">iB", 30, 32) + tag.encode()) and control_at(prepare).starter == tag
    # A PREPARE written before starters existed (or with security off): the old bytes exactly, starter unknown.
    old = struct.pack(">BBqhqH", 1, 2, 1, 0, 9, 3) + b"TX1" + struct.pack(">i", 30)
    assert encode_body(Control(Kind.PREPARE, 1, 0, 9, "TX1", timeout_s=30)) == old
    assert decode_body(old).starter == "" and decode_body(old).timeout_s == 30
    # Only PREPARE carries it.
    assert control_at(marker(Kind.COMMIT, "TX1", producer_id=1, producer_epoch=0, timestamp_ms=9, starter=tag)).starter == ""
    with pytest.raises(ControlError, match="starter is 256 bytes"):
        encode_body(Control(Kind.PREPARE, 1, 0, 9, "TX1", starter="s" * 256))


@pytest.mark.parametrize("body, message", [
    (b"\x01\x02" + bytes(18) + b"\x00\x00" + bytes(4) + b"\x05ab", "starter is empty or runs past"),
    (b"\x01\x02" + bytes(18) + b"\x00\x00" + bytes(4) + b"\x00", "starter is empty or runs past"),
    (b"\x01\x02" + bytes(18) + b"\x00\x00" + bytes(4) + b"\x01\xff", "not UTF-8"),
    (b"\x02\x01" + bytes(18) + b"\x00\x00", "version 2"),
    (b"\x01\x09" + bytes(18) + b"\x00\x00", "unknown control record kind 9"),
    (b"\x01\x01" + bytes(18) + b"\x00\x00", "truncated"),
    (b"\x01\x03" + bytes(18) + b"\x00\x05ab", "runs past"),
    (b"\x01\x03" + bytes(18) + b"\x00\x00!", "trailing"),
    (b"\x01\x04" + bytes(18) + b"\x00\x00\x09", "out of range"),
])
def test_bad_bodies_are_refused_with_a_reason(body: bytes, message: str) -> None:
    with pytest.raises(ControlError, match=message):
        decode_body(body)


def test_a_producer_cannot_forge_a_control_record() -> None:
    forged = encode_batch([(b"ok", None)]) + encode_control(Control(Kind.COMMIT, 1, 0, 0, "TX:9:9"))
    assert find_forged_control(forged) == 1
    assert find_forged_control(encode_batch([(b"ok", "a"), (b"fine", None)])) is None


def test_markers_need_a_transaction_id_and_batches_a_valid_sequence() -> None:
    with pytest.raises(ControlError, match="needs a transaction id"):
        marker(Kind.COMMIT, "", producer_id=1, producer_epoch=0, timestamp_ms=0)
    with pytest.raises(ControlError, match="frame_batch"):
        marker(Kind.BATCH, "t", producer_id=1, producer_epoch=0, timestamp_ms=0)
    with pytest.raises(ControlError, match="sequence"):
        encode_body(Control(Kind.BATCH, 1, 0, 0, "", first_seq=-1, record_count=1))
    with pytest.raises(ControlError, match="limit"):
        encode_body(Control(Kind.COMMIT, 1, 0, 0, "x" * 513))
