"""Power loss (lost unsynced writes) in a sync pair of real broker processes.

Each broker runs with the power-loss shim (chaos/power_loss.py): a "power loss" is
``kill -9`` and then every byte the broker wrote under its data directory and did not
fsync is taken away (appends cut back to the last fsync, files and directories whose
directory entry was never fsynced removed, renames without a directory fsync undone).
``slow_fsyncs`` holds a broker's fsyncs in flight so the power can be cut while
replicated bytes are still only in its page cache, which is exactly the window these
scenarios are about.

Group 0: A (founds the group as master) and B (``--slave``, slaveId 1), sync mode,
``onSyncSlaveLoss=degrade``, ZK session 1500 ms. The promises (docs/guarantees.md, P1-P4):

* P1 the slave loses power: no acked message lost; it rejoins from what it kept.
* P2 the master loses power: no acked message lost (B has them, A fsynced them before
  acking); A rejoins as B's slave from what it kept.
* P3 last replica standing: A killed, the promoted B loses power before its first fsync of
  what it took over; no acked message lost.
* P4 after any power loss, the restarted broker's checkpoints and epoch cache do not claim
  data its log does not have.
* ``python -m chaos run --scenario power-loss-master --power-loss``: the fault kind through
  the runner, with its workload and checker: the master loses power, no acked message lost.
* Beyond the promise: both lose power at once with the default flush settings; what is
  lost is reported, and it is only ever the newest acks (never a hole or a wrong message).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from chaos.power_loss import PowerLossDisk, PowerLossReport, build_shim
from metaq.ha.epochs import EpochCache
from metaq.store.checkpoint import read_flushed_end
from metaq.store.segment import SEGMENT_SUFFIX
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until

from ..integration.failover_support import (
    GROUP,
    SLAVE_B,
    TOPIC,
    ZK_SETTINGS,
    Group,
    PutStream,
    assert_identical,
    disk_log,
    disk_records,
    fetch_all,
    first_ack_after,
    missing_acks,
    partition_dir,
    stat,
    sync_system,
    wait_follows,
    wait_in_sync_set,
    wait_leads,
)
from ..integration.replication_support import wait_caught_up
from tests.chaos.run_support import Outcome, chaos_run, checked

pytestmark = pytest.mark.chaos
PARTS = [(TOPIC, 0)]
#: sync mode with MetaQ's default flush policy (unflushThreshold, unflushInterval): acks before fsync.
DEFAULT_FLUSH = {k: v for k, v in sync_system().items() if k != "unflushThreshold"}
#: Longer than a failover (T = 1.5 s) and than syncSlaveTimeoutMs (1 s): the fsyncs in
#: flight at the power loss are still sleeping, also those a promotion starts.
SLOW_FSYNC_MS = 5_000


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory.mktemp("powerloss-shim"))


class PoweredPair:
    """A sync pair whose brokers each write through a ``PowerLossDisk``."""

    def __init__(self, factory: BrokerFactory, group: Group, system: dict[str, Any], shim: Path) -> None:
        self.group = group
        self.a = factory(GROUP, {TOPIC: 1}, system, name="A", zookeeper=ZK_SETTINGS, start=False)
        self.b = factory(GROUP, {TOPIC: 1}, system, {"slaveId": SLAVE_B}, name="B", zookeeper=ZK_SETTINGS, start=False)
        self.disks: dict[str, PowerLossDisk] = {}
        for broker in (self.a, self.b):
            disk = PowerLossDisk(broker.dir / "data", broker.dir / "powerloss", shim)
            broker.extra_env = disk.env()
            self.disks[broker.name] = disk
        self.a.start()
        self.b.start()
        wait_follows(self.b, self.a, group)
        wait_in_sync_set(group, SLAVE_B)

    def lose_power(self, broker: BrokerProcess) -> PowerLossReport:
        broker.kill()
        report = self.disks[broker.name].lose_power()
        print(f"\n{broker.name} lost power: {report}")
        assert_state_agrees_with_log(broker)
        return report


def held_past(disk: PowerLossDisk) -> bool:
    """Unsynced segment bytes that stay unsynced for 0.3 s: an fsync begun before the slow
    flag (quick) can still cover the bytes seen a moment ago; one that keeps them unsynced
    that long is a held one."""
    before = disk.unsynced_bytes(SEGMENT_SUFFIX)
    if before == 0:
        return False
    time.sleep(0.3)
    return disk.unsynced_bytes(SEGMENT_SUFFIX) >= before


@pytest.fixture
def group(zk_client, zk_root) -> Group:
    return Group(zk_client, zk_root)


def assert_state_agrees_with_log(broker: BrokerProcess) -> None:
    """What survives on disk claims nothing past the log it kept (checked before a restart)."""
    directory = partition_dir(broker)
    if not directory.exists():
        return  # the whole partition directory was lost: nothing can claim anything
    start, data = disk_log(broker)
    log_end = start + len(data)
    flushed = read_flushed_end(directory)
    assert flushed is None or flushed <= log_end, f"{broker.name}: flushed-end checkpoint {flushed} > log end {log_end}"
    for epoch, epoch_start in EpochCache.load(directory).entries:
        assert epoch_start <= log_end, f"{broker.name}: epoch {epoch} starts at {epoch_start}, past its log end {log_end}"


def assert_every_ack_on(broker: BrokerProcess, acks: list) -> None:
    """Every ack readable on ``broker`` (a master that just took over may take a moment to
    serve up to its log end: polled, the wait printed), and on its disk in any case."""
    held = disk_records(broker)
    lost = missing_acks(acks, held)
    assert not lost, f"{len(lost)} acked messages lost on {broker.name}, first {lost[:3]}"
    started = time.monotonic()
    wait_until(lambda: not missing_acks(acks, fetch_all(broker)), 10, interval=0.1,
               message=f"{broker.name} to serve every ack it holds")
    print(f"{broker.name} served every ack after {time.monotonic() - started:.2f}s")


def acks_while_fsyncs_hang(stream: PutStream, disk: PowerLossDisk) -> None:
    """Hold the broker's fsyncs in flight and wait for more acks meanwhile (a slave that
    reported unsynced positions has them in its page cache only)."""
    acked = len(stream.acked)
    disk.slow_fsyncs(SLOW_FSYNC_MS)
    stream.wait_acked(acked + 30)


#: The documented durable settings (group commit on every member) and the default flush
#: (acked before any fsync): one member's power loss keeps every ack with either.
FLUSH = {"group-commit": sync_system(), "default-flush": DEFAULT_FLUSH}


@pytest.mark.parametrize("flush", FLUSH)
def test_slave_loses_power_then_rejoins_with_every_ack(broker_factory, group, shim, flush):
    pair = PoweredPair(broker_factory, group, FLUSH[flush], shim)
    a, b = pair.a, pair.b
    stream = PutStream(a.address, tag="p1").start()
    stream.wait_acked(200)
    acks_while_fsyncs_hang(stream, pair.disks["B"])
    pair.lose_power(b)
    stream.wait_acked(len(stream.acked) + 100)  # degrade: A acks alone
    b.start(wait_zk=False)
    wait_follows(b, a, group)
    wait_in_sync_set(group, SLAVE_B)
    stream.wait_acked(len(stream.acked) + 50)
    stream.stop()
    wait_caught_up(a, b, PARTS)
    assert_every_ack_on(a, stream.acked)
    assert not missing_acks(stream.acked, disk_records(b))
    assert_identical(a, slaves=1)


@pytest.mark.parametrize("flush", FLUSH)
def test_master_loses_power_slave_takes_over_with_every_ack(broker_factory, group, shim, flush):
    pair = PoweredPair(broker_factory, group, FLUSH[flush], shim)
    a, b = pair.a, pair.b
    epoch = group.epoch()
    stream = PutStream(a.address, tag="p2").start()
    stream.wait_acked(300)
    # A's fsyncs are held: what A appends meanwhile is replicated to B, and (group commit)
    # not acked, or (default flush) acked before any fsync.
    pair.disks["A"].slow_fsyncs(4 * SLOW_FSYNC_MS)
    wait_until(lambda: held_past(pair.disks["A"]), 10, message="A to append past its held fsync")
    report = pair.lose_power(a)
    assert report.bytes_lost > 0, "A lost nothing: the scenario did not exercise unsynced bytes"
    stream.stop()
    first_ack_after(b, b"first-on-B")
    wait_leads(b, group, epoch)
    assert_every_ack_on(b, stream.acked)
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    wait_caught_up(b, a, PARTS)
    assert_identical(b, slaves=1)
    assert not missing_acks(stream.acked, disk_records(a))


def test_last_replica_standing_promoted_slave_loses_power_before_its_first_fsync(broker_factory, group, shim):
    """Kafka's KIP-966 case: A is killed (its disk intact); B, promoted, loses power before it
    fsynced what it took over; then both come back. No acked message may be lost."""
    pair = PoweredPair(broker_factory, group, sync_system(), shim)
    a, b = pair.a, pair.b
    epoch = group.epoch()
    stream = PutStream(a.address, tag="p3").start()
    stream.wait_acked(200)
    acks_while_fsyncs_hang(stream, pair.disks["B"])
    a.kill()
    stream.stop()
    # B takes over only if it is still in the sync set; a B that reported fsynced positions
    # only has left it (its fsyncs hang past syncSlaveTimeoutMs) and may not: 2T + 1 s.
    try:
        wait_leads(b, group, epoch, timeout=4)
        led = True
    except AssertionError:
        led = False
    pair.lose_power(b)
    print(f"B {'led' if led else 'could not lead'} before it lost power")
    b.start(wait_zk=False)
    a.start(wait_zk=False)
    master, slave = wait_until(lambda: _settled(pair), 40, interval=0.2, message="one master and one following slave")
    wait_caught_up(master, slave, PARTS)
    print(f"settled: {master.name} leads, {slave.name} follows")
    assert_every_ack_on(master, stream.acked)
    assert_identical(master, slaves=1)


def _settled(pair: PoweredPair) -> tuple[BrokerProcess, BrokerProcess] | None:
    """One broker leads (it says so itself) and the other follows it.

    The master node alone is not enough: right after both restart it may still be the
    ephemeral node of the lost process's session, naming the restarted broker's url
    while that broker waits for the node to go; the other broker can follow it until the
    old session expires and the election runs."""
    for master, slave in ((pair.a, pair.b), (pair.b, pair.a)):
        if pair.group.master() == master.url and pair.group.slave_id_of(slave) is not None:
            try:
                if stat(master, "ha_state") != "leading":
                    continue
            except Exception:
                continue
            try:
                wait_follows(slave, master, pair.group, timeout=0.5)
            except AssertionError:
                continue
            return master, slave
    return None


def test_both_lose_power_with_default_flush_loses_only_the_newest_acks(broker_factory, group, shim):
    """Beyond the promise: the whole group loses power, flushing on the defaults (acked
    before any fsync). Reported, and checked to lose only a suffix of the acks."""
    pair = PoweredPair(broker_factory, group, DEFAULT_FLUSH, shim)
    a, b = pair.a, pair.b
    stream = PutStream(a.address, tag="p4").start()
    stream.wait_acked(300)
    lost_a = pair.lose_power(a)
    lost_b = pair.lose_power(b)
    stream.stop()
    a.start(wait_zk=False)
    b.start(wait_zk=False)
    master, slave = wait_until(lambda: _settled(pair), 40, interval=0.2, message="one master and one following slave")
    wait_caught_up(master, slave, PARTS)
    on_master = fetch_all(master)
    lost = missing_acks(stream.acked, on_master)
    print(f"both lost power (default flush): {len(lost)} of {len(stream.acked)} acks lost;"
          f" A lost {lost_a.bytes_lost} bytes, B {lost_b.bytes_lost}")
    kept = [ack for ack in stream.acked if ack not in lost]
    # Only the newest acks go: everything kept is at its acked offset, and no lost ack is
    # older than a kept one (no hole).
    if lost and kept:
        assert min(x.offset for x in lost) > max(x.offset for x in kept), "a hole: an older ack lost, a newer kept"
    assert_identical(master, slaves=1)


def test_standalone_master_loses_power_keeps_every_ack_and_its_directories(broker_factory, shim, tmp_path):
    """Group commit, no slave: every ack was fsynced, and so were the names of the new
    partition and transaction directories (a directory's name is durable only once its
    parent is fsynced: before that fix the whole partition vanished)."""
    master = broker_factory(GROUP, {TOPIC: 1}, {"unflushThreshold": 0}, name="solo", start=False)
    disk = PowerLossDisk(master.dir / "data", tmp_path / "solo-powerloss", shim)
    master.extra_env = disk.env()
    master.start()
    stream = PutStream(master.address, tag="solo").start()
    stream.wait_acked(200)
    master.kill()
    stream.stop()
    report = disk.lose_power()
    print(f"\nsolo lost power: {report}")
    assert not report.vanished, f"directories or files lost with their fsynced contents: {report.vanished}"
    assert_state_agrees_with_log(master)
    master.start()
    assert_every_ack_on(master, stream.acked)


def test_promoted_slave_loses_power_while_its_takeover_fsync_is_in_flight(broker_factory, group, shim):
    """The other half of the last-replica-standing case: B stays in the sync set (its fsyncs
    are slow but within a long syncSlaveTimeoutMs), wins the election with a fetched,
    unsynced tail, and loses power at once. Its epoch history must not start the new epoch
    past the log it keeps (before the fix it was saved before the log was fsynced), and no
    acked message may be lost."""
    pair = PoweredPair(broker_factory, group, sync_system(syncSlaveTimeoutMs=15_000), shim)
    a, b = pair.a, pair.b
    epoch = group.epoch()
    stream = PutStream(a.address, tag="p3b").start()
    stream.wait_acked(200)
    pair.disks["B"].slow_fsyncs(3_000, SEGMENT_SUFFIX)  # the log's fsyncs only: checkpoints stay quick
    wait_until(lambda: pair.disks["B"].unsynced_bytes(SEGMENT_SUFFIX) > 0, 10, message="B to append behind its held fsync")
    a.kill()
    stream.stop()
    wait_until(lambda: group.epoch() > epoch, 10, interval=0.02, message="B to win the election")
    pair.lose_power(b)  # checks the epoch history against the log B kept
    b.start(wait_zk=False)
    a.start(wait_zk=False)
    master, slave = wait_until(lambda: _settled(pair), 40, interval=0.2, message="one master and one following slave")
    wait_caught_up(master, slave, PARTS)
    assert_every_ack_on(master, stream.acked)
    assert_identical(master, slaves=1)


@chaos_run("power-loss-master", 1, 6, "sync", 1, "--power-loss")
def test_chaos_run_power_loss_master_loses_no_ack(chaos_outcome: Outcome) -> None:
    """The power-loss-master fault of ``python -m chaos run`` (kill -9, unsynced writes cut,
    restart after the hold): failover, the old master rejoins, the checker finds every ack."""
    result = checked(chaos_outcome)
    s = result["stats"]
    assert s["failovers"] >= 1 and s["lost_acked"] == 0 and s["puts_ok"] > 0
    faults = [f for f in result["history"]["faults"] if f["kind"] == "power-loss-master"]
    # The power was really cut: the journal was replayed and its report recorded.
    assert all("bytes_lost" in f and f["power_loss"].startswith("lost ") for f in faults), faults
    assert result["history"]["meta"]["power_loss"] is True
    assert result["checks"]["replica_prefix"]["checked"] >= 2
