from __future__ import annotations

import pytest

from metaq.client.message import Message, Partition
from metaq.client.selector import KeyHashPartitionSelector, NoPartitionAvailable, RoundRobinPartitionSelector

P = [Partition(0, 0), Partition(0, 1), Partition(1, 0)]


def test_round_robin_cycles_per_topic() -> None:
    selector = RoundRobinPartitionSelector()
    picks = [selector.select("a", P, Message("a", b"x")) for _ in range(6)]
    assert picks == P + P
    assert selector.select("b", P, Message("b", b"x")) == P[0]  # its own counter


def test_no_partition_is_a_retriable_lookup_error() -> None:
    with pytest.raises(NoPartitionAvailable, match="no available partition"):
        RoundRobinPartitionSelector().select("a", [], Message("a", b"x"))


def test_key_hash_sends_a_key_to_one_partition() -> None:
    selector = KeyHashPartitionSelector()
    for key in ("order-1", "order-2", "user-77"):
        picks = {selector.select("a", P, Message("a", b"x", attribute=key)) for _ in range(20)}
        assert len(picks) == 1
    spread = {selector.select("a", P, Message("a", b"x", attribute=f"k{i}")) for i in range(100)}
    assert spread == set(P)


def test_key_hash_is_the_same_in_every_process() -> None:
    # CRC32, not hash(): fixed values, whatever PYTHONHASHSEED is.
    selector = KeyHashPartitionSelector(key=lambda m: m.data)
    assert selector.select("a", P, Message("a", b"abc")) == P[0x352441C2 % 3]


def test_key_hash_needs_a_key() -> None:
    with pytest.raises(ValueError, match="needs a key"):
        KeyHashPartitionSelector().select("a", P, Message("a", b"x"))


def test_stable_key_hash_fails_instead_of_moving_a_key() -> None:
    selector = KeyHashPartitionSelector(stable=True, all_partitions=P)
    message = Message("a", b"x", attribute="k")
    home = selector.select("a", P, message)
    with pytest.raises(NoPartitionAvailable, match="has no master"):
        selector.select("a", [p for p in P if p != home], message)


@pytest.mark.parametrize(("kwargs", "error", "named"), [
    ({"key": "attribute"}, TypeError, "key must be a function of the message"),
    ({"stable": True}, ValueError, r"stable=True\) needs all_partitions"),
    ({"stable": True, "all_partitions": []}, ValueError, r"stable=True\) needs all_partitions"),
    ({"all_partitions": P}, ValueError, "all_partitions is used only with stable=True"),
])
def test_a_key_hash_selector_that_could_not_keep_its_promise_is_refused(kwargs, error, named) -> None:
    with pytest.raises(error, match=named):
        KeyHashPartitionSelector(**kwargs)
