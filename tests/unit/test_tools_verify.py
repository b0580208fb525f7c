"""metaq/tools/verify.py against in-memory logs: bisection to the first differing byte, prefix rules."""

from __future__ import annotations

import asyncio
import random
import zlib
from types import SimpleNamespace

import pytest

from metaq.server.stats import encode_map
from metaq.tools.verify import compare_partition, first_difference


class FakeConn:
    """Answers ``checksum`` and ``stats {topic}`` from a bytes object starting at ``base``."""

    def __init__(self, data: bytes, base: int = 0, corrupt_from: int | None = None) -> None:
        self.data, self.base, self.calls = data, base, 0
        self.corrupt_from = corrupt_from  # what ``stats offsets`` says the broker's scrub found
        self.address = "fake:1"

    async def request(self, header, body=b"", timeout=None):  # noqa: ANN001
        self.calls += 1
        end_of_log = self.base + len(self.data)
        if header["op"] == "stats":
            assert header["format"] == "map"
            row = {"min_offset": self.base, "max_offset": end_of_log, "committed": 0, "flushed": 0}
            if self.corrupt_from is not None:
                row["corrupt_from"] = self.corrupt_from
            return SimpleNamespace(header={"code": 200, "format": "map"}, body=encode_map([(f"{header['item']}-0-0", row)]))
        start, end = header["start"], min(header["end"], end_of_log)
        crc = zlib.crc32(self.data[start - self.base : end - self.base])
        return SimpleNamespace(header={"code": 200, "crc": crc, "start": start, "end": end}, body=b"")


def run(coro):  # noqa: ANN001
    return asyncio.run(coro)


@pytest.mark.parametrize("where", [0, 1, 4095, 4096, 100_000, 299_999])
def test_first_difference_finds_the_exact_byte(where):
    data = random.Random(where).randbytes(300_000)
    other = bytearray(data)
    other[where] ^= 0xFF
    found = run(first_difference(FakeConn(data), FakeConn(bytes(other)), "t", 0, 0, len(data), chunk=64 * 1024))
    assert found is not None
    (lo, hi), byte = found
    assert byte == where and lo <= where < hi and hi - lo <= 4096


def test_identical_ranges_have_no_difference():
    data = bytes(range(256)) * 1000
    assert run(first_difference(FakeConn(data), FakeConn(data), "t", 0, 0, len(data), chunk=10_000)) is None


def test_prefix_is_ok_and_longer_slave_is_not():
    master = random.Random(1).randbytes(50_000)
    ok = run(compare_partition(FakeConn(master), FakeConn(master[:30_000]), "t", 0, 0, "slave0"))
    assert ok.status == "ok" and ok.compared_bytes == 30_000
    ahead = run(compare_partition(FakeConn(master[:30_000]), FakeConn(master), "t", 0, 0, "slave0"))
    assert ahead.status == "ahead" and ahead.diff_offset == 30_000
    bad = bytearray(master[:40_000])
    bad[12_345] ^= 1
    diverged = run(compare_partition(FakeConn(master), FakeConn(bytes(bad)), "t", 0, 0, "slave0"))
    assert diverged.status == "diverged" and diverged.diff_offset == 12_345
    assert "12345" in diverged.describe()


def test_only_the_common_range_is_compared():
    log = random.Random(2).randbytes(20_000)
    # The master's retention dropped its first 5000 bytes; the slave still has them.
    result = run(compare_partition(FakeConn(log[5000:], base=5000), FakeConn(log), "t", 0, 0, "slave0"))
    assert result.status == "ok" and result.compared_bytes == 15_000 and "no longer on the master" in result.detail


def test_corrupt_bytes_a_broker_found_are_reported_with_their_offset_not_compared():
    master = random.Random(2).randbytes(50_000)
    on_master = run(compare_partition(FakeConn(master, corrupt_from=12_000), FakeConn(master), "t", 0, 0, "slave1"))
    assert on_master.status == "corrupt" and not on_master.ok and on_master.diff_offset == 12_000
    assert "the master holds corrupt bytes from offset 12000" in on_master.describe()
    on_slave = run(compare_partition(FakeConn(master), FakeConn(master, corrupt_from=700), "t", 0, 0, "slave1"))
    assert on_slave.status == "corrupt" and "slave1 holds corrupt bytes from offset 700" in on_slave.describe()
    assert "re-fetched from the master" in on_slave.describe()
