"""Fuzzing store recovery (metaq.store.log): a segment with corrupted, truncated or
appended garbage bytes reopens without crashing and keeps exactly its valid prefix."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from metaq.record import encode_record, iter_records, valid_prefix
from metaq.store.log import PartitionLog

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
payloads = st.lists(st.binary(min_size=0, max_size=120), min_size=1, max_size=10)


def write_log(directory: Path, datas: list[bytes], max_segment_size: int = 1 << 20) -> tuple[bytes, list[int]]:
    plog = PartitionLog(directory, max_segment_size=max_segment_size)
    starts = []
    for i, data in enumerate(datas):
        starts.append(plog.log_end)
        plog.append(encode_record(data, msg_id=i + 1))
    # Not flushed: the damage below stands for a crash's torn or garbled unflushed tail.
    # (Files that lose flushed bytes refuse to open: test_store_log's went-backwards tests.)
    plog.close()
    segments = sorted(p for p in directory.iterdir() if p.name.endswith(".meta"))
    return b"".join(p.read_bytes() for p in segments), starts


def reopen(directory: Path) -> tuple[int, bytes]:
    plog = PartitionLog(directory, max_segment_size=1 << 20)
    try:
        end = plog.log_end
        out = bytearray()
        while len(out) < end:  # a read stays inside one segment
            chunk = plog.read(len(out), end - len(out))
            assert chunk, f"no bytes at {len(out)} below the log end {end}"
            out += chunk
        return end, bytes(out)
    finally:
        plog.close()


corruption = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64), st.just(0)),
    st.tuples(st.just("overwrite"), st.integers(0, 10_000), st.binary(min_size=1, max_size=40)),
)


@SETTINGS
@given(payloads, st.lists(corruption, min_size=1, max_size=3))
def test_recovery_keeps_exactly_the_valid_prefix(datas, corruptions):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        original, starts = write_log(directory, datas)
        (segment,) = [p for p in directory.iterdir() if p.name.endswith(".meta")]
        buf = bytearray(original)
        first_damage = len(buf)
        for kind, a, b in corruptions:
            if kind == "flip" and buf:
                pos = a % len(buf)
                buf[pos] ^= b
                first_damage = min(first_damage, pos)
            elif kind == "truncate":
                cut = a % (len(buf) + 1)
                del buf[cut:]
                first_damage = min(first_damage, cut)
            elif kind == "append":
                buf += a
            elif kind == "overwrite" and buf:
                pos = a % len(buf)
                buf[pos : pos + len(b)] = b
                first_damage = min(first_damage, pos)
        segment.write_bytes(bytes(buf))

        end, content = reopen(directory)
        expected = valid_prefix(bytes(buf))
        assert end == expected
        assert content == bytes(buf[:expected])
        # Every whole record before the first damaged byte survives, byte for byte.
        intact = max([s for s in starts + [len(original)] if s <= first_damage and
                      (s == len(original) or s + len(encode_record(datas[starts.index(s)])) <= first_damage)],
                     default=0)
        assert end >= min(intact, len(buf))
        assert content[:intact] == original[:intact]
        list(iter_records(content))  # all of it decodes with valid checksums
        if expected < len(buf):
            assert any(".corrupt-" in p.name for p in directory.iterdir())  # moved aside, not lost
        # And the recovered log accepts appends at its end and reopens clean.
        plog = PartitionLog(directory, max_segment_size=1 << 20)
        plog.append(encode_record(b"after", msg_id=999))
        plog.close()
        end2, content2 = reopen(directory)
        assert end2 == end + len(encode_record(b"after"))
        assert [r.data for r in iter_records(content2)][-1] == b"after"


@SETTINGS
@given(payloads, st.integers(0, 10_000), st.binary(min_size=1, max_size=30))
def test_only_the_last_segment_is_cut_earlier_segments_are_kept(datas, pos, garbage):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        original, _ = write_log(directory, datas + [b"x" * 50, b"y" * 50], max_segment_size=64)
        segments = sorted(p for p in directory.iterdir() if p.name.endswith(".meta"))
        last = segments[-1]
        body = bytearray(last.read_bytes())
        start = int(last.name.split(".")[0])
        at = pos % (len(body) + 1)
        body[at : at + len(garbage)] = garbage
        last.write_bytes(bytes(body))
        end, content = reopen(directory)
        assert end == start + valid_prefix(bytes(body))
        assert content[:start] == original[:start]
