import json

import pytest

from metaq.zk.paths import (
    TopicNodeData,
    ZkPaths,
    broker_node_name,
    decode_epoch,
    decode_sync_set,
    encode_epoch,
    encode_sync_set,
    format_offset,
    parse_broker_node_name,
    parse_offset,
    parse_topic_node_data,
    partition_name,
    topic_node_data,
)


@pytest.fixture
def paths() -> ZkPaths:
    return ZkPaths()


def test_broker_paths_follow_metaq_layout(paths: ZkPaths) -> None:
    assert paths.broker_ids() == "/meta/brokers/ids"
    assert paths.broker(3) == "/meta/brokers/ids/3"
    assert paths.master(3) == "/meta/brokers/ids/3/master"
    assert paths.slave(3, 1) == "/meta/brokers/ids/3/slave1"
    assert paths.master_config_checksum(3) == "/meta/brokers/ids/3/master_config_checksum"
    assert paths.epoch(3) == "/meta/brokers/ids/3/epoch"
    assert paths.sync_set(3) == "/meta/brokers/ids/3/sync_set"


def test_topic_paths(paths: ZkPaths) -> None:
    assert paths.topics_pub() == "/meta/brokers/topics-pub"
    assert paths.topics_sub("t") == "/meta/brokers/topics-sub/t"
    assert paths.topic_pub_node("t", 0) == "/meta/brokers/topics-pub/t/0-m"
    assert paths.topic_sub_node("t", 0) == "/meta/brokers/topics-sub/t/0-m"
    assert paths.topic_sub_node("t", 0, slave_id=2) == "/meta/brokers/topics-sub/t/0-s2"


def test_consumer_paths(paths: ZkPaths) -> None:
    assert paths.consumer_group("g") == "/meta/consumers/g"
    assert paths.consumer_ids("g") == "/meta/consumers/g/ids"
    assert paths.consumer_id("g", "host-1-abc") == "/meta/consumers/g/ids/g_host-1-abc"
    assert paths.owners("g", "t") == "/meta/consumers/g/owners/t"
    assert paths.owner("g", "t", "0-1") == "/meta/consumers/g/owners/t/0-1"
    assert paths.offsets("g", "t") == "/meta/consumers/g/offsets/t"
    assert paths.offset("g", "t", partition_name(0, 1)) == "/meta/consumers/g/offsets/t/0-1"


@pytest.mark.parametrize("root, expected", [("/meta-x", "/meta-x/brokers/ids/1"), ("/a/b/", "/a/b/brokers/ids/1"), ("/", "/brokers/ids/1")])
def test_custom_roots(root: str, expected: str) -> None:
    assert ZkPaths(root).broker(1) == expected


def test_root_must_be_absolute() -> None:
    with pytest.raises(ValueError):
        ZkPaths("meta")


def test_broker_node_names_round_trip() -> None:
    assert broker_node_name(0) == "0-m"
    assert broker_node_name(5, 1) == "5-s1"
    assert parse_broker_node_name("0-m") == (0, None)
    assert parse_broker_node_name("12-s3") == (12, 3)
    for bad in ("0", "m", "0-x", "a-m", "0-s"):
        with pytest.raises(ValueError):
            parse_broker_node_name(bad)


def test_topic_node_data_is_metaq_json() -> None:
    assert topic_node_data(4, 0) == b'{"numParts":4,"broker":"0-m"}'
    assert json.loads(topic_node_data(2, 1, slave_id=0)) == {"numParts": 2, "broker": "1-s0"}
    assert parse_topic_node_data(b'{"numParts":4,"broker":"0-m"}') == TopicNodeData(4, 0, None)
    assert parse_topic_node_data('{"broker": "3-s2", "numParts": 1}') == TopicNodeData(1, 3, 2)


@pytest.mark.parametrize("bad", [b"4", b"{}", b'{"numParts":"x","broker":"0-m"}', b'{"numParts":1,"broker":"zz"}', b"not json"])
def test_parse_topic_node_data_rejects_garbage(bad: bytes) -> None:
    with pytest.raises(ValueError):
        parse_topic_node_data(bad)


def test_offsets_split_on_last_dash() -> None:
    assert format_offset(42, 1024) == "42-1024"
    assert parse_offset("42-1024") == (42, 1024)
    assert parse_offset("-1-0") == (-1, 0)
    assert parse_offset(b"-7-99") == (-7, 99)
    # Before MetaQ 1.4 the value was a bare offset.
    assert parse_offset("123") == (-1, 123)
    assert parse_offset(format_offset(-1, 5)) == (-1, 5)


@pytest.mark.parametrize("bad", ["", "-", "abc", "1-x", "x-1", "-5", "1--2"])
def test_parse_offset_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_offset(bad)


def test_epoch_value_round_trip_and_legacy_number() -> None:
    assert decode_epoch(encode_epoch(5, "meta://h:1")) == (5, "meta://h:1")
    assert decode_epoch(b"7") == (7, None)
    with pytest.raises(ValueError, match="bad epoch node value"):
        decode_epoch(b'{"leader": "x"}')


def test_sync_set_value_round_trip() -> None:
    assert decode_sync_set(encode_sync_set(frozenset({3, 1}), 2, 1)) == (frozenset({1, 3}), 2)
    assert json.loads(encode_sync_set(frozenset({3, 1}), 2, 1)) == {"slaves": [1, 3], "epoch": 2, "min_sync_slaves": 1}
    with pytest.raises(ValueError, match="bad sync_set node value"):
        decode_sync_set(b"[1, 2]")
