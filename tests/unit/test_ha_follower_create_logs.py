"""An empty slave lays out the logs of a topic's new partitions in one ``create_logs`` batch
(metaq/ha/follower.py, ``_create_missing_logs``), each starting at the master's oldest offset,
instead of a batch per START_CONCURRENCY partitions (which made an empty slave's start slower
than before batching)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from metaq.config import SlaveConfig, TopicConfig
from metaq.ha.follower import START_CONCURRENCY, MasterFollower
from metaq.ha.record import RecordTable
from metaq.store.manager import MessageStoreManager

PARTITIONS = 300


class OffsetsConnection:
    """The master's answers to offset requests: partition p's oldest offset is 1000 + p; one
    partition's first request fails (the connection dropped it)."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.asked = 0

    async def request(self, header: dict, timeout: float) -> object:
        self.asked += 1
        await asyncio.sleep(0)
        if header["partition"] == self.failing:
            self.failing = -1
            raise ConnectionError("dropped")
        return SimpleNamespace(ok=True, get=lambda key, default=None: 1000 + header["partition"])


def follower_with_store(tmp_path: Path) -> tuple[MasterFollower, MessageStoreManager]:
    topic = TopicConfig(name="wide", incarnation="wide-life", data_path=str(tmp_path / "data"),
                        num_partitions=PARTITIONS, unflush_threshold=0)
    store = MessageStoreManager({"wide": topic}, max_message_size=1024)
    (tmp_path / "data").mkdir()
    host = SimpleNamespace(config=SimpleNamespace(broker_id=0, topics={"wide": topic}), store=store,
                           security=SimpleNamespace(heartbeat_key=None), partitions=RecordTable())
    follower = MasterFollower(host, SlaveConfig(slave_id=0, slave_group="g"), None, None,  # type: ignore[arg-type]
                              lambda: 1, None, lambda: None)  # type: ignore[arg-type]
    return follower, store


def test_an_empty_slave_creates_all_new_partitions_of_a_topic_in_one_batch(tmp_path, monkeypatch) -> None:
    follower, store = follower_with_store(tmp_path)
    batches: list[int] = []
    real = store._lay_out_and_open
    monkeypatch.setattr(store, "_lay_out_and_open", lambda new: batches.append(len(new)) or real(new))
    started: list[tuple[str, int]] = []

    async def start_partition(conn: object, topic: str, partition: int) -> None:
        started.append((topic, partition))
        if not store.has_log(topic, partition):  # the one whose offset request failed: its own way
            await store.create_log(topic, partition, start_offset=await follower._oldest_offset(conn, topic, partition))

    monkeypatch.setattr(follower, "_start_partition", start_partition)
    conn = OffsetsConnection(failing=7)
    keys = [("wide", p) for p in range(PARTITIONS)]
    asyncio.run(follower._start_partitions(conn, keys))  # type: ignore[arg-type]
    assert PARTITIONS > START_CONCURRENCY
    assert batches[0] == PARTITIONS - 1, f"one batch for the whole topic, not one per {START_CONCURRENCY}: {batches}"
    assert sorted(started) == keys
    for p in range(PARTITIONS):
        log = store.open_log("wide", p)
        assert log is not None and log.min_offset == log.log_end == 1000 + p
    store.close()


def test_partitions_that_have_logs_ask_the_master_nothing(tmp_path) -> None:
    follower, store = follower_with_store(tmp_path)
    asyncio.run(store.create_logs([("wide", p, 0) for p in range(PARTITIONS)]))
    conn = OffsetsConnection(failing=-1)
    asyncio.run(follower._create_missing_logs(conn, [("wide", p) for p in range(PARTITIONS)]))  # type: ignore[arg-type]
    assert conn.asked == 0
    store.close()
