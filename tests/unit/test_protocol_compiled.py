"""The request path compiled (metaq/_speedups.c) and in pure Python: the same events, bytes,
requests and errors.

``FrameDecoder`` takes a whole frame through ``frame_at``, ``encode_frame`` packs through
``pack_frame`` and ``parse_request`` builds through ``request_from`` when the module is built;
each hands anything unusual back to the Python code. tests/unit/test_protocol.py and
test_messages.py run every case against both (the ``both_implementations`` fixture below);
the Hypothesis tests here feed both the same headers, damaged frames and random bytes, cut
in any pieces, and require the same result.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.protocol import frames, messages
from metaq.protocol.codes import RequestError
from metaq.protocol.frames import CLOSED, NEED_DATA, PREFIX, Frame, FrameDecoder, encode_frame
from metaq.protocol.messages import parse_request

COMPILED = frames.frame_at, frames.pack_frame, messages.request_from
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def pure_python() -> Iterator[None]:
    with mock.patch.object(frames, "frame_at", None), mock.patch.object(frames, "pack_frame", None), \
            mock.patch.object(messages, "request_from", None):
        yield


@pytest.fixture(params=["compiled", "python"])
def both_implementations(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test once with the compiled request path and once in pure Python."""
    if request.param == "compiled":
        if COMPILED[0] is None:
            pytest.skip("metaq._speedups is not built (python setup.py build_ext --inplace)")
        yield request.param
    else:
        with pure_python():
            yield request.param


def both(function, *args):  # noqa: ANN001, ANN201
    """``function(*args)`` compiled and in pure Python: the outcomes (result or error), which must be equal."""
    outcomes = []
    for context in (contextmanager(lambda: iter([None])), pure_python):
        with context():
            try:
                outcomes.append(("result", function(*args)))
            except Exception as exc:  # noqa: BLE001  (the same type and message, whatever it is)
                outcomes.append(("error", type(exc), str(exc)))
    assert outcomes[0] == outcomes[1]
    return outcomes[0]


needs_compiled = pytest.mark.skipif(COMPILED[0] is None, reason="metaq._speedups is not built")

#: Where msgpack changes format (fix / 8 / 16 / 32 / 64-bit forms), and one past each end.
EDGES = [0, 15, 16, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.sampled_from(EDGES + [-1 - n for n in EDGES]),
    st.sampled_from([-32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1]), st.text(max_size=10),
    st.binary(max_size=10), st.sampled_from(EDGES[:11]).map(lambda n: "\u00e9" * (n // 2) + "a" * (n % 2)),
    st.sampled_from(EDGES[:11]).map(bytes), st.floats(allow_nan=False), st.just("\ud800"),  # a surrogate: msgpack refuses it
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner), st.dictionaries(st.text(max_size=4), inner, max_size=3),
                            st.sampled_from([15, 16]).map(lambda n: list(range(n))),
                            st.sampled_from([15, 16]).map(lambda n: {str(i): i for i in range(n)})),
    max_leaves=8,
)
headers = st.dictionaries(st.one_of(st.text(max_size=10), st.integers(0, 3)), values, max_size=5)


@needs_compiled
def test_the_common_frames_go_through_the_compiled_path() -> None:
    """Not only the same results: the compiled code answers the frames the broker serves most."""
    put = {"op": "put", "opaque": 2**40, "topic": "t", "partition": 0, "count": 1}
    fetch = {"op": "get", "opaque": 7, "topic": "t", "partition": 3, "offset": 2**35, "max_size": 1 << 20,
             "replica": {"slave_id": 2, "epoch": 9, "log_end": 2**35}}
    reply = {"opaque": 7, "code": 200, "msg": "x" * 300, "entries": [[1, 0], [2, -5]], "data": b"\0" * 70_000}
    for header in (put, fetch, reply):
        wire = frames.pack_frame(header, b"body")
        assert wire == frames.PREFIX.pack(0xCA, 1, len(msgpack.packb(header)), 4) + msgpack.packb(header) + b"body"
        frame, end = frames.frame_at(bytearray(b"zz" + wire), 2, 1 << 20, 1 << 20, Frame)
        assert frame == Frame(header, bytearray(b"body")) and end == 2 + len(wire)
    request = messages.request_from(messages.GetRequest, messages._fields(messages.GetRequest), fetch, b"")
    assert vars(request) == vars(parse_request(Frame(fetch, bytearray())))
    assert frames.pack_frame({"x": 1.5}, b"") is None and frames.pack_frame({"x": 2**64}, b"") is None


EDGE_VALUES = [
    *EDGES, *(-1 - n for n in EDGES), -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1,
    *("\u00e9" * (n // 2) + "a" * (n % 2) for n in EDGES[:11]), *(bytes(n) for n in EDGES[:11]),
    *(list(range(n)) for n in (15, 16, 65536)), *({str(i): i for i in range(n)} for n in (15, 16, 65536)), (1, "a"),
    None, True, False, 1.5, "\ud800", {1: 2},
]


@needs_compiled
@pytest.mark.parametrize("value", EDGE_VALUES, ids=range(len(EDGE_VALUES)))
def test_both_encode_each_format_edge_alike(value) -> None:
    outcome = both(encode_frame, {"v": value, "opaque": 1}, b"x")
    if outcome[0] == "result":  # and read back alike
        both(events_of, [outcome[1]], 1 << 20, 1 << 20, False)


def test_only_commands_whose_init_just_sets_fields_are_built_in_c() -> None:
    assert messages._PLAIN_INIT == frozenset(messages.REQUESTS.values())  # every command today

    @dataclass(kw_only=True, eq=False)
    class Remembered(messages.Request, operation=None):
        name: str = messages.required(str)

        def __post_init__(self) -> None:
            self.seen = True

    @dataclass(kw_only=True, eq=False)
    class Written(messages.Request, operation=None):
        name: str = messages.required(str)

        def __init__(self, **fields) -> None:  # noqa: ANN003
            self.__dict__.update(fields, seen=True)

    assert not messages._sets_only_its_fields(Remembered) and not messages._sets_only_its_fields(Written)
    assert messages._sets_only_its_fields(messages.PutRequest)


@needs_compiled
@SETTINGS
@given(headers, st.binary(max_size=50))
def test_both_encode_any_header_alike(header, body) -> None:
    both(encode_frame, header, body)
    both(encode_frame, header, memoryview(bytearray(body)))


def events_of(chunks: list[bytes], max_header: int, max_body: int, announce: bool) -> list[object]:
    decoder = FrameDecoder(max_body=max_body, max_header=max_header, announce_heads=announce)
    out: list[object] = []
    for chunk in chunks + [b""]:
        decoder.receive_data(chunk)
        while (event := decoder.next_event()) is not NEED_DATA and event is not CLOSED:
            out.append(event)
            if isinstance(event, frames.ProtocolError):
                return out
            if isinstance(event, frames.FrameHead) and event.body_len > 40:
                decoder.skip_frame()
    return out


def cut(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(wire) + 1) for c in cuts}) + [len(wire)]
    return [wire[a:b] for a, b in zip([0] + points, points) if b > a]


@needs_compiled
@SETTINGS
@given(st.lists(st.tuples(headers, st.binary(max_size=80)), min_size=1, max_size=4), st.data())
def test_both_decoders_give_the_same_events_for_damaged_frames_in_any_pieces(frames_, data) -> None:
    wire = bytearray()
    for header, body in frames_:
        try:
            wire += encode_frame(header, body)
        except Exception:  # noqa: BLE001  (a header msgpack cannot pack: its raw bytes as a header)
            packed = repr(header).encode()
            wire += PREFIX.pack(0xCA, 1, len(packed), len(body)) + packed + body
    for _ in range(data.draw(st.integers(0, 3))):
        if wire:
            wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    chunks = cut(bytes(wire), data.draw(st.lists(st.integers(0, 10_000), max_size=4)))
    limits = data.draw(st.sampled_from([(1 << 16, 1 << 26), (30, 40), (0, 0)]))
    both(events_of, chunks, *limits, data.draw(st.booleans()))


@needs_compiled
@SETTINGS
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=3))
def test_both_decoders_give_the_same_events_for_random_bytes(junk, cuts) -> None:
    both(events_of, cut(b"\xca\x01" + junk, cuts), 1 << 16, 1 << 26, True)
    both(events_of, cut(junk, cuts), 1 << 16, 1 << 26, False)


def parsed(header: dict, body: bytes) -> tuple:
    try:
        request = parse_request(Frame(header, bytearray(body)))
    except RequestError as exc:
        return "refused", exc.code, exc.message, exc.opaque
    return type(request), vars(request)


request_headers = st.fixed_dictionaries(
    {"op": st.sampled_from(sorted(messages.REQUESTS) + ["nope", 5])},
    optional={
        name: st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.text(max_size=5), st.floats(allow_nan=False),
                        st.dictionaries(st.text(max_size=8), st.integers(), max_size=3))
        for name in {"opaque", "topic", "partition", "offset", "count", "max_size", "replica", "item", "format",
                     "action", "xid", "producer_id", "producer_epoch", "sequence", "txid", "epoch", "start", "end",
                     "group", "max_wait_ms", "timeout_s", "producer_token", "transactional_id"}
    },
)


@needs_compiled
@SETTINGS
@given(request_headers, st.binary(max_size=10))
def test_both_parse_any_request_header_alike(header, body) -> None:
    both(parsed, header, body)
