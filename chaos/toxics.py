"""Toxics of the fault proxy: their types, parsing from API JSON, and what each does to data.

Attributes as in Toxiproxy 2.x ("upstream" = client -> server, "downstream" = server -> client):

* ``latency`` {latency, jitter} ms: every chunk is delivered ``latency +- jitter`` after it
  was read (chunks are pipelined: a delay, not a throughput cap).
* ``bandwidth`` {rate} KB/s (1 KB = 1000 bytes): bytes pass at most at that rate.
* ``slow_close`` {delay} ms: the close of the stream is delayed.
* ``timeout`` {timeout} ms: no data passes while the toxic is active (it is held, and flows
  again when the toxic is removed); the connection is closed ``timeout`` ms after the toxic
  became active on it. ``timeout=0`` holds forever and never closes.
* ``reset_peer`` {timeout} ms: data in the stream is dropped and ``timeout`` ms after the
  toxic became active the connection is reset (RST: SO_LINGER 0) on both sides.
* ``slicer`` {average_size, size_variation} bytes, {delay} microseconds: chunks are cut
  into slices of ``average_size +- size_variation`` bytes with ``delay`` between them.
* ``limit_data`` {bytes}: the connection is closed once that many bytes have passed in
  the stream (exactly ``bytes`` are delivered).

The pure parts live here (which toxics exist, validation, the delay of a chunk, how a chunk
is cut and paced); holding, dropping, closing and resetting connections is in
``chaos.proxy_link``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

STREAMS = ("upstream", "downstream")
TOXIC_TYPES: dict[str, dict[str, int]] = {
    # type -> attribute defaults
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}

# A chunk on its way out: (bytes, seconds to sleep before writing them).
Pieces = list[tuple[bytes, float]]


class ApiError(Exception):
    """An API error with its HTTP status (the reply is ``{"error": message, "status": status}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, Any]
    serial: int = 0  # identifies this toxic instance (for per-connection toxicity draws)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }

    def attr(self, key: str) -> float:
        return float(self.attributes.get(key, 0) or 0)


_serials = iter(range(1, 1 << 62))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{what} must be a number, got {value!r}")
    return value


def parse_toxic(body: Any, existing: Toxic | None = None) -> Toxic:
    """Build (or, with ``existing``, update) a toxic from request JSON; ApiError 400 if bad."""
    if not isinstance(body, dict):
        raise ApiError(400, "bad request body: expected a JSON object")
    if existing is None:
        ttype = body.get("type")
        if ttype not in TOXIC_TYPES:
            raise ApiError(400, f"invalid toxic type: {ttype!r}")
        stream = body.get("stream") or "downstream"
        if stream not in STREAMS:
            raise ApiError(400, f"invalid stream: {stream!r} (upstream or downstream)")
        name = body.get("name") or f"{ttype}_{stream}"
        if not isinstance(name, str):
            raise ApiError(400, "toxic name must be a string")
        attributes = dict(TOXIC_TYPES[ttype])
        toxicity = 1.0
    else:
        ttype, stream, name = existing.type, existing.stream, existing.name
        attributes = dict(existing.attributes)
        toxicity = existing.toxicity
    if "toxicity" in body and body["toxicity"] is not None:
        toxicity = float(_number(body["toxicity"], "toxicity"))
        if not 0.0 <= toxicity <= 1.0:
            raise ApiError(400, f"toxicity must be within 0..1, got {toxicity}")
    attrs = body.get("attributes")
    attrs = {} if attrs is None else attrs  # absent or null: the defaults; [] is no object either
    if not isinstance(attrs, dict):
        raise ApiError(400, "attributes must be a JSON object")
    for key, value in attrs.items():
        if key not in TOXIC_TYPES[ttype]:
            continue  # Toxiproxy ignores unknown attributes
        if _number(value, f"attribute {key}") < 0:
            raise ApiError(400, f"attribute {key} must not be negative")
        attributes[key] = value
    return Toxic(name, ttype, stream, toxicity, attributes, serial=next(_serials))



def latency_delay(toxics: list[Toxic], rng: random.Random) -> float:
    """Seconds a chunk is held after it was read: the sum of the latency toxics, jitter drawn."""
    delay = 0.0
    for toxic in toxics:
        if toxic.type == "latency":
            jitter = toxic.attr("jitter")
            delay += (toxic.attr("latency") + (rng.uniform(-jitter, jitter) if jitter else 0.0)) / 1000.0
    return delay


def data_limit(toxics: list[Toxic]) -> int | None:
    """The byte budget of a stream (the smallest ``limit_data``), or None."""
    caps = [int(t.attr("bytes")) for t in toxics if t.type == "limit_data"]
    return min(caps) if caps else None


def shape(data: bytes, toxics: list[Toxic], rng: random.Random) -> Pieces:
    """Cut a chunk (slicers) and pace it (bandwidth), in that order."""
    pieces: Pieces = [(data, 0.0)]
    for toxic in toxics:
        if toxic.type == "slicer":
            pieces = slice_pieces(pieces, toxic, rng)
    for toxic in toxics:
        if toxic.type == "bandwidth" and toxic.attr("rate") > 0:
            pieces = throttle(pieces, toxic.attr("rate") * 1000.0)
    return pieces


def slice_pieces(pieces: Pieces, toxic: Toxic, rng: random.Random) -> Pieces:
    average = max(1, int(toxic.attr("average_size")))
    variation = int(toxic.attr("size_variation"))
    gap = toxic.attr("delay") / 1_000_000.0
    out: Pieces = []
    for data, before in pieces:
        pos, first = 0, True
        while pos < len(data):
            size = max(1, average + (rng.randint(-variation, variation) if variation else 0))
            out.append((data[pos : pos + size], before if first else gap))
            pos += size
            first = False
    return out


def throttle(pieces: Pieces, bytes_per_s: float) -> Pieces:
    step = max(1, int(bytes_per_s / 10))  # at most 100 ms worth per write
    out: Pieces = []
    carry = 0.0
    for data, before in pieces:
        carry += before
        for pos in range(0, len(data), step):
            chunk = data[pos : pos + step]
            # Sleep before each write for the time the *previous* bytes took.
            out.append((chunk, carry))
            carry = len(chunk) / bytes_per_s
    if out and carry:
        out.append((b"", carry))  # pay for the last chunk before the next one
    return out
