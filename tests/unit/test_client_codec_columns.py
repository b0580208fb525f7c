"""codec.encode_columns and codec.key_crc32 (the Spark sink's encode of Arrow batches), compiled
(metaq/_speedups.c) and pure Python: byte for byte what encode_messages makes of the same rows
as Messages.

Every test runs against both implementations; the compiled one is skipped only where it was
not built (scripts/setup.sh builds it).
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from metaq.client import codec  # noqa: E402
from metaq.client.message import Message, Partition  # noqa: E402
from metaq.record import HEADER_SIZE, iter_records, validate_batch  # noqa: E402
from metaq.spark.sink import arrow_column  # noqa: E402

COMPILED = codec.compiled_encode_columns, codec.compiled_key_crc32
NO_LIMIT = 1 << 40


@pytest.fixture(params=["compiled", "python"])
def impl(request, monkeypatch):
    if request.param == "compiled":
        if None in COMPILED:
            pytest.skip("metaq._speedups is not built (python setup.py build_ext --inplace)")
        monkeypatch.setattr(codec, "compiled_encode_columns", COMPILED[0])
        monkeypatch.setattr(codec, "compiled_key_crc32", COMPILED[1])
    else:
        monkeypatch.setattr(codec, "compiled_encode_columns", None)
        monkeypatch.setattr(codec, "compiled_key_crc32", None)
    return request.param


def per_row(values: list, attributes: list | None, rows: list[int]) -> tuple[bytes, list[int]]:
    """The per-row path: a Message per row, encoded by encode_messages."""
    messages = []
    for row in rows:
        value = values[row]
        data = value.encode("utf-8") if isinstance(value, str) else value
        messages.append(Message("t", data, None if attributes is None else attributes[row]))
    return codec.encode_messages(messages)


def encode_all(values, attributes, rows, count, limit_bytes=NO_LIMIT, limit_count=NO_LIMIT, max_size=NO_LIMIT):
    """Every row, in as many puts as the limits make: the puts' bodies and starts, joined."""
    body, starts, position = b"", [], 0
    while position < count:
        part, part_starts, position = codec.encode_columns(values, attributes, rows, position, count, limit_bytes, limit_count, max_size)
        assert part_starts and len(part_starts) <= limit_count
        assert len(part) <= limit_bytes or len(part_starts) == 1  # at least one record per put, even a big one
        starts.extend(len(body) + s for s in part_starts)
        body += part
    return body, starts


values_st = st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=3000)), min_size=1, max_size=40)
attribute_st = st.one_of(st.none(), st.text(max_size=12))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # impl is fixed per test
@given(data=st.data(), large=st.booleans(), text=st.booleans(), shift=st.integers(0, 3))
def test_columns_encode_like_messages(impl, data, large, text, shift) -> None:
    values = data.draw(values_st)
    if text:
        values = [v.decode("latin-1") for v in values]  # a string column: sent as UTF-8
    with_attributes = data.draw(st.booleans())
    attributes = data.draw(st.lists(attribute_st, min_size=len(values), max_size=len(values))) if with_attributes else None
    kind = (pa.large_string() if large else pa.string()) if text else (pa.large_binary() if large else pa.binary())
    # A slice: Arrow keeps the rows before it in the buffers (the array's offset).
    value_array = pa.array([values[0]] * shift + values, kind).slice(shift)
    attribute_array = None if attributes is None else pa.array([None] * shift + attributes, pa.string()).slice(shift)
    permuted = data.draw(st.booleans())
    rows = data.draw(st.permutations(range(len(values)))) if permuted else list(range(len(values)))
    row_buffer = pa.array(rows, pa.int64()).buffers()[1] if permuted else None
    limit_bytes = data.draw(st.sampled_from([NO_LIMIT, 1, 300, 4000]))
    limit_count = data.draw(st.sampled_from([NO_LIMIT, 1, 7]))
    got = encode_all(arrow_column(value_array), None if attribute_array is None else arrow_column(attribute_array),
                     row_buffer, len(values), limit_bytes, limit_count)
    assert got == per_row(values, attributes, rows)


def test_the_put_is_a_valid_batch_of_the_rows_in_order(impl) -> None:
    values = pa.array([b"a", b"", b"c" * 5000, b"d"], pa.binary())
    attributes = pa.array([None, "tag", "", "\u00e9t\u00e9"], pa.string())
    body, starts, end = codec.encode_columns(arrow_column(values), arrow_column(attributes), None, 0, 4, NO_LIMIT, NO_LIMIT, 1 << 20)
    assert end == 4 and validate_batch(body, 1 << 20) == 4
    records = list(iter_records(body))
    assert [(r.data, r.attribute, r.msg_id) for r in records] == [(b"a", None, 0), (b"", "tag", 0), (b"c" * 5000, "", 0), (b"d", "\u00e9t\u00e9", 0)]
    assert list(starts) == [r.offset for r in records]


def test_limits_stop_a_put_before_the_row_that_does_not_fit(impl) -> None:
    values = arrow_column(pa.array([b"x" * 100] * 10, pa.binary()))
    body, starts, end = codec.encode_columns(values, None, None, 2, 10, 3 * (HEADER_SIZE + 100) + 5, NO_LIMIT, 1 << 20)
    assert (end, len(starts), len(body)) == (5, 3, 3 * 120)
    body, starts, end = codec.encode_columns(values, None, None, 5, 10, NO_LIMIT, 4, 1 << 20)
    assert (end, len(starts)) == (9, 4)
    # A row bigger than the byte limit still goes, alone: the limit shapes puts, it refuses nothing.
    body, starts, end = codec.encode_columns(values, None, None, 0, 10, 10, NO_LIMIT, 1 << 20)
    assert (end, len(starts)) == (1, 1)


def test_a_null_value_is_refused_naming_its_row(impl) -> None:
    values = arrow_column(pa.array([b"a", b"b", None, b"d"], pa.binary()))
    with pytest.raises(ValueError, match=r"^row 1002: the value is null \(column value is required\)$"):
        codec.encode_columns(values, None, None, 0, 4, NO_LIMIT, NO_LIMIT, 1 << 20, 1000)


def test_a_record_over_the_max_message_size_is_refused_naming_its_row(impl) -> None:
    values = arrow_column(pa.array([b"a" * 10, b"b" * 96, b"c" * 97], pa.binary()))
    attributes = arrow_column(pa.array([None, None, None], pa.string()))
    body, _, end = codec.encode_columns(values, attributes, None, 0, 2, NO_LIMIT, NO_LIMIT, 96)
    assert end == 2  # exactly the limit passes
    with pytest.raises(ValueError, match=r"^row 2: its record's payload is 97 bytes, more than maxMessageSize \(96\)$"):
        codec.encode_columns(values, attributes, None, 0, 3, NO_LIMIT, NO_LIMIT, 96)
    # The attribute block counts: 4 bytes of length and the attribute's UTF-8.
    tagged = arrow_column(pa.array([None, "\u00e9", None], pa.string()))
    with pytest.raises(ValueError, match=r"^row 1: its record's payload is 102 bytes, more than maxMessageSize \(96\)$"):
        codec.encode_columns(values, tagged, None, 0, 2, NO_LIMIT, NO_LIMIT, 96)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # impl is fixed per test
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=30)), max_size=30), text=st.booleans())
def test_key_hashes_are_the_clients_crc32(impl, keys, text) -> None:
    if text:
        keys = [None if k is None else k.decode("latin-1") for k in keys]
    array = pa.array([b"skipped" if not text else "skipped"] + keys, pa.string() if text else pa.binary()).slice(1)
    raw = [None if k is None else (k.encode("utf-8") if text else k) for k in keys]
    assert list(codec.key_crc32(arrow_column(array), len(keys))) == [-1 if k is None else zlib.crc32(k) for k in raw]


def test_encoded_records_pass_through_encode_messages_whole_only() -> None:
    put = codec.EncodedRecords("t", Partition(1, 0), b"records", [0, 3])
    assert codec.encode_messages(put.as_messages()) == (b"records", [0, 3])
    with pytest.raises(ValueError, match="whole and alone"):
        codec.encode_messages(put.as_messages()[:1])
    with pytest.raises(ValueError, match="whole and alone"):
        codec.encode_messages([put, Message("t", b"other")])
