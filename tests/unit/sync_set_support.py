"""A ``SyncReplication`` over plain dicts, for unit tests of the sync set (no broker, no ZooKeeper)."""

from __future__ import annotations

from metaq.ha.sync_set import SyncReplication


async def _publish_nowhere(members: frozenset[int]) -> None:
    pass


def sync_over(ends: dict[tuple[str, int], int], positions: dict[tuple[int, str, int], int]) -> SyncReplication:
    """One sync slave needed, rejecting on loss; log and flushed ends from ``ends``, slave
    positions from ``positions`` (both read live, so a test moves them)."""
    return SyncReplication(
        1, 60_000, "reject", _publish_nowhere,
        log_end=lambda t, p: ends[(t, p)], flushed_end=lambda t, p: ends[(t, p)],
        partitions=lambda: list(ends), position=lambda s, t, p: positions.get((s, t, p)),
    )
