"""The sans-IO frame decoder and command parsing, without sockets."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.protocol import commands as c
from metaq.protocol.frames import (
    CLOSED,
    MAGIC,
    NEED_DATA,
    PREFIX,
    BadFrame,
    Frame,
    FrameDecoder,
    FrameHead,
    OversizedFrame,
    ProtocolError,
    TextLine,
    encode_frame,
)

from tests.unit.test_protocol_compiled import both_implementations  # noqa: F401  (a fixture)

#: Every case runs with the compiled request path and in pure Python (metaq/_speedups.c).
pytestmark = pytest.mark.usefixtures("both_implementations")


def events(decoder: FrameDecoder) -> list:
    out = []
    while True:
        event = decoder.next_event()
        if event is NEED_DATA or event is CLOSED:
            return out
        out.append(event)
        if isinstance(event, ProtocolError):
            return out


def test_frame_round_trip_byte_by_byte():
    wire = encode_frame({"op": "put", "opaque": 7, "topic": "t"}, b"body") + encode_frame({"op": "version", "opaque": 8})
    decoder = FrameDecoder()
    got = []
    for i in range(len(wire)):
        decoder.receive_data(wire[i : i + 1])
        got.extend(events(decoder))
    assert got == [
        Frame({"op": "put", "opaque": 7, "topic": "t"}, bytearray(b"body")),
        Frame({"op": "version", "opaque": 8}, bytearray()),
    ]


def test_pipelined_frames_in_one_chunk():
    wire = b"".join(encode_frame({"op": "get", "opaque": i}) for i in range(100))
    decoder = FrameDecoder()
    decoder.receive_data(wire)
    assert [e.header["opaque"] for e in events(decoder)] == list(range(100))


def test_body_is_mutable_copy():
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame({"op": "put", "opaque": 1}, b"abc"))
    (frame,) = events(decoder)
    frame.body[0] = ord("x")
    assert frame.body == bytearray(b"xbc")


def test_text_commands_for_nc():
    decoder = FrameDecoder()
    decoder.receive_data(b"stats topics\r\nversion\nquit\n")
    assert events(decoder) == [TextLine(["stats", "topics"]), TextLine(["version"]), TextLine(["quit"])]


def test_text_line_too_long_is_fatal():
    decoder = FrameDecoder()
    decoder.receive_data(b"s" * 2000)
    (event,) = events(decoder)
    assert isinstance(event, ProtocolError) and "longer than" in event.message
    # Once broken, always broken: the stream has no frame boundaries any more.
    decoder.receive_data(encode_frame({"op": "version", "opaque": 1}))
    assert isinstance(decoder.next_event(), ProtocolError)


def test_garbage_start_byte_is_fatal():
    decoder = FrameDecoder()
    decoder.receive_data(b"\x00\x01\x02")
    (event,) = events(decoder)
    assert isinstance(event, ProtocolError) and "0x00" in event.message


def test_wrong_version_is_fatal():
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(MAGIC, 9, 0, 0))
    (event,) = events(decoder)
    assert isinstance(event, ProtocolError) and "version 9" in event.message


def test_bad_header_keeps_connection_usable():
    junk = b"\xc1\xc1"  # 0xc1 is never valid msgpack
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(MAGIC, 1, len(junk), 0) + junk + encode_frame({"op": "version", "opaque": 2}))
    first, second = events(decoder)
    assert isinstance(first, BadFrame)
    # msgpack's FormatError for 0xc1 has no text: the reply still names what was wrong.
    assert first.message == "frame header is not valid msgpack: FormatError"
    assert second == Frame({"op": "version", "opaque": 2}, bytearray())


def test_header_not_a_map():
    packed = msgpack.packb([1, 2])
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(MAGIC, 1, len(packed), 0) + packed)
    (event,) = events(decoder)
    assert isinstance(event, BadFrame) and "map" in event.message


def test_oversized_body_is_skipped_and_reported_with_opaque():
    decoder = FrameDecoder(max_body=10)
    big = encode_frame({"op": "put", "opaque": 5}, b"x" * 1000)
    decoder.receive_data(big[:50])
    (event,) = events(decoder)
    assert isinstance(event, OversizedFrame) and event.header["opaque"] == 5 and event.body_len == 1000
    # The rest of the body arrives in pieces and is discarded; the next frame parses.
    decoder.receive_data(big[50:500])
    assert events(decoder) == []
    decoder.receive_data(big[500:] + encode_frame({"op": "version", "opaque": 6}))
    assert events(decoder) == [Frame({"op": "version", "opaque": 6}, bytearray())]


def test_huge_header_is_fatal():
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(MAGIC, 1, 10**9, 0))
    (event,) = events(decoder)
    assert isinstance(event, ProtocolError) and "header" in event.message


def test_a_frame_still_arriving_is_announced_once_before_its_body_is_buffered():
    wire = encode_frame({"op": "put", "opaque": 1}, b"x" * 1000)
    decoder = FrameDecoder(announce_heads=True)
    decoder.receive_data(wire[:100])
    (head,) = events(decoder)
    assert isinstance(head, FrameHead) and head.header["op"] == "put" and head.body_len == 1000
    assert head.frame_len == len(wire) and decoder.announced_frame_len == len(wire)
    decoder.receive_data(wire[100:500])
    assert events(decoder) == []  # announced once
    decoder.receive_data(wire[500:])
    (frame,) = events(decoder)
    assert isinstance(frame, Frame) and frame.body == b"x" * 1000 and decoder.announced_frame_len == 0


def test_a_skipped_frame_is_never_buffered_and_the_next_one_decodes():
    big = encode_frame({"op": "put", "opaque": 1}, b"x" * 100_000)
    decoder = FrameDecoder(announce_heads=True)
    decoder.receive_data(big[:50])
    (head,) = events(decoder)
    decoder.skip_frame()
    for start in range(50, len(big), 4096):
        decoder.receive_data(big[start : start + 4096])
        assert decoder.buffered == 0 and events(decoder) == []
    decoder.receive_data(encode_frame({"op": "version", "opaque": 2}))
    (frame,) = events(decoder)
    assert frame.header == {"op": "version", "opaque": 2}


def test_without_announce_heads_a_whole_frame_is_the_only_event():
    decoder = FrameDecoder()
    wire = encode_frame({"op": "put", "opaque": 1}, b"abc")
    decoder.receive_data(wire[:-1])
    assert events(decoder) == []
    with pytest.raises(RuntimeError):
        decoder.skip_frame()
    decoder.receive_data(wire[-1:])
    assert [type(e) for e in events(decoder)] == [Frame]


def test_a_tightened_header_limit_is_fatal():
    decoder = FrameDecoder(max_header=16)
    decoder.receive_data(encode_frame({"op": "auth", "data": "y" * 100}))
    (event,) = events(decoder)
    assert isinstance(event, ProtocolError) and "limit of 16" in event.message


def test_eof_inside_frame_is_reported():
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame({"op": "put", "opaque": 1}, b"abcdef")[:-2])
    assert decoder.next_event() is NEED_DATA
    decoder.receive_data(b"")
    event = decoder.next_event()
    assert isinstance(event, ProtocolError) and "closed inside a frame" in event.message


def test_clean_eof():
    decoder = FrameDecoder()
    decoder.receive_data(b"")
    assert decoder.next_event() is CLOSED


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=1, max_value=40), max_size=20))
def test_decoder_never_raises_on_arbitrary_bytes(data, cuts):
    decoder = FrameDecoder(max_body=64)
    pos = 0
    for cut in cuts + [len(data)]:
        decoder.receive_data(data[pos : pos + cut])
        pos += cut
        events(decoder)
    decoder.receive_data(b"")
    events(decoder)


def test_parse_request_checks_fields():
    ok = c.parse_request(Frame({"op": "get", "opaque": 1, "topic": "t", "partition": 0, "offset": 5}, bytearray()))
    assert ok.topic == "t" and ok.max_size == 1024 * 1024 and ok.max_wait_ms == 0 and ok.replica is None
    with pytest.raises(c.RequestError, match="missing field 'offset'") as err:
        c.parse_request(Frame({"op": "get", "opaque": 3, "topic": "t", "partition": 0}, bytearray()))
    assert err.value.opaque == 3 and err.value.code == c.BAD_REQUEST
    with pytest.raises(c.RequestError, match="'partition' must be int"):
        c.parse_request(Frame({"op": "put", "opaque": 1, "topic": "t", "partition": "0"}, bytearray()))
    with pytest.raises(c.RequestError, match="must be int"):
        c.parse_request(Frame({"op": "put", "opaque": 1, "topic": "t", "partition": True}, bytearray()))
    with pytest.raises(c.RequestError, match="unknown command 'frobnicate'"):
        c.parse_request(Frame({"op": "frobnicate", "opaque": 1}, bytearray()))
    with pytest.raises(c.RequestError, match="opaque"):
        c.parse_request(Frame({"op": "version"}, bytearray()))


def test_text_request():
    assert c.text_request(["stats", "topics", "12"]).item == "topics"
    assert c.text_request(["VERSION"]).op == "version"
    with pytest.raises(c.RequestError, match="try: stats"):
        c.text_request(["put", "t"])
