"""The retry and dead-letter topics' names, envelopes, partition choice and settings (no I/O)."""

from __future__ import annotations

import pytest

from metaq.client import ConsumerConfig, Message, Partition
from metaq.client.retry_topics import (
    DEFAULT_RETRY_DELAYS_S, ENVELOPE_MARK, FailurePolicy, RetryPartitionSelector, due_at_ms, failure_info, failure_topic_names,
    parse_envelope,
)
from metaq.config import TOPIC_NAME_MAX, check_topic_name
from metaq.store.msgid import EPOCH


def test_names_follow_the_topic_name_rule_and_two_groups_never_share_one() -> None:
    assert failure_topic_names("billing") == ("__retry.billing", "__dlq.billing")
    groups = ["a b", "a_20b", "a_b", "a.b", "a-b", "ä", "x:y", "x%y", "_"]
    names = [failure_topic_names(group)[0] for group in groups]
    for name in names:
        assert check_topic_name(name) == name
    assert len(set(names)) == len(groups), names
    assert failure_topic_names("a b")[0] == "__retry.a_20b" and failure_topic_names("a_b")[0] == "__retry.a_5Fb"


def test_a_group_too_long_for_its_topics_is_cut_and_told_apart_by_a_hash_of_the_whole_name() -> None:
    longest = "g" * (TOPIC_NAME_MAX - len("__retry."))
    assert failure_topic_names(longest)[0] == "__retry." + longest
    names = {failure_topic_names(longest + tail)[0] for tail in ("g", "h", " x", "_" * 300)}
    assert len(names) == 4
    for name in names:
        assert check_topic_name(name) == name and len(name) <= TOPIC_NAME_MAX
        assert "_7E" in name
    assert failure_topic_names("ä" * 300)[1].startswith("__dlq._C3_A4")


@pytest.mark.parametrize("overrides, error", [
    ({"failure_store": "zk"}, "failure_store must be one of topic, local"),
    ({"max_reconsume_times": -1}, "max_reconsume_times must be an int >= 0"),
    ({"max_reconsume_times": True}, "max_reconsume_times must be an int >= 0"),
    ({"retry_delays_s": ()}, "retry_delays_s must be 1..64 delays"),
    ({"retry_delays_s": (1, -1)}, "retry_delays_s must be 1..64 delays"),
    ({"retry_delays_s": (1,) * 65}, "retry_delays_s must be 1..64 delays"),
    ({"retry_delays_s": ("10s",)}, "retry_delays_s must be 1..64 delays"),
    ({"retry_delays_s": 10}, "retry_delays_s must be 1..64 delays"),
    ({"retry_topic_partitions": 0}, "retry_topic_partitions must be None"),
    ({"retry_topic_partitions": 65}, "retry_topic_partitions must be None"),
])
def test_bad_failure_settings_are_one_value_error_naming_the_field(overrides, error) -> None:
    with pytest.raises(ValueError, match=error):
        ConsumerConfig(group="g", **overrides)


def test_defaults_are_rocketmqs() -> None:
    config = ConsumerConfig(group="g")
    assert (config.failure_store, config.max_reconsume_times, config.auto_create_failure_topics) == ("topic", 16, True)
    assert config.retry_delays_s == DEFAULT_RETRY_DELAYS_S == (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
    assert ConsumerConfig(group="g", retry_delays_s=[1, 2]).retry_delays_s == (1, 2)
    assert FailurePolicy.of(ConsumerConfig(group="g")).retry_partitions == 16
    assert FailurePolicy.of(ConsumerConfig(group="g", retry_delays_s=(1, 2), retry_topic_partitions=1)).retry_partitions == 1


def policy(**overrides) -> FailurePolicy:
    return FailurePolicy.of(ConsumerConfig(group="g", **{"retry_delays_s": (1, 5), "max_reconsume_times": 3, **overrides}))


def test_delivery_k_waits_the_kth_delay_the_last_repeating_then_goes_to_the_dead_letter_topic() -> None:
    rules = policy()
    original = Message("orders", b"\x00data", "eu", id=12345, partition=Partition(1, 2), offset=777)
    seen = []
    for attempts in (1, 2, 3, 4):
        topic, wrapped = rules.envelope(original, ValueError("bad row"), attempts)
        info = failure_info(wrapped)
        assert info is not None and wrapped.data == original.data and wrapped.topic == topic
        seen.append((topic, info.attempts, info.delay_ms))
        assert (info.topic, info.partition, info.offset, info.msg_id, info.attribute, info.error) == (
            "orders", Partition(1, 2), 777, 12345, "eu", "ValueError: bad row")
        assert info.original(wrapped.data) == original
    assert seen == [("__retry.g", 1, 1000), ("__retry.g", 2, 5000), ("__retry.g", 3, 5000), ("__dlq.g", 4, 0)]
    assert policy(max_reconsume_times=0).envelope(original, "x", 1)[0] == "__dlq.g"


def test_the_last_error_is_kept_short_and_an_empty_one_is_named() -> None:
    _, wrapped = policy().envelope(Message("t", b""), RuntimeError("x" * 5000), 1)
    assert len(failure_info(wrapped).error) == 1000  # type: ignore[union-attr]
    _, wrapped = policy().envelope(Message("t", b""), KeyError(), 1)
    assert failure_info(wrapped).error == "KeyError"  # type: ignore[union-attr]


@pytest.mark.parametrize("attribute", [
    "metaq-retry/1 {", "metaq-retry/1 {}", "metaq-retry/1 []",
    ENVELOPE_MARK + '{"topic":"t","partition":"zero","offset":0,"msg_id":1,"attribute":null,"attempts":1,"error":"","delay_ms":0}',
    ENVELOPE_MARK + '{"topic":"t","partition":"0-0","offset":0,"msg_id":1,"attribute":null,"attempts":0,"error":"","delay_ms":0}',
    ENVELOPE_MARK + '{"topic":"t","partition":"0-0","offset":0,"msg_id":1,"attribute":null,"attempts":1,"error":"","delay_ms":-5}',
    "plain attribute",
])
def test_a_malformed_envelope_is_a_value_error(attribute) -> None:
    with pytest.raises(ValueError):
        parse_envelope(attribute)


def test_a_plain_message_has_no_failure_info() -> None:
    assert failure_info(Message("t", b"x")) is None and failure_info(Message("t", b"x", "eu")) is None


def test_retries_go_to_one_partition_per_delivery_in_the_originals_broker_group() -> None:
    rules = policy()
    partitions = [Partition(b, n) for b in (0, 1) for n in range(3)]
    chosen = []
    for attempts in (1, 2, 3, 4):
        _, wrapped = rules.envelope(Message("t", b"", partition=Partition(1, 0), offset=0, id=1), "e", attempts)
        chosen.append(RetryPartitionSelector().select("__retry.g", partitions, wrapped))
    assert chosen == [Partition(1, 0), Partition(1, 1), Partition(1, 2), Partition(1, 0)]
    # A broker group without the retry topic: any of the others'.
    _, wrapped = rules.envelope(Message("t", b"", partition=Partition(7, 0), offset=0, id=1), "e", 2)
    assert RetryPartitionSelector().select("__retry.g", partitions, wrapped) == Partition(0, 1)


def test_a_retry_is_due_at_its_records_append_time_plus_the_delay() -> None:
    appended_ms = EPOCH + 1_000_000
    retried = Message("__retry.g", b"", policy().envelope(Message("t", b""), "e", 2)[1].attribute, id=(1_000_000 << 22) | 5)
    info = failure_info(retried)
    assert info is not None and due_at_ms(retried, info) == appended_ms + 5000


def test_a_retry_tells_its_listener_which_delivery_it_is_and_a_first_delivery_is_unchanged() -> None:
    import copy
    import pickle

    from metaq.client.codec import decode_messages, encode_messages

    original = Message("orders", b"\x00data", "eu", id=12345, partition=Partition(1, 2), offset=777)
    assert original.delivery_attempt == 1 and failure_info(original) is None
    # A first delivery is the plain Message: the bytes a producer sends are those of before.
    assert type(original) is Message and encode_messages([original]) == encode_messages([Message("orders", b"\x00data", "eu")])
    rules = policy()
    for failed in (1, 2, 3):
        topic, wrapped = rules.envelope(original, ValueError(f"bad row {failed}"), failed)
        retry = failure_info(wrapped).original(wrapped.data)  # type: ignore[union-attr]
        # Delivery failed + 1; RocketMQ's reconsumeTimes is failed; the last error is there too.
        assert retry.delivery_attempt == failed + 1
        info = failure_info(retry)
        assert info is not None and info.attempts == failed and info.error == f"ValueError: bad row {failed}"
        # Equal to, and hashed and unpacked like, the first delivery.
        assert retry == original and hash(retry) == hash(original) and tuple(retry) == tuple(original)
        assert isinstance(retry, Message) and retry.attribute == "eu" and encode_messages([retry]) == encode_messages([original])
        for copied in (pickle.loads(pickle.dumps(retry)), copy.copy(retry), copy.deepcopy(retry)):
            assert copied.delivery_attempt == failed + 1 and failure_info(copied) == info
    # What a consumer decodes from a fetch is a first delivery.
    body, _ = encode_messages([original])
    decoded, _end = decode_messages(body, 0, "orders", Partition(1, 2))
    assert [m.data for m in decoded] == [b"\x00data"]
    assert all(type(m) is Message and m.delivery_attempt == 1 and failure_info(m) is None for m in decoded)
