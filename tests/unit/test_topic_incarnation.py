"""Topic incarnations: assigned by the group's configuration, kept beside each partition's files,
and what a broker drops when one ends (pure logic; the processes are in
tests/integration/test_topic_lifecycle.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metaq.config import TopicConfig
from metaq.record import encode_batch
from metaq.store import incarnation
from metaq.store.manager import MessageStoreManager, dropped_partitions
from metaq.zk.topic_config import GroupTopics, decode_group_topics, seed_with


def test_create_assigns_an_incarnation_alter_keeps_it_delete_ends_it():
    created = GroupTopics(version=0).with_topic("x", {"numPartitions": "5"})
    first = created.incarnations["x"]
    altered = created.with_topic("x", {"numPartitions": "6"})
    assert altered.incarnations["x"] == first
    deleted = altered.without_topic("x")
    assert "x" not in deleted.incarnations and "x" in deleted.deleted
    recreated = deleted.with_topic("x", {"numPartitions": "2"})
    assert recreated.incarnations["x"] != first and "x" not in recreated.deleted
    assert decode_group_topics(recreated.encode(), 7).incarnations == recreated.incarnations


def test_a_node_without_incarnations_still_decodes_and_a_bad_one_is_refused():
    legacy = decode_group_topics(b'{"topics":{"a":{}},"deleted":[]}', 1)
    assert legacy.incarnations == {} and b"incarnations" not in legacy.encode()
    with pytest.raises(ValueError, match="incarnation"):
        decode_group_topics(b'{"topics":{"a":{}},"incarnations":{"a":"../etc"}}', 1)


def topic(partitions: int, inc: str, data: str = "d") -> TopicConfig:
    return TopicConfig("x", num_partitions=partitions, data_path=data, incarnation=inc)


def test_dropped_partitions_when_a_topic_ends_or_shrinks():
    keys = lambda old, new: [(t, p) for t, p, _ in dropped_partitions({"x": old}, new)]  # noqa: E731
    assert keys(topic(3, "a"), {}) == [("x", 0), ("x", 1), ("x", 2)]  # deleted
    assert keys(topic(3, "a"), {"x": topic(2, "b")}) == [("x", 0), ("x", 1), ("x", 2)]  # re-created: all of it
    assert keys(topic(3, "a"), {"x": topic(4, "a")}) == []  # altered
    assert keys(topic(3, "a"), {"x": topic(3, "")}) == []  # a writer that drops ids: no end, nothing deleted
    assert keys(topic(3, ""), {"x": topic(2, "")}) == [("x", 2)]
    assert keys(topic(3, ""), {"x": topic(3, "b")}) == []  # server.ini's topic named by the group: markers decide


def test_logs_opened_from_server_ini_keep_their_own_incarnation_and_drop_another(tmp_path: Path):
    """At start the logs open before the group's configuration is read (no incarnation yet)."""

    async def scenario() -> None:
        first = MessageStoreManager({"x": topic(2, "a", str(tmp_path))}, 1 << 20)
        for partition in (0, 1):
            first.get_log("x", partition).append(encode_batch([(b"m", None)]))
        first.close()
        restarted = MessageStoreManager({"x": topic(2, "", str(tmp_path))}, 1 << 20)
        restarted.open_existing()
        ends = {p: restarted.get_log("x", p).log_end for p in (0, 1)}
        assert restarted.update_topics({"x": topic(2, "a", str(tmp_path))}) == []
        assert {p: restarted.get_log("x", p).log_end for p in (0, 1)} == ends, "a restart keeps its data"
        restarted.close()
        down_during_recreate = MessageStoreManager({"x": topic(2, "", str(tmp_path))}, 1 << 20)
        down_during_recreate.open_existing()
        dropped = down_during_recreate.update_topics({"x": topic(2, "b", str(tmp_path))})
        assert [(d.topic, d.partition) for d in dropped] == [("x", 0), ("x", 1)]
        down_during_recreate.dispose(dropped)
        assert down_during_recreate.get_log("x", 0).log_end == 0
        await down_during_recreate.stop()
        down_during_recreate.close()

    asyncio.run(scenario())


def test_a_directory_of_another_incarnation_is_never_served(tmp_path: Path):
    async def scenario() -> None:
        store = MessageStoreManager({"x": topic(1, "a", str(tmp_path))}, 1 << 20)
        store.start()
        store.get_log("x", 0).append(encode_batch([(b"old", None)]))
        old_end = store.get_log("x", 0).log_end
        await store.stop()
        store.close()
        directory = tmp_path / "x-0"
        assert incarnation.read_marker(directory) == "a"
        # A broker that missed the delete: its files are of "a", the group's topic is now "b".
        reborn = MessageStoreManager({"x": topic(1, "b", str(tmp_path))}, 1 << 20)
        assert not reborn.has_log("x", 0)
        assert reborn.get_log("x", 0).log_end == 0 < old_end
        assert incarnation.read_marker(directory) == "b"
        await reborn.stop()
        reborn.close()
        assert [p.name for p in tmp_path.iterdir()] == ["x-0"], "the old files are deleted"
        # A directory without a marker (older versions) is kept and adopted.
        (directory / incarnation.MARKER).unlink()
        assert incarnation.belongs(directory, "c")

    asyncio.run(scenario())


def test_a_deleted_topics_leftover_directories_are_deleted_and_nothing_else(tmp_path: Path):
    for name in ("gone-0", "gone-1", "gone-x", "gonex-0", "gone-1-0", "other-0"):
        (tmp_path / name).mkdir()

    async def scenario() -> None:
        store = MessageStoreManager({"gone-1": TopicConfig("gone-1", data_path=str(tmp_path))}, 1 << 20)
        store.remove_unserved("gone", str(tmp_path))
        store.remove_unserved("gone-1", str(tmp_path))  # served: kept
        await store.stop()

    asyncio.run(scenario())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone-1-0", "gone-x", "gonex-0", "other-0"]


def test_seeding_never_starts_a_new_incarnation():
    """A server.ini section has none; a member writing back what it serves (ZooKeeper lost the
    node) keeps its topics' ids, or every member would drop their files."""
    defaults = TopicConfig("")
    served = {"x": TopicConfig("x", num_partitions=2, incarnation="abc"), "y": TopicConfig("y")}
    seeded = seed_with(served, defaults)(GroupTopics())
    assert seeded is not None and seeded.incarnations == {"x": "abc"}
    assert seeded.with_topic("x", {"numPartitions": "3"}).incarnations["x"] == "abc"
