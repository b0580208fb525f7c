"""Answers about the group's log are used only from the acting master of ZooKeeper's epoch
(metaq/ha/answerer.py): the broker's side (who answers, the structured ``not_master`` refusal),
the rejoin's side (truncation and epoch adoption) and the follower's (said once, ZooKeeper asked).

Unit tests with fakes: the broker in-process without ZooKeeper (its role patched), fake peers
for the asker. The integration test against real processes is
tests/integration/test_rejoin_not_master.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from metaq import record
from metaq.client.connection import Reply
from metaq.ha import followership as followership_module
from metaq.ha.answerer import ACTING_MASTER_ROLES, NOT_MASTER, NotTheMaster, check_master_answer
from metaq.ha.follower import MasterFollower
from metaq.ha.followership import Followership, MasterSuperseded
from metaq.ha.node import HaNode
from metaq.ha.replica import PartitionReplica
from metaq.protocol import commands as c

from .test_ha_truncation import new_log, records
from .test_server_handlers import RegisteredSlaves, put_header, run, running


def reply(**header: Any) -> Reply:
    return Reply({"code": c.OK, **header}, bytearray())


# --- the check --------------------------------------------------------------------------


def test_only_the_acting_master_of_zookeepers_epoch_is_believed() -> None:
    check_master_answer(reply(role="master", serving_epoch=4), "h:1", "epochs t-0", 4)
    check_master_answer(reply(role="fenced", serving_epoch=4), "h:1", "epochs t-0", 4)  # still the epoch's log
    refused = [
        reply(role="slave1", serving_epoch=4),  # another slave: its history is a copy, maybe behind
        reply(role="master", serving_epoch=3),  # a deposed master that has not heard yet
        reply(role="master", serving_epoch=5),  # ZooKeeper moved on since we read it
        reply(role="master", serving_epoch=True),
        reply(role="orphaned", serving_epoch=4),
        reply(role=["master"], serving_epoch=4),  # malformed: refused, not a crash
        reply(),  # a peer that says nothing about itself (an older broker): not believed
        Reply({"code": c.FORBIDDEN, "msg": "broker 0 is not the master (slave2)", c.REASON_FIELD: NOT_MASTER,
               "role": "slave2", "serving_epoch": 4}, bytearray()),
    ]
    for answer in refused:
        with pytest.raises(NotTheMaster) as caught:
            check_master_answer(answer, "h:1", "epochs t-0", 4)
        assert "h:1" in str(caught.value) and "epoch 4" in str(caught.value)
    # Any other error is the caller's to report (a 404 for a topic the master lacks, say).
    check_master_answer(Reply({"code": c.NOT_FOUND, "msg": "unknown topic"}, bytearray()), "h:1", "epochs t-0", 4)
    assert ACTING_MASTER_ROLES == {"master", "fenced", "resigned"}


# --- the broker's side ------------------------------------------------------------------


def not_master(monkeypatch: pytest.MonkeyPatch, role: str = "slave2") -> None:
    """The in-process broker (no ZooKeeper, so it leads) answers as a broker that does not."""
    monkeypatch.setattr(HaNode, "acting_master", property(lambda self: False))
    monkeypatch.setattr(HaNode, "role_name", property(lambda self: role))


def test_epoch_answers_say_who_answers_and_epoch_end_is_the_masters_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            await conn.request(put_header("gc"), record.encode_batch([(b"x" * 10, None)]))
            epochs = await conn.request({"op": "epochs", "topic": "gc", "partition": 0})
            assert epochs.code == 200 and epochs["role"] == "master" and epochs["serving_epoch"] == 0
            # Without ZooKeeper no epochs are kept: still the master's 404, not a refusal.
            end = await conn.request({"op": "epoch_end", "topic": "gc", "partition": 0, "epoch": 1})
            assert end.code == 404 and end.reason is None

            not_master(monkeypatch)
            end = await conn.request({"op": "epoch_end", "topic": "gc", "partition": 0, "epoch": 1})
            assert end.code == 403 and end.reason == NOT_MASTER
            assert (end["role"], end["serving_epoch"]) == ("slave2", 0) and "not the master (slave2)" in end.message
            # ``epochs`` is any member's history (drill, console, chaos checker read slaves'): answered, with who.
            epochs = await conn.request({"op": "epochs", "topic": "gc", "partition": 0})
            assert epochs.code == 200 and epochs["role"] == "slave2" and epochs["serving_epoch"] == 0

    run(scenario())


def test_replication_refused_by_a_broker_that_is_not_the_master_carries_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            broker.registry = RegisteredSlaves(4)
            not_master(monkeypatch, "slave2")
            replica = {"slave_id": 4, "epoch": 0, "log_end": 0}
            for header in ({"op": "get", "topic": "gc", "partition": 0, "offset": 0, "replica": replica},
                           {"op": "position", "topic": "gc", "partition": 0, "replica": replica},
                           {"op": "news", "replica": replica}):
                answer = await conn.request(header)
                assert answer.code == 403 and answer.reason == NOT_MASTER, (header, answer.header)
                assert answer["role"] == "slave2" and answer["serving_epoch"] == 0

    run(scenario())


# --- the rejoin's side ------------------------------------------------------------------


class Peer:
    """A peer at the master's address: answers epoch_end / epochs / offset / checksum from ``log``,
    saying it is ``role`` in ``serving_epoch``."""

    address = "127.0.0.1:9"

    def __init__(self, log: Any, role: str, serving_epoch: int, history: list[list[int]]) -> None:
        self.log, self.role, self.serving_epoch, self.history = log, role, serving_epoch, history
        self.asked: list[str] = []
        self.closed = False

    async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Reply:
        op = header["op"]
        self.asked.append(op)
        who = {"role": self.role, "serving_epoch": self.serving_epoch}
        if op == "epoch_end":
            return Reply({"code": c.OK, "epoch": 1, "end_offset": self.log.log_end, **who}, bytearray())
        if op == "epochs":
            return Reply({"code": c.OK, "entries": self.history, **who}, bytearray())
        if op == "offset":
            return Reply({"code": c.OK, "offset": 0, "min_offset": self.log.min_offset, "max_offset": self.log.log_end}, bytearray())
        assert op == "checksum", header
        start, end = header["start"], min(header["end"], self.log.log_end)
        return Reply({"code": c.OK, "start": start, "end": end, "crc": self.log.crc32(start, end)}, bytearray())

    def close(self) -> None:
        self.closed = True


def rejoining(tmp_path: Path, peer: Peer, master_epoch: int) -> tuple[Followership, Any]:
    """A Followership over one partition whose log holds 20 records of epoch 1 and 10 of epoch 2."""
    from metaq.config import TopicConfig
    from metaq.server.partitions import Partitions
    from metaq.store.manager import MessageStoreManager

    store = MessageStoreManager({"t": TopicConfig(name="t", data_path=str(tmp_path / "data"), num_partitions=1)},
                                max_message_size=1 << 20)
    partitions = Partitions(store)
    owner = partitions.get("t", 0)
    owner.append_as_follower(b"".join(records("shared", 20)))
    asyncio.run(owner.adopt_epochs([(1, 0)]))
    owner.append_as_follower(b"".join(records("ours", 10)))
    asyncio.run(owner.adopt_epochs([(1, 0), (2, owner.log.log_end - 10 * len(records("ours", 1)[0]))]))

    class Host:
        registry = type("Registry", (), {"slave_id": 1})()

    Host.partitions = partitions  # type: ignore[attr-defined]
    ship = Followership.__new__(Followership)  # the truncation part only
    ship.host, ship.follower, ship.truncations, ship.stopping = Host(), None, [], False
    ship.superseded = lambda: False
    ship._truncating, ship._refusals, ship._refusal_said = None, 0, None
    ship.master_epoch, ship.held_back = master_epoch, {}

    async def open_peer(*_: Any, **__: Any) -> Peer:
        return peer

    return ship, (store, owner, open_peer)


def test_a_rejoin_never_cuts_to_a_broker_that_answers_as_a_slave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The broker at the master's address is a slave (a stale address) holding the shared prefix
    only: believed, the rejoin would cut our 10 records of epoch 2 that the real master holds."""
    other = new_log(tmp_path / "other", records("shared", 20))
    peer = Peer(other, "slave3", 2, [[1, 0]])
    ship, (store, owner, open_peer) = rejoining(tmp_path, peer, master_epoch=2)
    monkeypatch.setattr(followership_module, "open_peer", open_peer)
    monkeypatch.setattr(followership_module, "REFUSED_WAIT_FIRST_S", 0.01)
    end, history = owner.log.log_end, list(owner.epochs.entries)

    for _ in range(3):
        with pytest.raises(MasterSuperseded, match="not the acting master of epoch 2"):
            asyncio.run(ship.truncate_against("meta://127.0.0.1:9"))
    assert owner.log.log_end == end and list(owner.epochs.entries) == history and ship.truncations == []
    assert peer.asked == ["epoch_end"] * 3, "refused at its first answer: no byte comparison, no history copied"
    assert peer.closed
    said = [r for r in caplog.records if "slave3" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, "the same refusal is said once, not per retry"
    assert "reading the group's master from ZooKeeper again" in said[0].getMessage()
    assert ship._refusals == 3
    store.close()


def test_a_deposed_master_of_an_older_epoch_is_not_believed_either(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = new_log(tmp_path / "other", records("shared", 20))
    peer = Peer(other, "master", 1, [[1, 0]])  # it led epoch 1 and has not heard of epoch 2
    ship, (store, owner, open_peer) = rejoining(tmp_path, peer, master_epoch=2)
    monkeypatch.setattr(followership_module, "open_peer", open_peer)
    monkeypatch.setattr(followership_module, "REFUSED_WAIT_FIRST_S", 0.01)
    end = owner.log.log_end
    with pytest.raises(MasterSuperseded):
        asyncio.run(ship.truncate_against("meta://127.0.0.1:9"))
    assert owner.log.log_end == end
    store.close()


def test_the_master_of_zookeepers_epoch_is_believed_and_the_refusal_count_resets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    master = new_log(tmp_path / "master", records("shared", 20) + records("theirs", 5))
    shared_end = sum(len(r) for r in records("shared", 20))
    peer = Peer(master, "master", 3, [[1, 0], [3, shared_end]])
    ship, (store, owner, open_peer) = rejoining(tmp_path, peer, master_epoch=3)
    monkeypatch.setattr(followership_module, "open_peer", open_peer)
    ship._refusals = 2
    asyncio.run(ship.truncate_against("meta://127.0.0.1:9"))
    assert owner.log.log_end == shared_end, "cut where epoch 1 ends in the master's log"
    assert list(owner.epochs.entries) == [(1, 0), (3, shared_end)] and ship._refusals == 0
    store.close()


# --- the follower's side ----------------------------------------------------------------


def test_a_not_master_refusal_of_a_fetch_is_a_structured_error(tmp_path: Path) -> None:
    """Before: a plain ConnectionError, retried silently; the slave parsed no field of it."""
    from metaq.config import TopicConfig
    from metaq.server.partitions import Partitions
    from metaq.store.manager import MessageStoreManager

    store = MessageStoreManager({"t": TopicConfig(name="t", data_path=str(tmp_path / "data"), num_partitions=1)},
                                max_message_size=1 << 20)
    owner = Partitions(store).get("t", 0)
    replica = PartitionReplica("t", 0, owner, store.flusher("t", 0), lambda: {"slave_id": 1, "epoch": 2},
                               lambda *_: None, 500)

    class Refusing:
        address = "127.0.0.1:9"

        async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Reply:
            return Reply({"code": c.FORBIDDEN, "msg": "broker 0 is not the master (slave2)", c.REASON_FIELD: NOT_MASTER,
                          "role": "slave2", "serving_epoch": 2}, bytearray())

    with pytest.raises(NotTheMaster) as caught:
        asyncio.run(replica.fetch_once(Refusing(), wait=False))  # type: ignore[arg-type]
    assert caught.value.role == "slave2" and caught.value.serving_epoch == 2
    store.close()


def test_the_follower_says_a_not_master_refusal_once_per_following_and_asks_zookeeper(caplog: pytest.LogCaptureFixture) -> None:
    follower = MasterFollower.__new__(MasterFollower)  # only the refusal's handling runs here
    looks: list[int] = []
    follower._on_stale_master = lambda: looks.append(1)
    refusal = NotTheMaster("127.0.0.1:9", "t-0-0", "slave2", 2, None)
    for _ in range(50):  # every partition's fetch, every retry
        follower._master_refused(refusal, generation=7)
    assert len(looks) == 1
    follower._master_refused(refusal, generation=8)  # following again (ZooKeeper named it again)
    assert len(looks) == 2
    said = [r for r in caplog.records if "answers as slave2" in r.getMessage()]
    assert len(said) == 2 and all("asking ZooKeeper who leads" in r.getMessage() for r in said)


def test_the_follower_backs_off_while_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No tight loop: a refused partition's fetches space out (doubling up to NOT_MASTER_WAIT_MAX_S)."""
    from metaq.ha import follower as follower_module

    sleeps: list[float] = []
    follower = MasterFollower.__new__(MasterFollower)
    follower._on_stale_master = lambda: None
    follower._stopped, follower._generation, follower.news_supported = False, 1, True
    follower.slave = type("Slave", (), {"slave_max_delay_ms": 500})()
    replica = type("Replica", (), {"topic": "t", "partition": 0, "name": "t-0-0"})()
    fetches = 0

    async def connection() -> Any:
        return None

    async def fetch(*_: Any, **__: Any) -> None:
        nonlocal fetches
        fetches += 1
        if fetches > 8:
            follower._stopped = True
        raise NotTheMaster("127.0.0.1:9", "t-0-0", "slave2", 2, None)

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    follower._connection, follower._fetch = connection, fetch
    follower._replica = lambda key: replica
    replica.log = type("Log", (), {"log_end": 0})()
    monkeypatch.setattr(follower_module.asyncio, "sleep", sleep)
    asyncio.run(follower._replicate(replica, 1))
    assert sleeps[0] >= 0.5 and sleeps == sorted(sleeps) and sleeps[-1] == follower_module.NOT_MASTER_WAIT_MAX_S
