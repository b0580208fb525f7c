"""The consumer-group split: every partition to exactly one member, contiguous, balanced."""

from __future__ import annotations

from hypothesis import given, strategies as st

from metaq.client.message import Partition
from metaq.client.rebalance import assign_range


def parts(*names: str) -> list[Partition]:
    return [Partition.parse(n) for n in names]


def test_range_split_like_metaq() -> None:
    partitions = parts("0-0", "0-1", "0-2", "1-0", "1-1")
    members = ["g_c", "g_a", "g_b"]  # sorted: a, b, c
    assert assign_range(partitions, members, "g_a") == parts("0-0", "0-1")
    assert assign_range(partitions, members, "g_b") == parts("0-2", "1-0")
    assert assign_range(partitions, members, "g_c") == parts("1-1")


def test_partitions_sort_numerically_not_as_strings() -> None:
    partitions = parts("10-0", "9-1", "9-0", "2-10", "2-9")
    assert assign_range(partitions, ["only"], "only") == parts("2-9", "2-10", "9-0", "9-1", "10-0")


def test_more_members_than_partitions_leaves_some_idle() -> None:
    partitions = parts("0-0", "0-1")
    members = ["a", "b", "c"]
    assert [assign_range(partitions, members, m) for m in members] == [parts("0-0"), parts("0-1"), []]


def test_unknown_member_and_no_partitions_get_nothing() -> None:
    assert assign_range(parts("0-0"), ["a"], "z") == []
    assert assign_range([], ["a"], "a") == []


@given(
    st.sets(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=60),
    st.sets(st.text(alphabet="abcdef0123", min_size=1, max_size=6), min_size=1, max_size=10),
)
def test_every_partition_has_exactly_one_owner(pairs: set[tuple[int, int]], members: set[str]) -> None:
    partitions = [Partition(b, n) for b, n in pairs]
    shares = {m: assign_range(partitions, list(members), m) for m in members}
    owned = [p for share in shares.values() for p in share]
    assert sorted(owned) == sorted(partitions)
    sizes = [len(s) for s in shares.values()]
    assert max(sizes) - min(sizes) <= 1
    ordered = sorted(partitions)
    for share in shares.values():
        if share:  # contiguous in the sorted order
            start = ordered.index(share[0])
            assert ordered[start : start + len(share)] == share
