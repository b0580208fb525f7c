"""Where a rejoining broker cuts its log, without epochs (the byte-comparison fallback),
against a master answering ``offset`` and ``checksum`` from a real log in this process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from metaq import record
from metaq.client.connection import Reply
from metaq.ha.truncation import TruncationRefused, divergence_point
from metaq.protocol import commands as c
from metaq.store.log import PartitionLog


class NoEpochs:
    entries: list[Any] = []
    latest_epoch = 0


#: Who a master of epoch 1 says it is (ha/answerer.py); the rejoining side read epoch 1 from ZooKeeper.
MASTER_OF_EPOCH_1 = {"role": "master", "serving_epoch": 1}


class FakeMaster:
    """Answers like the broker's handlers: checksum refuses ranges before the log start."""

    address = "127.0.0.1:1"

    def __init__(self, log: PartitionLog, epoch_end: int | None = None) -> None:
        self.log = log
        self.epoch_end = epoch_end  # answers epoch_end with this offset (a master of epoch 1)

    async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Reply:
        log = self.log
        if header["op"] == "offset":
            return Reply({"code": c.OK, "offset": log.min_offset, "min_offset": log.min_offset, "max_offset": log.log_end}, bytearray())
        if header["op"] == "epoch_end":
            return Reply({"code": c.OK, "epoch": 1, "end_offset": self.epoch_end, **MASTER_OF_EPOCH_1}, bytearray())
        assert header["op"] == "checksum", header
        start, end = header["start"], min(header["end"], log.log_end)
        if start < log.min_offset or start > end:
            return Reply({"code": c.BAD_REQUEST, "msg": "outside the log"}, bytearray())
        return Reply({"code": c.OK, "start": start, "end": end, "crc": log.crc32(start, end)}, bytearray())


def records(prefix: str, count: int) -> list[bytes]:
    return [record.encode_record(f"{prefix}{i:04d}".encode() * 3, msg_id=i + 1) for i in range(count)]


def new_log(path: Path, chunks: list[bytes], start: int = 0) -> PartitionLog:
    log = PartitionLog(path, max_segment_size=1 << 20, start_offset=start)
    log.append(b"".join(chunks))
    return log


def cut(ours: PartitionLog, master: PartitionLog, floor: int = 0) -> int:
    return asyncio.run(divergence_point(FakeMaster(master), "t", 0, ours, NoEpochs(), floor, master_epoch=1))  # type: ignore[arg-type]


def test_the_cut_is_the_end_of_the_longest_common_prefix(tmp_path: Path) -> None:
    shared = records("shared", 100)
    ours = new_log(tmp_path / "ours", shared + records("ours-only", 7))
    master = new_log(tmp_path / "master", shared + records("master-only", 5))
    assert cut(ours, master) == len(b"".join(shared))


def test_a_master_whose_retention_deleted_our_oldest_bytes_still_finds_the_common_prefix(tmp_path: Path) -> None:
    shared = records("shared", 100)
    deleted = len(b"".join(shared[:30]))  # the master's log now starts here
    ours = new_log(tmp_path / "ours", shared + records("ours-only", 7))
    master = new_log(tmp_path / "master", shared[30:] + records("master-only", 5), start=deleted)
    # Comparing from our own log start would fail on every range and move all of our log aside.
    assert cut(ours, master) == len(b"".join(shared))


def test_nothing_in_common_cuts_everything(tmp_path: Path) -> None:
    ours = new_log(tmp_path / "ours", records("ours", 20))
    master = new_log(tmp_path / "master", records("master", 20))
    assert cut(ours, master) == 0


# --- defense in depth: a master that does not hold our committed bytes ---------------------------


class OneEpoch:
    entries = [(1, 0)]
    latest_epoch = 1

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        return 1, log_end


def test_nothing_in_common_below_the_committed_offset_is_refused(tmp_path: Path) -> None:
    ours = new_log(tmp_path / "ours", records("ours", 20))
    master = new_log(tmp_path / "master", records("master", 20))
    committed = len(b"".join(records("ours", 20)[:10]))
    with pytest.raises(TruncationRefused, match="refusing to truncate"):
        cut(ours, master, floor=committed)
    assert ours.log_end == len(b"".join(records("ours", 20)))


def test_an_epoch_end_of_zero_is_not_verified_by_an_empty_range(tmp_path: Path) -> None:
    """A fake master answering epoch_end 0 once made a slave drop its whole log (the empty CRC check passed)."""
    ours = new_log(tmp_path / "ours", records("ours", 20))
    fake = new_log(tmp_path / "fake", [])
    refused = divergence_point(FakeMaster(fake, epoch_end=0), "t", 0, ours, OneEpoch(), 500, master_epoch=1)  # type: ignore[arg-type]
    with pytest.raises(TruncationRefused):
        asyncio.run(refused)


def test_a_partition_dropped_while_its_truncation_waits_on_the_master_is_left_alone(tmp_path: Path) -> None:
    """The rejoin's cut reads the log, the history and the cut from one registry, the partition's
    owner: a topic deleted (or re-created) during the exchange is not cut, nor another incarnation's
    log cut at an offset found for this one's."""
    from metaq.config import TopicConfig
    from metaq.ha.followership import Followership
    from metaq.server.partitions import Partitions
    from metaq.store.manager import MessageStoreManager

    store = MessageStoreManager({"t": TopicConfig(name="t", data_path=str(tmp_path / "data"), num_partitions=1)},
                                max_message_size=1 << 20)
    partitions = Partitions(store)
    owner = partitions.get("t", 0)
    owner.append_as_follower(b"".join(records("ours", 20)))
    end = owner.log.log_end
    master = new_log(tmp_path / "master", records("master", 20))
    asked: list[str] = []

    class DroppingMaster(FakeMaster):
        async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Reply:
            asked.append(header["op"])
            partitions.drop([("t", 0)])  # the topic is deleted while the master answers
            return await super().request(header, body, timeout)

    followership = Followership.__new__(Followership)  # only the owner-facing part runs here
    followership.host, followership.follower, followership.truncations = None, None, []
    followership.master_epoch = 1
    asyncio.run(followership._truncate_partition(DroppingMaster(master), owner))  # type: ignore[arg-type]
    assert asked and "epochs" not in asked, "no history adopted for a dropped partition"
    assert owner.dropped and owner.log.log_end == end and followership.truncations == []
    store.close()
