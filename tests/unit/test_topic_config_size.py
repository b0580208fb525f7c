"""The group's topic configuration node at scale: under ZooKeeper's jute.maxbuffer at 10,000
topics, plain JSON while small (what earlier versions read), refused in one line past the limit."""

from __future__ import annotations

import json
import uuid

import pytest

from metaq.zk.topic_config import (
    COMPRESSED_PREFIX, MAX_NODE_BYTES, GroupTopics, TopicConfigTooLarge, decode_group_topics,
)


def _group(topics: int, partitions: int) -> GroupTopics:
    group = GroupTopics()
    for n in range(topics):
        group = group.with_topic(f"topic-{n:05d}", {"numPartitions": str(partitions), "unflushThreshold": "0"})
    return group


def test_ten_thousand_topics_fit_one_node_and_read_back_whole() -> None:
    group = _group(10_000, 1)
    data = group.encode()
    assert data.startswith(COMPRESSED_PREFIX) and len(data) < MAX_NODE_BYTES // 2
    back = decode_group_topics(data, 4)
    assert back.topics == group.topics and back.incarnations == group.incarnations and back.version == 4


def test_a_configuration_of_ordinary_size_stays_plain_json() -> None:
    group = _group(100, 100)  # 10,000 partitions in 100 topics
    data = group.encode()
    assert json.loads(data)["topics"]["topic-00042"]["numPartitions"] == "100"


def test_one_that_cannot_fit_even_compressed_is_refused_in_one_line() -> None:
    group = GroupTopics(deleted=frozenset(uuid.uuid4().hex + uuid.uuid4().hex for _ in range(40_000)))
    with pytest.raises(TopicConfigTooLarge, match=r"would take \d+ bytes in ZooKeeper even compressed, over the 1000000"):
        group.encode()


def test_a_compressed_value_that_does_not_inflate_is_a_bad_node_value() -> None:
    with pytest.raises(ValueError, match="bad topic configuration node value: compressed"):
        decode_group_topics(COMPRESSED_PREFIX + b"not zlib", 1)
