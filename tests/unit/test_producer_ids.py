"""Producer id blocks (metaq/server/producer_ids.py): unique, never reused after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metaq.server.producer_ids import BLOCK_SIZE, GROUP_SHIFT, ProducerIdAllocator, local_blocks, producer_id


def test_ids_come_from_blocks_and_a_restart_skips_the_rest_of_its_block(tmp_path: Path) -> None:
    async def take(allocator: ProducerIdAllocator, n: int) -> list[int]:
        return list(await asyncio.gather(*(allocator.allocate() for _ in range(n))))

    first = asyncio.run(take(ProducerIdAllocator(3, local_blocks(tmp_path)), BLOCK_SIZE + 2))
    assert len(set(first)) == len(first) and all(pid >> GROUP_SHIFT == 3 for pid in first)
    after_restart = asyncio.run(take(ProducerIdAllocator(3, local_blocks(tmp_path)), 1))
    assert after_restart == [producer_id(3, 2 * BLOCK_SIZE)]  # the half-used second block is skipped


def test_a_group_prefix_keeps_groups_apart_and_the_counter_is_bounded() -> None:
    assert producer_id(1, 0) != producer_id(0, 1 << 39)
    with pytest.raises(ValueError, match="exhausted"):
        producer_id(0, 1 << GROUP_SHIFT)


def test_after_zookeeper_lost_the_counter_it_restarts_past_every_id_of_the_group_in_the_logs():
    from metaq.server.producer_ids import highest_counter_in

    ids = [producer_id(3, 5), producer_id(3, 1999), producer_id(4, 90_000)]  # group 4's ids are not ours
    assert highest_counter_in(ids, 3) == 2000
    assert highest_counter_in(ids, 5) == 0
