"""A rejoining slave whose master refuses one partition (it does not serve it: its segment
files lost, say) follows the others at once and that one once the master serves it again.

Before, the truncation's first refused partition failed the whole FOLLOWING entry action,
every 250 ms for minutes: the slave replicated nothing (a netns chaos campaign run, the master
refusing ``side-0`` with "log end went backwards", the slave 270 KB behind on ``chaos-0``
until the run ended). Real logs and the partition registry; the master is a fake answering
from real logs in this process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metaq import record
from metaq.client.connection import Reply
from metaq.config import TopicConfig
from metaq.ha import followership as followership_module
from metaq.ha.followership import Followership
from metaq.protocol import commands as c
from metaq.server.partitions import Partitions
from metaq.store.log import PartitionLog
from metaq.store.manager import MessageStoreManager

#: Who answers (ha/answerer.py): the acting master of epoch 2, the epoch the slave read from ZooKeeper.
AS_MASTER = {"role": "master", "serving_epoch": 2}
REFUSAL = "/data/t-0: log end went backwards: offsets up to 205 were flushed, but it has no segment files"


class Master:
    """Answers ``epoch_end``, ``epochs``, ``offset`` and ``checksum`` from its logs, which it wrote in epoch 1
    up to ``epoch_2_start`` and in epoch 2 since; refuses ``t-0`` with a 500 while ``refusing``."""

    address = "127.0.0.1:1"

    def __init__(self, logs: dict[int, PartitionLog], epoch_2_start: int) -> None:
        self.logs = logs
        self.epoch_2_start = epoch_2_start
        self.refusing = True
        self.asked: list[tuple[str, int]] = []

    def close(self) -> None:
        pass

    async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Reply:
        partition = header["partition"]
        self.asked.append((header["op"], partition))
        if partition == 0 and self.refusing:
            return Reply({"code": c.INTERNAL_ERROR, "msg": REFUSAL}, bytearray())
        log = self.logs[partition]
        if header["op"] == "epoch_end":
            assert header["epoch"] == 1, header
            return Reply({"code": c.OK, "epoch": 1, "end_offset": self.epoch_2_start, **AS_MASTER}, bytearray())
        if header["op"] == "offset":
            return Reply({"code": c.OK, "offset": 0, "min_offset": 0, "max_offset": log.log_end}, bytearray())
        if header["op"] == "epochs":
            return Reply({"code": c.OK, "entries": [[1, 0], [2, self.epoch_2_start]], **AS_MASTER}, bytearray())
        assert header["op"] == "checksum", header
        start, end = header["start"], min(header["end"], log.log_end)
        return Reply({"code": c.OK, "start": start, "end": end, "crc": log.crc32(start, end)}, bytearray())


def records(prefix: str, count: int) -> bytes:
    return b"".join(record.encode_record(f"{prefix}{i:04d}".encode() * 3, msg_id=i + 1) for i in range(count))


SHARED, OURS_ONLY = records("shared", 30), records("ours-only", 5)


def rejoining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition_count: int) -> tuple[Followership, Partitions, Master]:
    """A slave (an old master: a tail the master never had) and its master, over ``partition_count`` partitions."""
    store = MessageStoreManager({"t": TopicConfig(name="t", data_path=str(tmp_path / "data"), num_partitions=partition_count)},
                                max_message_size=1 << 20)
    partitions = Partitions(store)
    master_logs = {}
    for n in range(partition_count):
        owner = partitions.get("t", n)
        owner.append_as_follower(SHARED + OURS_ONLY)
        asyncio.run(owner.adopt_epochs([(1, 0)]))
        master_logs[n] = PartitionLog(tmp_path / f"master-{n}", max_segment_size=1 << 20)
        master_logs[n].append(SHARED + records("master", 3))
    master = Master(master_logs, len(SHARED))

    async def connect(*_args: object, **_kw: object) -> Master:
        return master

    monkeypatch.setattr(followership_module, "open_peer", connect)
    followership = Followership.__new__(Followership)  # the truncation part runs here, nothing else
    followership.host = SimpleNamespace(partitions=partitions, registry=SimpleNamespace(slave_id=0))
    followership.follower, followership.truncations, followership.held_back = None, [], {}
    followership.master_epoch, followership._refusals, followership._refusal_said = 2, 0, None
    followership.stopping, followership.superseded, followership._truncating = False, lambda: False, None
    return followership, partitions, master


def test_a_partition_the_master_refuses_is_held_back_and_the_others_are_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    followership, partitions, master = rejoining(tmp_path, monkeypatch, 2)
    shared, ours_only = SHARED, OURS_ONLY

    asyncio.run(followership.truncate_against("meta://127.0.0.1:1"))  # before: raised, and nothing was followed

    assert partitions.get("t", 1).log.log_end == len(shared), "the partition the master serves is truncated"
    assert [t["partition"] for t in followership.truncations] == [1]
    assert list(followership.held_back) == [("t", 0)] and REFUSAL in followership.held_back[("t", 0)]
    assert partitions.get("t", 0).log.log_end == len(shared + ours_only), "nothing cut on a refusal"

    # The follower's start of the held-back partition asks again: refused, it fails (and is retried)...
    with pytest.raises(ConnectionError, match="log end went backwards"):
        asyncio.run(followership.adopt_master_epochs(master, "t", 0))  # type: ignore[arg-type]
    # ...served again, the partition is truncated against the master before it is followed.
    master.refusing = False
    asyncio.run(followership.adopt_master_epochs(master, "t", 0))  # type: ignore[arg-type]
    assert partitions.get("t", 0).log.log_end == len(shared)
    assert followership.held_back == {}
    assert partitions.get("t", 0).epochs.entries == [(1, 0), (2, len(shared))]


def test_a_master_refusing_every_partition_fails_the_truncation_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Then the answer is about the master (it no longer leads, say): the coordinator looks again."""
    followership, partitions, _master = rejoining(tmp_path, monkeypatch, 1)
    with pytest.raises(ConnectionError, match="refused every partition"):
        asyncio.run(followership.truncate_against("meta://127.0.0.1:1"))
    assert partitions.get("t", 0).log.log_end == len(SHARED + OURS_ONLY)


def test_stats_name_each_held_back_partition_with_the_master_s_answer() -> None:
    from metaq.ha.coordinator import HaCoordinator
    from metaq.ha.progress import ReplicationProgress

    from .ha_support import fake_registry

    config = SimpleNamespace(broker_id=3, zk=SimpleNamespace(root="/meta"))
    host = SimpleNamespace(config=config, registry=fake_registry("meta://127.0.0.1:9001"))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    coordinator.followership.held_back[("side", 0)] = f"epoch_end side-0: 500 {REFUSAL}"
    assert ("held back side-3-0", f"epoch_end side-0: 500 {REFUSAL}") in coordinator.status_pairs()
