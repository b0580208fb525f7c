"""Fuzzing the frame decoder (metaq.protocol.frames): whatever bytes arrive, in whatever
pieces, it never raises, always classifies, and keeps framing after non-fatal errors."""

from __future__ import annotations

import msgpack
from hypothesis import HealthCheck, given, settings, strategies as st

from metaq.protocol.frames import (
    CLOSED, MAGIC, NEED_DATA, PREFIX, VERSION, BadFrame, Frame, FrameDecoder, FrameHead, OversizedFrame, ProtocolError,
    TextLine, encode_frame,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EVENTS = (Frame, TextLine, BadFrame, OversizedFrame, ProtocolError)

headers = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.binary(max_size=20), st.booleans(), st.none()),
    max_size=5,
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points + [len(data)]:
        out.append(data[last:p])
        last = p
    return [c for c in out if c]


def drain(decoder: FrameDecoder, chunks: list[bytes], eof: bool = True) -> list[object]:
    events: list[object] = []
    for chunk in chunks + ([b""] if eof else []):
        decoder.receive_data(chunk)
        for _ in range(10_000):
            event = decoder.next_event()
            assert event is NEED_DATA or event is CLOSED or isinstance(event, EVENTS), event
            if event is NEED_DATA or event is CLOSED:
                break
            events.append(event)
            if isinstance(event, ProtocolError):
                assert event.fatal
                assert decoder.next_event() == event  # BROKEN is sticky
                return events
        else:
            raise AssertionError("decoder made no progress")
    return events


@SETTINGS
@given(st.binary(max_size=2048), st.lists(st.integers(0, 4096), max_size=8), st.integers(0, 4096))
def test_random_bytes_always_classified(data, cuts, max_body):
    events = drain(FrameDecoder(max_body=max_body), split(data, cuts))
    for event in events:
        if isinstance(event, Frame):
            assert isinstance(event.header, dict) and len(event.body) <= max_body


@SETTINGS
@given(st.lists(st.tuples(headers, st.binary(max_size=300)), min_size=1, max_size=6),
       st.lists(st.integers(0, 5000), max_size=10))
def test_valid_frames_roundtrip_in_any_pieces(frames, cuts):
    stream = b"".join(encode_frame(h, b) for h, b in frames)
    events = drain(FrameDecoder(), split(stream, cuts))
    assert [(e.header, bytes(e.body)) for e in events] == [(h, b) for h, b in frames]


@SETTINGS
@given(headers, st.binary(max_size=200), st.data())
def test_truncated_frame_is_a_protocol_error_never_a_frame(header, body, data):
    frame = encode_frame(header, body)
    cut = data.draw(st.integers(1, len(frame) - 1))
    events = drain(FrameDecoder(), [frame[:cut]])
    assert len(events) == 1 and isinstance(events[0], ProtocolError)


@SETTINGS
@given(headers, st.integers(1, 5000), st.integers(0, 300), st.lists(st.integers(0, 6000), max_size=6))
def test_oversized_body_is_skipped_and_the_next_frame_decodes(header, over, max_body, cuts):
    body = b"x" * (max_body + over)
    stream = encode_frame(header, body) + encode_frame({"op": "version", "opaque": 1})
    events = drain(FrameDecoder(max_body=max_body), split(stream, cuts))
    assert isinstance(events[0], OversizedFrame) and events[0].body_len == len(body)
    assert isinstance(events[1], Frame) and events[1].header == {"op": "version", "opaque": 1}
    assert len(events) == 2


@SETTINGS
@given(st.binary(min_size=1, max_size=64), st.binary(max_size=64))
def test_garbage_header_is_a_bad_frame_and_framing_survives(raw_header, body):
    try:
        decoded = msgpack.unpackb(raw_header, raw=False, strict_map_key=True)
    except Exception:
        decoded = None
    stream = PREFIX.pack(MAGIC, VERSION, len(raw_header), len(body)) + raw_header + body
    stream += encode_frame({"op": "quit", "opaque": 2})
    events = drain(FrameDecoder(), [stream])
    if isinstance(decoded, dict):
        assert isinstance(events[0], Frame)
    else:
        assert isinstance(events[0], BadFrame)
    assert isinstance(events[1], Frame) and events[1].header["opaque"] == 2


@SETTINGS
@given(st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_any_prefix_values_never_hang_or_raise(version, header_len, body_len):
    stream = PREFIX.pack(MAGIC, version, header_len, body_len) + b"\x80" * 32
    events = drain(FrameDecoder(max_body=1024), [stream])
    assert len(events) <= 2
    if version != VERSION or header_len > 64 * 1024:
        assert isinstance(events[0], ProtocolError)


@SETTINGS
@given(st.lists(st.tuples(headers, st.binary(max_size=300)), min_size=1, max_size=6),
       st.lists(st.integers(0, 5000), max_size=10), st.lists(st.booleans(), max_size=6))
def test_announced_heads_change_nothing_but_what_is_skipped(frames, cuts, skips):
    """With announce_heads, the frames are the same in any pieces, each announced at most once;
    a skipped one never comes out and the frames after it still do."""
    stream = b"".join(encode_frame(h, b) for h, b in frames)
    decoder = FrameDecoder(announce_heads=True)
    decided: list[bool] = []  # per announced frame: skipped?
    out: list[object] = []
    for chunk in split(stream, cuts):
        decoder.receive_data(chunk)
        while (event := decoder.next_event()) is not NEED_DATA:
            if isinstance(event, FrameHead):
                skip = skips[len(decided)] if len(decided) < len(skips) else False
                decided.append(skip)
                if skip:
                    decoder.skip_frame()
                    out.append("skipped")
                continue
            out.append((event.header, bytes(event.body)))
    assert len(out) == len(frames) and len(decided) <= len(frames)
    for got, (header, body) in zip(out, frames):
        assert got == "skipped" or got == (header, body)
    assert decoder.buffered == 0 and decoder.announced_frame_len == 0


@SETTINGS
@given(st.lists(st.tuples(headers, st.binary(max_size=300)), min_size=1, max_size=6), st.binary(max_size=40),
       st.lists(st.integers(0, 5000), max_size=10), st.lists(st.booleans(), max_size=6), st.integers(0, 400),
       st.booleans())
def test_used_up_and_held_say_what_next_event_and_the_buffer_would(frames, garbage, cuts, skips, max_body, eof):
    """The connection's shortcuts (metaq/server/connection.py): ``used_up()`` is True exactly when
    ``next_event`` would say NEED_DATA with nothing buffered, and ``held`` is the larger of what is
    buffered and the announced frame's length, in any state (skipping, broken, closed, a frame half in)."""
    stream = b"".join(encode_frame(h, b) for h, b in frames) + garbage
    decoder = FrameDecoder(max_body=max_body, announce_heads=True)
    announced = 0
    for chunk in split(stream, cuts) + ([b""] if eof else []):
        decoder.receive_data(chunk)
        for _ in range(10_000):
            assert decoder.held == max(decoder.buffered, decoder.announced_frame_len)
            predicted = decoder.used_up()
            event = decoder.next_event()
            assert predicted == (event is NEED_DATA and decoder.buffered == 0), (predicted, event)
            if event is NEED_DATA or event is CLOSED or isinstance(event, ProtocolError):
                break
            if isinstance(event, FrameHead):
                if announced < len(skips) and skips[announced]:
                    decoder.skip_frame()
                announced += 1
        else:
            raise AssertionError("decoder made no progress")
