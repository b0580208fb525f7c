"""Transactional ids (metaq/server/transactional_ids.py): same producer id, epoch + 1, overflow, names."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from metaq.security.principal_tags import PrincipalTags
from metaq.server.producer_ids import ProducerIdAllocator, local_blocks, producer_id
from metaq.server.transactional_ids import (
    MAX_EPOCH, LocalMapping, NotOwner, Owner, TooManyNames, TransactionalIds, check_transactional_id, next_owner,
)


def names(tmp_path: Path) -> TransactionalIds:
    return TransactionalIds(ProducerIdAllocator(2, local_blocks(tmp_path)), LocalMapping(tmp_path))


def test_every_init_of_a_name_keeps_its_producer_id_and_raises_the_epoch_even_after_a_restart(tmp_path: Path) -> None:
    first, previous = asyncio.run(names(tmp_path).init("app-1"))
    assert previous is None and first == Owner(producer_id(2, 0), 0)
    second, previous = asyncio.run(names(tmp_path).init("app-1"))  # a new TransactionalIds: a restarted broker
    assert previous == first and second == Owner(first.producer_id, 1)
    other, _ = asyncio.run(names(tmp_path).init("app-2"))
    assert other.producer_id != first.producer_id and other.epoch == 0
    assert LocalMapping(tmp_path).read_all() == {"app-1": second, "app-2": other}


def test_concurrent_inits_of_one_name_get_distinct_epochs(tmp_path: Path) -> None:
    async def inits() -> list[tuple[Owner, Owner | None]]:
        ids = names(tmp_path)
        return list(await asyncio.gather(*(ids.init("app") for _ in range(8))))

    results = asyncio.run(inits())
    assert sorted(owner.epoch for owner, _ in results) == list(range(8))
    assert len({owner.producer_id for owner, _ in results}) == 1


def test_an_epoch_never_passes_int16_the_name_takes_a_new_producer_id(tmp_path: Path) -> None:
    assert next_owner(Owner(5, MAX_EPOCH - 1), None) == Owner(5, MAX_EPOCH)
    assert next_owner(Owner(5, MAX_EPOCH), None) is None  # a fresh id is needed
    assert next_owner(Owner(5, MAX_EPOCH), 9) == Owner(9, 0)
    LocalMapping(tmp_path).write("app", Owner(producer_id(2, 500_000), MAX_EPOCH), None)
    owner, previous = asyncio.run(names(tmp_path).init("app"))
    assert previous == Owner(producer_id(2, 500_000), MAX_EPOCH)
    assert owner.epoch == 0 and owner.producer_id != previous.producer_id


class RacingStore(LocalMapping):
    """A compare-and-set that loses once: another broker of the group inited the name in between."""

    def __init__(self, data_path: Path) -> None:
        super().__init__(data_path)
        self.lost = False

    def write(self, name: str, owner: Owner, version: Any) -> bool:
        if not self.lost:
            self.lost = True
            super().write(name, Owner(owner.producer_id, owner.epoch), None)  # the other broker's init
            return False
        return super().write(name, owner, version)


def test_an_init_that_loses_the_compare_and_set_reads_again_and_takes_the_next_epoch(tmp_path: Path) -> None:
    LocalMapping(tmp_path).write("app", Owner(77, 3), None)
    ids = TransactionalIds(ProducerIdAllocator(2, local_blocks(tmp_path)), RacingStore(tmp_path))
    owner, previous = asyncio.run(ids.init("app"))
    assert previous == Owner(77, 4) and owner == Owner(77, 5)


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".", "x" * 201, "white space", "ü", 7, None])
def test_a_name_from_the_network_is_checked_like_a_topic_name(bad: object) -> None:
    with pytest.raises(ValueError, match="transactional id"):
        check_transactional_id(bad)
    assert check_transactional_id("App_1.orders-eu") == "App_1.orders-eu"


def test_a_name_belongs_to_the_user_who_first_inited_it(tmp_path: Path) -> None:
    ids = names(tmp_path)
    first, _ = asyncio.run(ids.init("billing", "alice"))
    assert first.user_tag == "alice"  # without tags (no group key here) the name is its own tag
    with pytest.raises(NotOwner, match="belongs to another user"):
        asyncio.run(ids.init("billing", "mallory"))
    again, _ = asyncio.run(ids.init("billing", "alice"))
    by_admin, _ = asyncio.run(ids.init("billing", "root", admin=True))
    assert (again.epoch, by_admin.epoch, by_admin.user_tag) == (1, 2, "alice")
    open_name, _ = asyncio.run(ids.init("shared"))  # security off: nobody's
    assert open_name.user_tag is None and asyncio.run(ids.init("shared", "bob"))[0].user_tag == "bob"


def test_a_user_owns_at_most_max_per_user_names_counted_from_the_mapping(tmp_path: Path) -> None:
    async def inits() -> None:
        ids = TransactionalIds(ProducerIdAllocator(2, local_blocks(tmp_path)), LocalMapping(tmp_path), max_per_user=2)
        await ids.init("a-1", "alice")
        await ids.init("a-2", "alice")
        with pytest.raises(TooManyNames, match="user 'alice' already owns 2 transactional ids .maxTransactionalIdsPerUser."):
            await ids.init("a-3", "alice")
        await ids.init("a-1", "alice")  # a name it owns: a new epoch, not a new name
        await ids.init("b-1", "bob")  # the cap is per user
        # A restarted broker (a new master) counts from the mapping.
        again = TransactionalIds(ProducerIdAllocator(2, local_blocks(tmp_path)), LocalMapping(tmp_path), max_per_user=2)
        with pytest.raises(TooManyNames):
            await again.init("a-3", "alice")
        assert (await again.init("b-2", "bob"))[0].user_tag == "bob"

    asyncio.run(inits())
    assert sorted(LocalMapping(tmp_path).read_all()) == ["a-1", "a-2", "b-1", "b-2"]


def test_the_mapping_records_a_users_tag_never_the_name_and_a_legacy_name_is_honoured_and_rewritten(
        tmp_path: Path) -> None:
    tags = PrincipalTags(b"k" * 32)

    def tagged(max_per_user: int = 1000) -> TransactionalIds:
        return TransactionalIds(ProducerIdAllocator(2, local_blocks(tmp_path)), LocalMapping(tmp_path), max_per_user,
                                tags)

    first, _ = asyncio.run(tagged().init("billing", "alice"))
    assert first.user_tag == tags.tag("alice")
    raw = (tmp_path / "transactional-ids").read_bytes()
    assert b"alice" not in raw and tags.tag("alice").encode() in raw
    with pytest.raises(NotOwner) as refused:
        asyncio.run(tagged().init("billing", "mallory"))
    assert "alice" not in str(refused.value)
    # A node written before tags names its user: still that user's, rewritten with the tag at its next init.
    LocalMapping(tmp_path).write("old", Owner(producer_id(2, 900), 4, legacy_user="alice"), None)
    with pytest.raises(NotOwner):
        asyncio.run(tagged().init("old", "mallory"))
    with pytest.raises(TooManyNames):  # the legacy name counts as alice's
        asyncio.run(tagged(max_per_user=2).init("third", "alice"))
    again, _ = asyncio.run(tagged().init("old", "alice"))
    assert (again.epoch, again.user_tag, again.legacy_user) == (5, tags.tag("alice"), None)
    assert b"alice" not in (tmp_path / "transactional-ids").read_bytes()
