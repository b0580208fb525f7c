"""Bit flips on a minority, under load, in a sync pair of real broker processes.

Group 0: A (master) and B (``--slave``, slaveId 1), sync mode, ``onSyncSlaveLoss=degrade``,
ZK session 1500 ms, 4 KiB segments (so sealed segments exist after ~50 messages) and a
scrub pass every 200 ms. chaos/corruption.py flips one payload bit of a flushed record in a
sealed segment, on disk, while the broker runs (a disk returning other bytes than written).
The promises (docs/guarantees.md, C1-C4):

* C1 a slave's flip: its scrub finds it, the slave cuts its log there and fetches the bytes
  again from A: B's log is a byte-identical prefix of A's again, every ack is readable on B.
* C2 a master's flip: A's scrub finds it and puts B's bytes back in place: both logs
  identical again, every ack readable on both.
* C1 a master alone (no slave to repair from): the range is never served (a get there is an
  error naming topic, partition and offsets; ``metaq verify --data-dir`` names it too).
* C6 a sealed segment cut short while its broker is down (a lost tail): it opens with the
  missing bytes marked like a flip's: a slave cuts there and fetches them again; a master
  (restarted alone) serves an error naming them, ``metaq verify --data-dir`` reports them
  MISSING, and it fills them from its slave once one is back.
* C7 a master's sealed segment cut short while it is down after a kill -9: the slave takes
  over with every ack, the old master cuts at the missing range and follows, byte-identical.
* C3 ``python -m chaos run --scenario corrupt-master --corruption``: kill -9, a flip on disk,
  restart: failover keeps every ack, the old master (now a slave) fetches the bytes again;
  the runner's workload and checker find no acked message lost.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.corruption import Corruption, flip_bit, truncate_segment
from metaq import record
from metaq.store.segment import parse_segment_start
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until

from ..integration.failover_support import (
    GROUP,
    TOPIC,
    ZK_SETTINGS,
    Group,
    PutStream,
    disk_log,
    disk_records,
    fetch_all,
    make_pair,
    missing_acks,
    sync_system,
    wait_follows,
    wait_leads,
)
from ..integration.replication_support import assert_identical, request, stat, stats_lines, wait_caught_up
from tests.chaos.run_support import Outcome, chaos_run, checked

pytestmark = pytest.mark.chaos
PARTS = [(TOPIC, 0)]
SYSTEM = sync_system(maxSegmentSize=4096, scrubIntervalMs=200)
#: From the flip to the repaired (slave) or refused (master) range: a scrub pass (200 ms apart,
#: reading a few KiB) and one replica fetch round; generous for a busy 2-core machine.
FOUND_WITHIN_S = 15.0
#: Every acked message is read back from a replica within this (the docs' stated bound).
READ_BOUND_S = 10.0


@pytest.fixture
def pair(broker_factory: BrokerFactory, zk_client: Any, zk_root: str) -> tuple[BrokerProcess, BrokerProcess, Group]:
    group = Group(zk_client, zk_root)
    return (*make_pair(broker_factory, SYSTEM, group), group)


def corrupt(broker: BrokerProcess, seed: int) -> Corruption:
    found = flip_bit(broker.dir / "data", random.Random(seed), TOPIC, sealed_only=True)
    assert found is not None, f"{broker.name} has no sealed segment to corrupt yet"
    print(f"\n{broker.name}: {found}")
    return found


def is_prefix(slave: BrokerProcess, master: BrokerProcess) -> bool:
    """Whether the slave's log files hold exactly the master's bytes at the same offsets."""
    try:
        (s_start, s_data), (m_start, m_data) = disk_log(slave), disk_log(master)
    except FileNotFoundError:  # a segment file went while being read (a repair cutting the log)
        return False
    return s_start == m_start and m_data[: len(s_data)] == s_data


def corrupt_from(broker: BrokerProcess) -> int:
    """Where ``stats offsets`` says the partition's first corrupt range starts (-1: none)."""
    row = next(line for line in stats_lines(broker, "offsets") if line.startswith(f"{TOPIC}-{GROUP}-0 "))
    return int(row.split("corrupt_from=")[1].split()[0]) if "corrupt_from=" in row else -1


def test_a_slaves_flipped_bit_is_fetched_again_from_the_master(pair) -> None:
    a, b, group = pair
    stream = PutStream(a.address, tag="c1").start()
    stream.wait_acked(300)  # ~6 sealed segments of 4 KiB
    flipped = corrupt(b, seed=1)
    started = time.monotonic()
    wait_until(lambda: is_prefix(b, a) and int(stat(b, "scrub_corrupt_ranges") or 0) >= 1, FOUND_WITHIN_S, interval=0.1,
               message="B to find the flipped bit and fetch the bytes again")
    print(f"B repaired {time.monotonic() - started:.2f}s after the flip")
    stream.wait_acked(len(stream.acked) + 50)  # acks go on: B stays in the sync set or rejoins it
    stream.stop()
    wait_caught_up(a, b, PARTS)
    assert_identical(a, slaves=1)
    assert any(p.name.startswith(f"truncated-{flipped.record_offset:020d}") for p in (b.dir / "data" / f"{TOPIC}-0").iterdir())
    assert not missing_acks(stream.acked, disk_records(b))
    readable_within(b, stream.acked)


def readable_within(broker: BrokerProcess, acks: list, bound_s: float = READ_BOUND_S) -> None:
    """Every ack is read back from ``broker`` within the bound (a slave shows what its master
    has told it is committed: the next fetch round brings the newest acks)."""
    started = time.monotonic()
    wait_until(lambda: not missing_acks(acks, fetch_all(broker)), bound_s, interval=0.1,
               message=f"every ack readable on {broker.name}")
    print(f"every ack readable on {broker.name} after {time.monotonic() - started:.2f}s")


def test_a_masters_flipped_bit_is_put_back_from_the_slave(pair) -> None:
    a, b, group = pair
    stream = PutStream(a.address, tag="c2").start()
    stream.wait_acked(300)
    flipped = corrupt(a, seed=2)
    started = time.monotonic()
    wait_until(lambda: int(stat(a, "scrub_corrupt_ranges") or 0) >= 1 and corrupt_from(a) == -1 and is_prefix(b, a),
               FOUND_WITHIN_S, interval=0.1, message="A to find the flipped bit and put B's bytes back")
    print(f"A repaired {time.monotonic() - started:.2f}s after the flip")
    stream.wait_acked(len(stream.acked) + 50)
    stream.stop()
    wait_caught_up(a, b, PARTS)
    assert is_prefix(a, b), "A's log is not B's byte for byte"
    assert_identical(a, slaves=1)
    readable_within(a, stream.acked)
    readable_within(b, stream.acked)
    assert flipped.record_offset in disk_records(a)


def test_a_slave_restarted_while_its_master_holds_a_corrupt_range_keeps_its_copy_and_gives_it_back(pair) -> None:
    """A rejoining slave compares its log with the master's (ha/truncation.py): the master's
    corrupt range must not count as a difference (before: B cut its good copy there, the only
    one, and then waited forever for bytes A refused to serve)."""
    a, b, group = pair
    stream = PutStream(a.address, tag="c4").start()
    stream.wait_acked(300)
    b.kill()  # no slave to repair from: A keeps the range unserved meanwhile
    flipped = corrupt(a, seed=4)
    wait_until(lambda: corrupt_from(a) == flipped.record_offset, FOUND_WITHIN_S, interval=0.1,
               message="A's scrub to find the flipped bit")
    stream.wait_acked(len(stream.acked) + 50)  # degrade: A acks alone
    b.start(wait_zk=False)
    wait_follows(b, a, group)
    wait_until(lambda: corrupt_from(a) == -1, FOUND_WITHIN_S, interval=0.1, message="A to put the bytes back from B")
    stream.stop()
    wait_caught_up(a, b, PARTS)
    assert not any(p.name.startswith("truncated-") for p in (b.dir / "data" / f"{TOPIC}-0").iterdir())
    assert_identical(a, slaves=1)
    readable_within(a, stream.acked)


def test_a_master_with_no_slave_to_repair_from_never_serves_its_flipped_bit(broker_factory, zk_client, zk_root) -> None:
    a = broker_factory(GROUP, {TOPIC: 1}, SYSTEM, name="A", zookeeper=ZK_SETTINGS)
    acked = PutStream(a.address, tag="c3").start()
    acked.wait_acked(300)
    acked.stop()
    flipped = corrupt(a, seed=3)
    wait_until(lambda: corrupt_from(a) >= 0, FOUND_WITHIN_S, interval=0.1, message="A's scrub to find the flipped bit")
    assert corrupt_from(a) == flipped.record_offset
    # Never garbage: a read of the record is an error naming it, a read before it stops short.
    reply = request(a, {"op": "get", "topic": TOPIC, "partition": 0, "offset": flipped.record_offset, "max_size": 4096})
    assert reply.code == 500 and reply.get("reason") == "corrupt", reply.header
    assert f"{TOPIC}-0: offset {flipped.record_offset} is in a corrupt byte range" in reply.message
    served = fetch_all(a)
    assert served and max(served) < flipped.record_offset
    assert not missing_acks([ack for ack in acked.acked if ack.offset < flipped.record_offset], served)
    # Reported offline too (the files of a running broker may be read): exit 1, the offset named.
    assert offline_bad_ranges(a, "corrupt") == [flipped.record_offset]


def offline_bad_ranges(broker: BrokerProcess, kind: str) -> list[int]:
    """Where ``metaq verify --data-dir`` says the partition's ranges of ``kind`` start (it must exit 1)."""
    offline = subprocess.run([sys.executable, "-m", "metaq", "verify", "--data-dir", str(broker.dir / "data"), "--json"],
                             capture_output=True, text=True, timeout=60)
    assert offline.returncode == 1, offline.stderr
    [partition] = json.loads(offline.stdout)["partitions"]
    return [bad["start"] for bad in partition["bad"] if bad["kind"] == kind]


def cut_short(broker: BrokerProcess, seed: int) -> int:
    """Cut one of a stopped broker's sealed segments short; where its missing range starts
    (the last whole record's end, as the store finds it)."""
    found = truncate_segment(broker.dir / "data", random.Random(seed), TOPIC)
    assert found is not None, f"{broker.name} has no sealed segment to cut yet"
    print(f"\n{broker.name}: {found}")
    path = Path(found.file)
    start = parse_segment_start(path)
    assert start is not None
    return max(record.record_ends(path.read_bytes(), start), default=start)


def test_a_slaves_segment_cut_short_while_it_was_down_is_fetched_again(pair) -> None:
    a, b, group = pair
    stream = PutStream(a.address, tag="c6").start()
    stream.wait_acked(300)
    b.kill()
    missing_from = cut_short(b, seed=6)
    b.start(wait_zk=False)  # before: the partition was refused at start (segments not contiguous)
    started = time.monotonic()
    wait_until(lambda: is_prefix(b, a) and corrupt_from(b) == -1, FOUND_WITHIN_S, interval=0.1,
               message="B to cut its log at the missing bytes and fetch them again")
    print(f"B repaired {time.monotonic() - started:.2f}s after its start")
    stream.wait_acked(len(stream.acked) + 50)
    stream.stop()
    wait_caught_up(a, b, PARTS)
    assert_identical(a, slaves=1)
    assert any(p.name.startswith(f"truncated-{missing_from:020d}") for p in (b.dir / "data" / f"{TOPIC}-0").iterdir())
    readable_within(b, stream.acked)


def test_a_masters_segment_cut_short_while_it_was_down_is_never_served_and_filled_from_its_slave(pair) -> None:
    a, b, group = pair
    stream = PutStream(a.address, tag="c7").start()
    stream.wait_acked(300)
    stream.stop()
    epoch = group.epoch()
    b.kill()  # so that A comes back as the master, alone with its missing bytes
    a.kill()
    missing_from = cut_short(a, seed=7)
    a.start(wait_zk=False)
    wait_leads(a, group, epoch)
    assert corrupt_from(a) == missing_from  # before: the partition was refused at start
    # Never served: a read there is an error naming the range (A's transaction state passes it,
    # so its committed offset does too: before, it stopped there and B, capped by it, could not
    # give the bytes back), a read before it stops short.
    reply = request(a, {"op": "get", "topic": TOPIC, "partition": 0, "offset": missing_from, "max_size": 4096})
    assert reply.code == 500 and reply.get("reason") == "corrupt", reply.header
    assert f"{TOPIC}-0: offset {missing_from} is in a corrupt byte range" in reply.message
    served = fetch_all(a)
    assert served and max(served) < missing_from
    assert not missing_acks([ack for ack in stream.acked if ack.offset < missing_from], served)
    assert offline_bad_ranges(a, "missing") == [missing_from]
    b.start(wait_zk=False)
    wait_follows(b, a, group)
    wait_until(lambda: corrupt_from(a) == -1, FOUND_WITHIN_S, interval=0.1, message="A to fill the bytes from B")
    assert not any(p.name.startswith("truncated-") for p in (b.dir / "data" / f"{TOPIC}-0").iterdir())
    wait_caught_up(a, b, PARTS)
    assert_identical(a, slaves=1)
    readable_within(a, stream.acked)


def test_a_master_cut_short_while_down_fails_over_and_rejoins_without_losing_an_ack(pair) -> None:
    """C7 at broker level (the chaos runner's truncate-master fault, made certain: a sealed
    segment is cut only once there is one): kill -9 of the master, one of its sealed segments
    cut short on disk, the sync slave takes over with every ack; the old master restarts, cuts
    its log at the missing range, follows, and ends a byte-identical prefix of the new master."""
    a, b, group = pair
    stream = PutStream(a.address, tag="c7-failover").start()
    stream.wait_acked(300)
    epoch = group.epoch()
    a.kill()
    missing_from = cut_short(a, seed=8)
    wait_leads(b, group, epoch)
    stream.stop()
    assert not missing_acks(stream.acked, fetch_all(b)), "the new master lacks acked messages"
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    wait_until(lambda: is_prefix(a, b) and corrupt_from(a) == -1, FOUND_WITHIN_S, interval=0.1,
               message="A to cut its log at the missing bytes and fetch them again from B")
    assert any(p.name.startswith(f"truncated-{missing_from:020d}") for p in (a.dir / "data" / f"{TOPIC}-0").iterdir())
    wait_caught_up(b, a, PARTS)
    assert_identical(b, slaves=1)
    readable_within(a, stream.acked)


@chaos_run("corrupt-master", 1, 6, "sync", 1, "--corruption")
def test_chaos_run_corrupt_master_keeps_every_ack(chaos_outcome: Outcome) -> None:
    """The corrupt-master fault of ``python -m chaos run`` (kill -9, one payload bit of a flushed
    record flipped, restart after the hold): failover, the old master rejoins and fetches the
    bytes again, the checker finds every ack and every replica a prefix of the master."""
    result = checked(chaos_outcome)
    s = result["stats"]
    assert s["failovers"] >= 1 and s["lost_acked"] == 0 and s["puts_ok"] > 0
    faults = [f for f in result["history"]["faults"] if f["kind"] == "corrupt-master"]
    assert faults and all(f["corruption"] == "flip" and "record_offset" in f for f in faults), faults
    assert result["history"]["meta"]["corruption"] is True
    assert result["checks"]["replica_prefix"]["checked"] >= 2
