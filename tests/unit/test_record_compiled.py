"""record.py's record walks, compiled (metaq/_speedups.c) and pure Python: the same results.

``_scan`` (validate_batch, valid_prefix, walk_records) and ``stamp_msg_ids`` use the compiled
``scan_valid`` / ``stamp_ids`` when they are built. Every case below runs against both; the
Hypothesis tests feed both the same damaged batches and random bytes (a put's body comes from
the network) and require the same answer, the same error, the same bytes written.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq import record
from metaq.record import HEADER, HEADER_SIZE, RecordError, encode_batch, encode_record, stamp_msg_ids, validate_batch

COMPILED = record.scan_valid, record.stamp_ids
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = 4096


@contextmanager
def pure_python():
    with mock.patch.object(record, "scan_valid", None), mock.patch.object(record, "stamp_ids", None):
        yield


@pytest.fixture(params=["compiled", "python"])
def walks(request):
    if request.param == "compiled":
        if COMPILED[0] is None:
            pytest.skip("metaq._speedups is not built (python setup.py build_ext --inplace)")
        yield
    else:
        with pure_python():
            yield


def put_record(length: int, crc: int, flag: int, payload: bytes) -> bytes:
    return HEADER.pack(length, crc, 0, flag) + payload


GOOD = encode_record(b"ok")
BAD_BATCHES = [
    (GOOD + put_record(-5, 0, 0, b""), "record at 22: negative length -5"),
    (GOOD + put_record(LIMIT + 1, 0, 0, b""), f"record at 22: length {LIMIT + 1} exceeds the limit of {LIMIT} bytes"),
    (GOOD + put_record(2, record.checksum(b"ab"), 4, b"ab"), "record at 22: unknown flag bits 0x4"),
    (GOOD + put_record(2, -1, 0, b"ab"), "record at 22: negative checksum"),
    (GOOD + GOOD[:HEADER_SIZE - 3], f"record at 22: truncated header ({HEADER_SIZE - 3} of {HEADER_SIZE} bytes)"),
    (GOOD + GOOD[:-1], "record at 22: truncated payload (1 of 2 bytes)"),
    (GOOD + put_record(2, record.checksum(b"ab") ^ 1, 0, b"ab"), "record at 22: checksum mismatch"),
    (GOOD + put_record(2, record.checksum(b"ab"), 1, b"ab"), "attribute flag set but payload shorter than 4 bytes"),
    (GOOD + put_record(6, record.checksum(b"\0\0\0\x09ab"), 1, b"\0\0\0\x09ab"), "attribute length 9 does not fit"),
    (GOOD + put_record(6, record.checksum(b"\0\0\0\x02\xff\xfe"), 1, b"\0\0\0\x02\xff\xfe"), "attribute is not UTF-8"),
]


def test_a_good_batch_is_counted_and_stamped(walks) -> None:
    batch = bytearray(encode_batch([(b"a" * 100, None), (b"", None), (b"b", "tag"), (b"c", "\u00e9t\u00e9")]))
    assert validate_batch(batch, LIMIT) == 4
    assert validate_batch(memoryview(bytes(batch)), LIMIT) == 4
    assert record.valid_prefix(batch + b"\0\0") == len(batch)
    assert stamp_msg_ids(batch, (1 << 63) - 4) == 4
    assert [r.msg_id for r in record.iter_records(batch)] == [(1 << 63) - 4 + i for i in range(4)]
    assert validate_batch(batch, LIMIT) == 4  # the ids are outside the CRC


@pytest.mark.parametrize("batch, says", BAD_BATCHES, ids=[says for _, says in BAD_BATCHES])
def test_a_bad_batch_is_refused_with_the_same_message(walks, batch, says) -> None:
    with pytest.raises(RecordError, match=says.replace("(", r"\(").replace(")", r"\)")):
        validate_batch(batch, LIMIT)
    assert record.valid_prefix(batch, LIMIT) == len(GOOD) or "UTF-8" in says  # valid_prefix skips that rule


def test_stamping_what_is_not_whole_records_raises_as_record_py_does(walks) -> None:
    with pytest.raises(TypeError):
        stamp_msg_ids(bytes(GOOD), 1)  # read-only
    with pytest.raises(struct.error):
        stamp_msg_ids(bytearray(GOOD[:10]), 1)  # a header cut short
    with pytest.raises(struct.error):
        stamp_msg_ids(bytearray(GOOD * 2), (1 << 63) - 1)  # the second id does not fit an int64
    cut = bytearray(GOOD + GOOD[:-1])  # the last record's header is whole: record.py stamps it too
    assert stamp_msg_ids(cut, 7) == 2 and HEADER.unpack_from(cut, len(GOOD))[2] == 8
    assert stamp_msg_ids(bytearray(), 1) == 0


@pytest.mark.skipif(COMPILED[0] is None, reason="metaq._speedups is not built")
@pytest.mark.parametrize("damage", ["none", "flip", "cut"])
def test_both_walks_agree_on_a_walk_chunk_of_megabytes(damage) -> None:
    """Past 64 KiB without the UTF-8 rule the compiled walk runs with the GIL released."""
    plain, tagged = len(encode_record(b"x" * 1000)), len(encode_record(b"z", "tag"))
    buf = bytearray(encode_batch([(bytes([i % 251]) * 1000, None) for i in range(300)] + [(b"z", "tag")] * 40))
    whole = len(buf)
    if damage == "flip":
        buf[196 * plain + HEADER_SIZE + 5] ^= 1  # in the payload of record 196
    elif damage == "cut":
        buf = buf[:-7]
    length, count = scan_both(bytes(buf), 1 << 30, False)
    assert (length, count) == {"none": (whole, 340), "flip": (196 * plain, 196), "cut": (whole - tagged, 339)}[damage]
    assert scan_both(buf, 1 << 30, True) == (length, count)


def scan_both(buf, limit: int, utf8: bool) -> tuple:
    compiled = record._scan(buf, limit, utf8)
    with pure_python():
        assert record._scan(buf, limit, utf8) == compiled
    return compiled


def stamp_both(buf: bytes, first_id: int) -> None:
    """stamp_msg_ids runs on validated batches only; on a record length below 0 its pure loop
    would not end (it does not check, and neither test calls it there)."""
    pos = 0
    while len(buf) - pos >= 4:
        (length,) = struct.unpack_from(">i", buf, pos)
        if length < 0:
            return
        pos += HEADER_SIZE + length
    outcomes = []
    for context in (pure_python, _compiled):
        target = bytearray(buf)
        with context():
            try:
                outcome: object = stamp_msg_ids(target, first_id)
            except (struct.error, TypeError) as exc:
                outcome = type(exc)
        outcomes.append((outcome, bytes(target)))
    assert outcomes[0] == outcomes[1]


@contextmanager
def _compiled():
    yield


batches = st.lists(st.tuples(st.binary(max_size=120), st.one_of(st.none(), st.text(max_size=12))), max_size=6)


@pytest.mark.skipif(COMPILED[0] is None, reason="metaq._speedups is not built")
@SETTINGS
@given(batches, st.data())
def test_both_walks_agree_on_damaged_batches(msgs, data) -> None:
    buf = bytearray(encode_batch(msgs))
    for _ in range(data.draw(st.integers(0, 3))):
        if buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    buf = buf[: data.draw(st.integers(0, len(buf)))] + data.draw(st.binary(max_size=30))
    limit = data.draw(st.sampled_from([0, 50, LIMIT, 1 << 40, -1]))
    for utf8 in (False, True):
        scan_both(bytes(buf), limit, utf8)
        scan_both(memoryview(buf)[1:], limit, utf8)
    stamp_both(bytes(buf), data.draw(st.integers(-(1 << 63), (1 << 63) - 1)))


@pytest.mark.skipif(COMPILED[0] is None, reason="metaq._speedups is not built")
@SETTINGS
@given(st.binary(max_size=200), st.integers(-(1 << 64), 1 << 64))
def test_both_walks_agree_on_random_bytes(buf, first_id) -> None:
    scan_both(buf, LIMIT, True)
    stamp_both(buf, first_id)


def test_without_the_extension_every_user_falls_back_to_pure_python() -> None:
    """An install without a C compiler has no metaq._speedups: importing its users (record, the
    client's codec, frames, messages) must still work, each choosing its pure-Python code (a fresh interpreter in which the import fails)."""
    probe = (
        "import sys; sys.modules['metaq._speedups'] = None\n"  # `import` of it now raises ImportError
        "from metaq import record; from metaq.client import codec; from metaq.client.message import Partition\n"
        "assert record.scan_valid is None and record.stamp_ids is None and codec.decode_valid is None\n"
        "batch = bytearray(record.encode_batch([(b'a', None), (b'b', 'tag')]))\n"
        "assert record.validate_batch(batch, 100) == 2 and record.stamp_msg_ids(batch, 5) == 2\n"
        "messages, _ = codec.decode_messages(batch, 0, 't', Partition(0, 0))\n"
        "assert [(m.data, m.attribute, m.id) for m in messages] == [(b'a', None, 5), (b'b', 'tag', 6)]\n"
        "from metaq.protocol import frames, messages\n"
        "assert frames.frame_at is None and frames.pack_frame is None and messages.request_from is None\n"
        "decoder = frames.FrameDecoder(); decoder.receive_data(frames.encode_frame({'op': 'put', 'opaque': 1, 'topic': 't'}, batch))\n"
        "request = messages.parse_request(decoder.next_event())\n"
        "assert (request.topic, request.partition, request.body) == ('t', -1, batch)\n"
    )
    root = Path(record.__file__).parent.parent
    done = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
