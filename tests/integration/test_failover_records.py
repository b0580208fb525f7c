"""Takeover records in ZooKeeper (metaq/ha/failover_record.py) with real processes.

* kill -9 of the master of a sync pair: the new master records the takeover (why, the
  previous epoch and master, its lag then); the old master, restarted, follows and records
  the bytes it truncated under that epoch (0 or more: what it moved aside on disk).
* a `metaq promote` hand-over, security on: the promoted slave records "planned" with the
  group's ACL (anyone reads, only the group writes); the console's reader reads it back.
"""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import NoAuthError

from metaq.console.collector import _reported
from metaq.ha.failover_record import KEEP_RECORDS, prune, read_records, write_takeover
from metaq.tools.launcher import wait_until
from metaq.zk.paths import ZkPaths
from tests.harness import kazoo_client

from .failover_support import (
    GROUP,
    SLAVE_B,
    TOPIC,
    ZK_SETTINGS,
    Group,
    PutStream,
    make_pair,
    sync_system,
    truncated_files,
    wait_follows,
    wait_in_sync_set,
    wait_leads,
)
from .trust_support import SecuredGroup, metaq


def wait_record(zk_client, zk_root: str, epoch: int, *, truncated_by: int | None = None) -> dict:  # type: ignore[no-untyped-def]
    """The group's record of ``epoch`` once written (and its truncation child of ``truncated_by``)."""

    def ready() -> dict | None:
        entry = read_records(zk_client, ZkPaths(zk_root), GROUP).get(epoch)
        if entry is None or not entry["record"] or (truncated_by is not None and truncated_by not in entry["truncated"]):
            return None
        return entry

    return wait_until(ready, 15, interval=0.1, message=f"the takeover record of epoch {epoch}")


def test_kill_records_why_the_previous_master_and_the_old_masters_truncation(broker_factory, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch_before = group.epoch()
    first = wait_record(zk_client, zk_root, epoch_before)["record"]
    assert first["reason"] == "first_master" and first["url"] == a.url and first["previous_master"] is None, first

    stream = PutStream(a.address, tag="a").start()
    stream.wait_acked(200)
    a.kill()
    stream.stop()
    epoch = wait_leads(b, group, epoch_before)
    record = wait_record(zk_client, zk_root, epoch)["record"]
    assert record["epoch"] == epoch and record["url"] == b.url and record["slave_id"] == SLAVE_B, record
    # kill -9: the death watch sees the process go (fast takeover), else its session expires.
    assert record["reason"] in ("fast_takeover", "session_expiry"), record
    assert record["previous_epoch"] == epoch_before and record["previous_master"] == a.url, record
    assert isinstance(record["lag_bytes"], int) and record["lag_bytes"] >= 0, record

    a.start(wait_zk=False)
    slave_id = wait_follows(a, b, group)
    entry = wait_record(zk_client, zk_root, epoch, truncated_by=slave_id)
    cut = entry["truncated"][slave_id]
    assert cut["url"] == a.url and cut["led_epoch"] == epoch_before, cut
    moved = sum(path.stat().st_size for path in truncated_files(a))
    assert sum(cut["partitions"].values()) == moved, (cut, moved)
    assert set(cut["partitions"]) <= {f"{TOPIC}-{GROUP}-0"}, cut
    # The console's row: the reported record, checked against the epoch node, not doubted.
    row = _reported(epoch, entry, None, (group.epoch(), group.master(), 0))
    assert row["reported"] and row["doubt"] is None and row["truncated_bytes"] == moved, row
    assert row["why"] and row["previous_master"] == a.url


def test_promote_records_a_planned_handover_with_the_groups_acl(broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    secured = SecuredGroup(tmp_path / "security")
    system = {**sync_system(), **secured.system}
    master = broker_factory(GROUP, {TOPIC: 1}, system, name="master", zookeeper=ZK_SETTINGS)
    slave = broker_factory(GROUP, {TOPIC: 1}, system, {"slaveId": 0}, name="slave", zookeeper=ZK_SETTINGS)
    group = Group(zk_client, zk_root)
    wait_in_sync_set(group, 0)
    epoch_before = group.epoch()

    done = metaq("promote", "--zk", zk.connect_string, "--zk-root", zk_root, "--broker-id", str(GROUP), "--slave", "0",
                 "--group-secret", str(secured.secret_file))
    assert done.returncode == 0, done.stderr
    # (Security on: wait_leads would ask the brokers without a login; ZooKeeper says it.)
    wait_until(lambda: group.master() == slave.url and group.epoch() > epoch_before, 20, message="the promoted slave to lead")
    epoch = group.epoch()
    # zk_client is anonymous, as the console is: anyone reads the record.
    wait_until(lambda: group.slave_id_of(master) is not None, 25, message="the old master to follow")
    entry = wait_record(zk_client, zk_root, epoch, truncated_by=group.slave_id_of(master))
    record = entry["record"]
    assert record["reason"] == "planned" and record["previous_master"] == master.url, record
    assert record["previous_epoch"] == epoch_before and record["url"] == slave.url, record

    # Only the group writes: the record has the group's ACL, forging it is refused.
    path = ZkPaths(zk_root).failover(GROUP, epoch)
    with pytest.raises(NoAuthError):
        zk_client.set(path, json.dumps({**record, "reason": "first_master"}).encode())
    with pytest.raises(NoAuthError):
        zk_client.create(f"{path}/truncated-slave9", b"{}")
    # The same ACL as the group's epoch node (ZooKeeper masks the digest to readers alike).
    assert zk_client.get_acls(path)[0] == zk_client.get_acls(ZkPaths(zk_root).epoch(GROUP))[0]
    assert len(zk_client.get_acls(path)[0]) == 2


def test_records_are_pruned_to_the_newest(zk, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    paths = ZkPaths(zk_root)
    for epoch in range(1, KEEP_RECORDS + 6):
        write_takeover(zk_client, paths, GROUP, {"epoch": epoch, "reason": "session_expiry"})
    records = read_records(zk_client, paths, GROUP)
    assert sorted(records) == list(range(6, KEEP_RECORDS + 6))
    assert prune(zk_client, paths, GROUP, keep=2) == KEEP_RECORDS - 2
    assert sorted(read_records(zk_client, paths, GROUP)) == [KEEP_RECORDS + 4, KEEP_RECORDS + 5]
