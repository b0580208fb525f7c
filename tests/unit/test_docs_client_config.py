"""docs/client.md, "Settings reference": "A bad value is a ValueError naming the field, at construction"."""

from __future__ import annotations

import pytest

from metaq.client import ConsumerConfig, MetaClientConfig

CLIENT_BAD_VALUES = [
    ("zk_session_timeout_ms", 0), ("zk_connection_timeout_ms", -1), ("request_timeout_s", 0),
    ("connect_timeout_s", -1.0), ("send_timeout_s", 0), ("send_max_attempts", 0),
    ("send_retry_min_wait_s", -0.1), ("send_retry_max_wait_s", 0), ("linger_ms", -1), ("batch_size", 0),
    ("buffer_memory", 0), ("max_in_flight_per_connection", 0), ("max_in_flight_per_partition", 6),
    ("zk_root", "meta"), ("zk_root", "/meta/."), ("zk_root", "/a/../meta"),  # kazoo refuses '.' and '..' in every call
]

CONSUMER_BAD_VALUES = [
    ("consumer_id", ""), ("consumer_id", "host/1"),
    ("offset", -1), ("fetch_size", 0), ("fetch_wait_ms", -1), ("fetch_retry_min_s", 0), ("fetch_retry_max_s", 0),
    ("commit_interval_s", 0), ("max_retries", 0), ("recover_interval_s", 0), ("claim_timeout_s", 0),
    ("iterator_timeout_s", 0), ("iterator_timeout_s", -2.5),
]


@pytest.mark.parametrize(("field", "value"), CLIENT_BAD_VALUES)
def test_a_bad_client_setting_is_a_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        MetaClientConfig(**{field: value})


@pytest.mark.parametrize(("field", "value"), CONSUMER_BAD_VALUES)
def test_a_bad_consumer_setting_is_a_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        ConsumerConfig(group="g", **{field: value})


def test_ranges_whose_ends_are_reversed_are_refused_naming_both_ends() -> None:
    with pytest.raises(ValueError, match="send_retry_min_wait_s must be <= send_retry_max_wait_s"):
        MetaClientConfig(send_retry_min_wait_s=1.0, send_retry_max_wait_s=0.5)
    with pytest.raises(ValueError, match="fetch_retry_min_s must be <= fetch_retry_max_s"):
        ConsumerConfig(group="g", fetch_retry_min_s=3.0)
    with pytest.raises(ValueError, match="fetch_size must be <= max_fetch_size"):
        ConsumerConfig(group="g", fetch_size=2048, max_fetch_size=1024)


def test_two_offset_stores_at_once_are_refused() -> None:
    with pytest.raises(ValueError, match="offset_store_path and offset_store_url"):
        ConsumerConfig(group="g", offset_store_path="/tmp/offsets.json", offset_store_url="sqlite://")


def test_the_documented_defaults_and_edge_values_are_accepted() -> None:
    client = MetaClientConfig(linger_ms=0, send_retry_min_wait_s=0, send_retry_max_wait_s=0.001)
    assert (client.send_timeout_s, client.send_max_attempts, client.batch_size) == (15.0, 100, 256 * 1024)
    consumer = ConsumerConfig(group="g", fetch_wait_ms=0, iterator_timeout_s=None, offset=0)
    assert (consumer.fetch_size, consumer.max_fetch_size, consumer.commit_interval_s) == (256 * 1024, 64 << 20, 5.0)


@pytest.mark.parametrize("group", ["", "a/b", ".", "..", None])
def test_a_group_that_cannot_name_a_zookeeper_node_is_refused(group: object) -> None:
    with pytest.raises(ValueError, match="consumer group must be a non-empty name without '/'"):
        ConsumerConfig(group=group)  # type: ignore[arg-type]
