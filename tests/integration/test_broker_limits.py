"""A broker's limits against real processes: a bounded stop whatever the scrub is reading,
and open-file limits that are raised at start or refused with one clear line."""

from __future__ import annotations

import resource
import time
from pathlib import Path

from metaq import record
from metaq.store.log import PartitionLog
from metaq.tools.launcher import BrokerProcess, wait_until

NO_ZK = {"zk.zkEnable": "false"}
#: A SIGTERM'd broker is gone within this many seconds, whatever its background threads do.
STOP_BOUND_S = 6.0


def _fill_sealed_segments(directory: Path, mib: int, segment_mib: int) -> None:
    """``mib`` MiB of valid records in segments of ``segment_mib`` MiB (all but the last sealed)."""
    chunk = record.encode_batch([(b"s" * (64 * 1024 - 64), None)] * 16)  # ~1 MiB per append
    log_ = PartitionLog(directory, max_segment_size=segment_mib * 1024 * 1024)
    for _ in range(mib):
        log_.append(chunk)
    log_.flush()
    assert len(log_.segments) >= 2
    log_.close()


def test_sigterm_stops_a_broker_promptly_while_the_scrub_reads_a_large_sealed_segment(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, "127.0.0.1:1", 0, topics={"t": 1}, zookeeper=NO_ZK,
                           system={"maxSegmentSize": 64 * 1024 * 1024, "scrubBytesPerSecond": 1024 * 1024})
    # 64 MiB sealed at 1 MiB/s: the scrub's read of that one segment alone would take a minute.
    _fill_sealed_segments(broker.dir / "data" / "t-0", 72, 64)
    try:
        broker.start(wait_zk=False)
        time.sleep(1.5)  # the scrub's first pass starts with the broker and is inside the segment now
        assert broker.alive
        started = time.monotonic()
        broker.stop(timeout=60)
        took = time.monotonic() - started
    finally:
        broker.kill()
    assert took < STOP_BOUND_S, f"stop took {took:.1f} s"
    assert "broker 0 stopped" in broker.log_text()
