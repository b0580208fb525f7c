"""codec.decode_messages and codec.encode_messages, compiled (metaq/_speedups.c) and pure
Python: the same results.

Every test runs against both implementations; the compiled one is skipped only where it was
not built (scripts/setup.sh builds it).
"""

from __future__ import annotations

import gc
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client import codec
from metaq.client.message import Message, Partition
from metaq.record import HEADER, HEADER_SIZE, RecordError, encode_batch, encode_record
from metaq.txn.control import frame_batch

COMPILED = codec.decode_valid
COMPILED_ENCODE = codec.encode_plain
P = Partition(3, 1)


@pytest.fixture(params=["compiled", "python"])
def decoder(request, monkeypatch):
    if request.param == "compiled":
        if COMPILED is None:
            pytest.skip("metaq._speedups is not built (python setup.py build_ext --inplace)")
        monkeypatch.setattr(codec, "decode_valid", COMPILED)
    else:
        monkeypatch.setattr(codec, "decode_valid", None)
    return codec.decode_messages


def expected(records: list[tuple[bytes, str | None]], base: int) -> list[Message]:
    out, offset = [], base
    for data, attribute in records:
        out.append(Message("t", data, attribute, 0, P, offset))
        offset += len(encode_record(data, attribute))
    return out


def test_plain_and_attribute_records_decode_in_order_with_offsets(decoder) -> None:
    records = [(b"a" * 100, None), (b"", None), (b"b", "tag"), (b"c" * 3000, None), (b"d", "\u00e9t\u00e9"), (b"e", None)]
    buf = encode_batch(records)
    messages, end = decoder(buf, 1_000_000_000_000, "t", P)
    assert messages == expected(records, 1_000_000_000_000) and end == 1_000_000_000_000 + len(buf)
    first = messages[0]
    assert type(first) is Message and first.data == b"a" * 100 and first.attribute is None and first.partition is P
    assert first._replace(data=b"z").data == b"z" and hash(first) == hash(Message(*first))


def test_compiled_messages_are_not_tracked_by_the_garbage_collector() -> None:
    if COMPILED is None:
        pytest.skip("metaq._speedups is not built")
    messages, _ = codec.decode_messages(encode_batch([(b"a", None), (b"b", "tag"), (b"c", None)]), 0, "t", P)
    assert [m.attribute for m in messages] == [None, "tag", None]
    assert not any(gc.is_tracked(m) for m in messages)  # no cycle can pass through one (_speedups.c)
    del messages
    gc.collect()


def test_msg_ids_and_bytearray_input(decoder) -> None:
    buf = bytearray(encode_record(b"x", msg_id=2**62) + encode_record(b"y", "a", msg_id=7))
    messages, _ = decoder(buf, 0, "t", P)
    assert [m.id for m in messages] == [2**62, 7]


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 5])
def test_a_partial_tail_is_left_for_the_next_fetch(decoder, cut) -> None:
    whole = encode_batch([(b"a" * 50, None), (b"b", "tag")])
    for tail in (encode_record(b"c" * 50), encode_record(b"c" * 50, "tag")):
        messages, end = decoder(whole + tail[:cut], 10, "t", P)
        assert len(messages) == 2 and end == 10 + len(whole)
    assert decoder(b"", 10, "t", P) == ([], 10)


def test_control_records_are_left_out_and_the_end_moves_past_them(decoder) -> None:
    plain = encode_batch([(b"a", None), (b"b", None)])
    framed = bytes(frame_batch(plain, 2, producer_id=5, producer_epoch=0, first_seq=0, timestamp_ms=1))
    control = framed[: len(framed) - len(plain)]
    messages, end = decoder(framed + control, 0, "t", P)
    assert [m.data for m in messages] == [b"a", b"b"] and [m.offset for m in messages] == [len(control), len(control) + 21]
    assert end == len(framed) + len(control)


def damaged(buf: bytes, at: int, byte: int) -> bytes:
    out = bytearray(buf)
    out[at] ^= byte
    return bytes(out)


@pytest.mark.parametrize("where, byte, says", [
    (21 + 7, 0x01, "checksum mismatch"),  # the second record's (at 21) crc field
    (21 + HEADER_SIZE, 0x01, "checksum mismatch"),  # its payload
    (21 + 19, 0x04, "bad header"),  # an unknown flag bit
    (21, 0x80, "bad header"),  # a negative length
])
def test_a_damaged_record_raises_naming_its_offset(decoder, where, byte, says) -> None:
    buf = encode_batch([(b"a", None), (b"b", None), (b"c", None)])
    with pytest.raises(RecordError, match=f"record at offset {500 + 21}: {says}"):
        decoder(damaged(buf, where, byte), 500, "t", P)


def test_a_bad_attribute_block_raises_naming_its_offset(decoder) -> None:
    record = bytearray(encode_record(b"b", "tag"))
    struct.pack_into(">i", record, HEADER_SIZE, 99)  # an attribute longer than the payload
    payload = bytes(record[HEADER_SIZE:])
    record[:HEADER_SIZE] = encode_record(payload)[:HEADER_SIZE]  # a CRC that matches, the flag kept
    record[HEADER_SIZE - 1] = 1
    with pytest.raises(RecordError, match="record at offset 21: attribute length 99"):
        decoder(encode_record(b"a") + bytes(record), 0, "t", P)


def test_an_attribute_that_is_not_utf8_raises_naming_its_offset(decoder) -> None:
    payload = struct.pack(">i", 2) + b"\xff\xfe" + b"data"
    record = HEADER.pack(len(payload), zlib.crc32(payload) & 0x7FFFFFFF, 0, 1) + payload
    with pytest.raises(RecordError, match="record at offset 27: attribute is not UTF-8"):
        decoder(encode_record(b"a", "ok") + record + encode_record(b"c"), 0, "t", P)


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(st.tuples(st.binary(max_size=300), st.none() | st.text(max_size=10)), max_size=20),
    cut=st.integers(min_value=0, max_value=40),
    base=st.integers(min_value=0, max_value=2**40),
)
def test_both_decoders_agree_on_any_records(records, cut, base) -> None:
    buf = encode_batch(records)
    buf = buf[: max(0, len(buf) - cut)]
    results = []
    for implementation in ([COMPILED] if COMPILED is not None else []) + [None]:
        codec.decode_valid = implementation
        try:
            results.append(codec.decode_messages(buf, base, "t", P))
        finally:
            codec.decode_valid = COMPILED
    messages, end = results[-1]
    assert all(result == results[-1] for result in results)
    assert messages == expected(records, base)[: len(messages)]
    assert end == (messages[-1].offset + len(encode_record(messages[-1].data, messages[-1].attribute)) if messages else base)


def encode_both(messages) -> list[tuple[bytes, list[int]]]:
    """codec.encode_messages's answer with the compiled encode (when built), then without it."""
    results = []
    for implementation in ([COMPILED_ENCODE] if COMPILED_ENCODE is not None else []) + [None]:
        codec.encode_plain = implementation
        try:
            results.append(codec.encode_messages(messages))
        finally:
            codec.encode_plain = COMPILED_ENCODE
    return results


def test_a_put_body_is_the_records_of_the_batch_with_their_starts_compiled_or_not() -> None:
    payloads = [b"x" * 100, b"", b"\x00\xff" * 700, b"last"]
    for body, starts in encode_both([Message("t", p) for p in payloads]):
        assert body == encode_batch([(p, None) for p in payloads])
        assert starts == [0, 120, 140, 1560]
        assert codec.decode_messages(body, 0, "t", P)[0] == expected([(p, None) for p in payloads], 0)
    assert encode_both([]) == [(b"", [])] * len(encode_both([]))


def test_messages_with_an_attribute_or_not_plain_are_left_to_the_python_encode() -> None:
    if COMPILED_ENCODE is None:
        pytest.skip("metaq._speedups is not built")
    with_attribute = [Message("t", b"a"), Message("t", b"b", "tag")]
    assert COMPILED_ENCODE(with_attribute, Message) is None
    assert COMPILED_ENCODE([("t", b"a", None)], Message) is None  # not a Message: codec.py raises for it
    assert COMPILED_ENCODE([Message("t", b"a")], tuple) is None
    assert codec.encode_messages(with_attribute)[0] == encode_batch([(b"a", None), (b"b", "tag")])
    with pytest.raises(AttributeError):
        codec.encode_messages([("t", b"a", None)])  # the same error with the compiled encode built


@settings(max_examples=150, deadline=None)
@given(records=st.lists(st.tuples(st.binary(max_size=300), st.none() | st.text(max_size=10)), max_size=20))
def test_both_encodes_agree_on_any_messages(records) -> None:
    results = encode_both([Message("t", data, attribute) for data, attribute in records])
    assert all(result == results[-1] for result in results)
    assert results[-1][0] == encode_batch(records)


def test_the_compiled_crc_is_zlibs_at_every_length_and_alignment() -> None:
    """_speedups.c computes short payloads' CRCs itself (slicing-by-8) and longer ones with zlib:
    every length around the switch and the 8-byte steps, at every alignment within the body."""
    if COMPILED_ENCODE is None or COMPILED is None:
        pytest.skip("metaq._speedups is not built")
    pattern = bytes(range(256)) * 3
    for length in range(0, 600):
        payloads = [pattern[length % 7 : length % 7 + n] for n in (length % 9, length)]
        body, starts = COMPILED_ENCODE([Message("t", p) for p in payloads], Message)
        assert body == encode_batch([(p, None) for p in payloads]), length
        messages, end = codec.decode_messages(body, 0, "t", P)  # the compiled check of every CRC
        assert [m.data for m in messages] == payloads and end == len(body)
        damaged = bytearray(body)
        damaged[-1 if length else starts[1] + 4] ^= 0x01  # the last payload byte (or its CRC when empty)
        with pytest.raises(RecordError, match="checksum mismatch"):
            codec.decode_messages(damaged, 0, "t", P)
