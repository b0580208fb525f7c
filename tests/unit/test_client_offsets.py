from __future__ import annotations

import asyncio
import json

from metaq.client.message import Partition
from metaq.client.offsets import LocalOffsetStore, Position


def test_local_store_round_trip_in_metaqs_format(tmp_path) -> None:
    path = tmp_path / "sub" / "offsets.json"
    store = LocalOffsetStore(path)

    async def scenario() -> None:
        assert await store.load("g", "t", Partition(0, 1)) is None
        await store.commit("g", "t", {Partition(0, 1): Position(77, 1234), Partition(1, 0): Position(-1, 0)})
        await store.commit("g", "u", {Partition(0, 0): Position(5, 10)})
        assert await store.load("g", "t", Partition(0, 1)) == Position(77, 1234)
        assert await store.load("g", "t", Partition(1, 0)) == Position(-1, 0)
        assert await LocalOffsetStore(path).load("g", "u", Partition(0, 0)) == Position(5, 10)

    asyncio.run(scenario())
    data = json.loads(path.read_text())
    assert data == {"g": {"t": {"0-1": "77-1234", "1-0": "-1-0"}, "u": {"0-0": "5-10"}}}
    assert [p.name for p in path.parent.iterdir()] == ["offsets.json"]  # no temp files left


def test_partition_names_parse_back() -> None:
    assert Partition.parse("12-3") == Partition(12, 3)
    assert str(Partition(12, 3)) == "12-3"
