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


def test_local_store_does_not_apply_an_offset_of_another_incarnation(tmp_path) -> None:
    """offsets.applies on the file store: an offset committed in incarnation "a" is not loaded
    for "b" (the topic was deleted and re-created); one of a file without incarnations is kept."""
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps({"g": {"t": {"0-2": "3-30"}}}))  # written by a version without incarnations
    store = LocalOffsetStore(path)

    async def scenario() -> None:
        await store.commit("g", "t", {Partition(0, 0): Position(7, 120)}, incarnations={Partition(0, 0): "a"})
        await store.commit("g", "t", {Partition(0, 1): Position(8, 130)}, incarnations={Partition(0, 1): ""})
        assert await store.load("g", "t", Partition(0, 0), incarnation="a") == Position(7, 120)
        assert await store.load("g", "t", Partition(0, 0), incarnation="b") is None
        assert await store.load("g", "t", Partition(0, 0)) == Position(7, 120)  # unknown: kept
        assert await store.load("g", "t", Partition(0, 1), incarnation="b") is None  # only a create gives an id
        assert await store.load("g", "t", Partition(0, 2), incarnation="b") == Position(3, 30)  # no guess
        await store.commit("g", "t", {Partition(0, 0): Position(-1, 40)})  # incarnation unknown
        assert await store.load("g", "t", Partition(0, 0), incarnation="b") == Position(-1, 40)

    asyncio.run(scenario())
    assert json.loads(path.read_text())["g"]["t"]["incarnations"] == {"0-1": ""}
