"""Corrupting a broker's files on disk: bit flips in committed records, truncated segments.

What the corruption faults of ``python -m chaos run --corruption`` do to a broker's data
directory (chaos/scenarios.py, ``corrupt-master`` / ``corrupt-slave``), and what the short
chaos test uses on a running broker (tests/chaos/test_chaos_corruption.py):

* ``flip_bit``: one bit of one byte of a record's **payload**, in a record the broker
  already flushed (below its ``flushed-end-checkpoint``), in a sealed segment if the
  partition has one (``sealed_only``: only there, for a broker that is running: its active
  segment is being appended to). The payload is what the record's CRC covers; the 8-byte
  msg id in the header is not covered by any CRC in MetaQ's format, so a flip there is
  not detectable from one copy and is not injected (docs/chaos.md says so).
* ``truncate_segment``: cut bytes off the end of a sealed segment: the segments are no
  longer contiguous, and the broker refuses that partition at start (docs/storage.md,
  "Lost segment files") until an operator restores the file.

The file is written in place with ``pwrite`` + ``fsync``, like a disk returning other bytes
than were written: a running broker reads the new bytes through its own descriptor.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from metaq import record
from metaq.store.checkpoint import read_flushed_end
from metaq.store.segment import parse_segment_start


@dataclass
class Corruption:
    kind: str  # "flip" | "truncate"
    file: str
    #: flip: the record whose payload got the flipped bit, and the flipped byte's offset;
    #: truncate: the segment's old and new end.
    record_offset: int
    offset: int
    bit: int = 0

    def to_json(self) -> dict[str, Any]:
        """Details of a fault in the run's history (where ``kind`` is the fault kind's name)."""
        details = asdict(self)
        return {"corruption": details.pop("kind"), **details}

    def __str__(self) -> str:
        if self.kind == "flip":
            return f"bit {self.bit} flipped at offset {self.offset} (record at {self.record_offset}) in {self.file}"
        return f"{self.file} cut from offset {self.record_offset} to {self.offset}"


def _segments(directory: Path) -> list[tuple[int, Path]]:
    found = ((parse_segment_start(p), p) for p in directory.iterdir())
    return sorted((start, p) for start, p in found if start is not None)


def _partition_dirs(data_dir: Path, topic: str | None) -> list[Path]:
    dirs = []
    for directory in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        name, _, n = directory.name.rpartition("-")
        if n.isdigit() and (topic is None or name == topic) and _segments(directory):
            dirs.append(directory)
    return dirs


def _payloads(path: Path, start: int, limit: int) -> list[tuple[int, int, int]]:
    """``(record offset, payload offset, payload length)`` of the whole records that end at or before ``limit``."""
    found = []
    with open(path, "rb") as f:
        data = f.read(max(0, limit - start))
    for ends_run in record.walk_records(record.buffer_reader(data, start), start, start + len(data), boundaries_only=True):
        assert ends_run.ends is not None
        begin = ends_run.offset
        for end in ends_run.ends:
            if end - begin > record.HEADER_SIZE:
                found.append((begin, begin + record.HEADER_SIZE, end - begin - record.HEADER_SIZE))
            begin = end
    return found


def flip_bit(data_dir: Path, rng: random.Random, topic: str | None = None, sealed_only: bool = False) -> Corruption | None:
    """Flip one payload bit of a flushed record in one of the broker's partitions; None if
    no partition has such a record (nothing flushed yet, or no sealed segment with ``sealed_only``)."""
    candidates: list[tuple[Path, int, int]] = []  # (segment, its start, how far records may be hit)
    for directory in _partition_dirs(data_dir, topic):
        segments = _segments(directory)
        flushed = read_flushed_end(directory) or 0
        sealed = segments[:-1]
        pool = sealed if sealed or sealed_only else segments
        for i, (start, path) in enumerate(pool):
            size = path.stat().st_size
            limit = start + size if i < len(segments) - 1 else min(start + size, flushed)
            if limit > start:
                candidates.append((path, start, limit))
    rng.shuffle(candidates)
    for path, start, limit in candidates:
        payloads = _payloads(path, start, limit)
        if not payloads:
            continue
        record_offset, payload, length = rng.choice(payloads)
        offset, bit = payload + rng.randrange(length), rng.randrange(8)
        fd = os.open(path, os.O_RDWR)
        try:
            byte = os.pread(fd, 1, offset - start)[0]
            os.pwrite(fd, bytes([byte ^ (1 << bit)]), offset - start)
            os.fsync(fd)
        finally:
            os.close(fd)
        return Corruption("flip", str(path), record_offset, offset, bit)
    return None


def truncate_segment(data_dir: Path, rng: random.Random, topic: str | None = None) -> Corruption | None:
    """Cut a random number of bytes (at least one record's worth) off a sealed segment's end;
    None if no partition has a sealed segment."""
    sealed = [seg for directory in _partition_dirs(data_dir, topic) for seg in _segments(directory)[:-1]]
    sealed = [(start, path) for start, path in sealed if path.stat().st_size > 0]
    if not sealed:
        return None
    start, path = rng.choice(sealed)
    size = path.stat().st_size
    keep = rng.randrange(size)
    os.truncate(path, keep)
    return Corruption("truncate", str(path), start + size, start + keep)
