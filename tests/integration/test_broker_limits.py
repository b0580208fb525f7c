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


# --- open files ---------------------------------------------------------------------------


def _limited(broker: BrokerProcess, soft: int, hard: int) -> BrokerProcess:
    """Run ``broker`` under an open-file limit of its own (prlimit execs: the pid is the broker's)."""
    broker.command_prefix = ["prlimit", f"--nofile={soft}:{hard}"]
    return broker


def test_the_soft_open_file_limit_is_raised_to_the_hard_one_at_start(tmp_path: Path) -> None:
    broker = _limited(BrokerProcess(tmp_path, "127.0.0.1:1", 0, topics={"t": 4}, zookeeper=NO_ZK), 256, 4096)
    try:
        broker.start(wait_zk=False)
        assert "open-file limit (RLIMIT_NOFILE): soft 4096, hard 4096" in broker.log_text()
        assert resource.prlimit(broker.pid, resource.RLIMIT_NOFILE) == (4096, 4096)
    finally:
        broker.stop()


def test_a_broker_whose_partitions_cannot_fit_the_open_file_limit_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    # 300 partitions (one segment each, +10%) beside maxConnections=1024 need ~1,420 open files.
    broker = _limited(BrokerProcess(tmp_path, "127.0.0.1:1", 0, topics={"t": 300}, zookeeper=NO_ZK), 1024, 1400)
    broker.start(wait=False)
    assert broker._process is not None
    assert broker._process.wait(60) == 1
    text = broker.log_text()
    assert "Traceback" not in text
    line = next(line for line in text.splitlines() if "cannot run" in line)
    assert "300 partitions and maxConnections=1024 need about 1418 open files" in line
    assert "open-file limit (RLIMIT_NOFILE) is 1400" in line and "raise the hard limit" in line
    # Fewer connections leave room for them: the same partitions start.
    broker = _limited(BrokerProcess(tmp_path, "127.0.0.1:1", 1, topics={"t": 300}, zookeeper=NO_ZK,
                                    system={"maxConnections": 256}), 1024, 1400)
    try:
        broker.start(wait_zk=False, timeout=60)
    finally:
        broker.stop()


def test_a_topic_create_or_alter_that_cannot_fit_the_open_file_limit_is_refused(broker_factory, zk, zk_root, capsys) -> None:
    from metaq.zk.paths import ZkPaths
    from metaq.zk.topic_config import read_group_topics, update_group_topics

    from .replication_support import put, stat, wait_for
    from .test_topics_cli import metaq, serves

    # 64 base + 16 connections + 1.1 per partition: 250 open files hold about 150 partitions.
    master = broker_factory(0, {"t": 10}, {"maxConnections": 16}, start=False)
    _limited(master, 250, 250).start()
    assert int(stat(master, "open_files_limit")) == 250 and int(stat(master, "open_files_needed")) == 91
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "big", "--partitions", "200")
    assert code == 1 and "cannot hold 200 more partition(s) open" in out and "RLIMIT_NOFILE) is 250" in out, out
    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "big", "--partitions", "100")
    assert code == 0, out
    code, out = metaq(capsys, zk, zk_root, "topics", "alter", "--broker-id", "0", "--topic", "big", "--partitions", "160")
    assert code == 1 and "cannot hold 60 more partition(s) open" in out, out
    assert serves(master, "big") == 100

    # Written past the tool (another version's, by hand): the broker does not apply it and says
    # why; what it served goes on serving.
    from metaq.zk.session import zk_session

    with zk_session(zk.connect_string) as client:
        paths = ZkPaths(zk_root)
        update_group_topics(client, paths, 0, lambda group: group.with_topic("big", {"numPartitions": "300"}))
        assert read_group_topics(client, paths, 0).topics["big"]["numPartitions"] == "300"
    wait_for(lambda: "not applying version" in master.log_text(), 15, "the refusal line")
    line = next(line for line in master.log_text().splitlines() if "not applying version" in line)
    assert "need about" in line and "open-file limit (RLIMIT_NOFILE) is 250" in line
    assert serves(master, "big") == 100
    assert put(master, "big", 99, 5)
    assert "Too many open files" not in master.log_text()
