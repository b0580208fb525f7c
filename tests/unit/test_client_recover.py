from __future__ import annotations

import asyncio

from metaq.client.message import Message, Partition
from metaq.client.recover import RecoverManager, RecoverStore


def message(offset: int, data: bytes = b"payload", attribute: str | None = "attr") -> Message:
    return Message("t", data, attribute, id=900 + offset, partition=Partition(1, 2), offset=offset)


def test_store_keeps_messages_whole_and_in_order(tmp_path) -> None:
    store = RecoverStore(tmp_path)
    store.append(message(40, b"second"))
    store.append(message(4, b"first", None))
    pending = store.pending("t")
    assert [m for _, m in pending] == [message(4, b"first", None), message(40, b"second")]
    assert store.count() == 2 and store.count("t") == 2 and store.pending("other") == []
    store.remove(pending[0][0])
    assert [m.offset for _, m in store.pending("t")] == [40]


def test_unreadable_files_are_skipped(tmp_path) -> None:
    store = RecoverStore(tmp_path)
    store.append(message(1))
    (tmp_path / "t" / "1-2-00000000000000000009.rec").write_bytes(b"\x00\x00\x00\x05torn")
    assert [m.offset for _, m in store.pending("t")] == [1]


def test_manager_removes_only_what_the_listener_accepted(tmp_path) -> None:
    store = RecoverStore(tmp_path)
    for offset in (1, 2, 3):
        store.append(message(offset))
    seen = []

    async def deliver(m: Message) -> bool:
        seen.append(m.offset)
        return m.offset != 2

    manager = RecoverManager(store, interval=60)
    manager.register("t", deliver)
    assert asyncio.run(manager.run_once()) == 2
    assert seen == [1, 2, 3]
    assert [m.offset for _, m in store.pending("t")] == [2]
