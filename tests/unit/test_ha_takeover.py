"""The fast takeover's pieces (metaq/ha/takeover.py, election._add_deposal): the transition
table, each piece of evidence, and the deposal added to the election transaction."""

from __future__ import annotations

import asyncio
import json
import socket
from types import SimpleNamespace

import pytest
from kazoo.exceptions import NoNodeError

from metaq.ha import takeover
from metaq.ha.election import Deposal, _add_deposal
from metaq.ha.takeover import Phase, Seen, connected_sessions, next_phase, probe_port, zk_servers
from metaq.zk.embedded import free_port
from metaq.zk.paths import ZkPaths

CONS = (
    " /127.0.0.1:40668[1](queued=0,recved=5,sent=5,sid=0x1000a6f0f6f0000,lop=PING,est=1,to=700,lcxid=0x3,"
    "lzxid=0xffffffffffffffff,lresp=1,llat=0,minlat=0,avglat=0.0,maxlat=1)\n"
    " /127.0.0.1:40670[0](queued=0,recved=1,sent=0)\n"
)


# --- the transition table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "phase, seen, expected",
    [
        (Phase.IDLE, Seen.FOLLOW, Phase.WATCHING),
        (Phase.WATCHING, Seen.DROPPED, Phase.PROBING),
        (Phase.PROBING, Seen.REFUSED, Phase.ASKING_ZK),
        (Phase.PROBING, Seen.ANSWERED, Phase.WATCHING),
        (Phase.PROBING, Seen.SILENT, Phase.STANDBY),
        (Phase.ASKING_ZK, Seen.SESSION_GONE, Phase.DEAD),
        (Phase.ASKING_ZK, Seen.SESSION_SEEN, Phase.STANDBY),
        (Phase.DEAD, Seen.FOLLOW, Phase.WATCHING),
        (Phase.STANDBY, Seen.UNFOLLOW, Phase.IDLE),
    ],
)
def test_rows(phase, seen, expected):
    assert next_phase(phase, seen) is expected


@pytest.mark.parametrize(
    "phase, seen",
    [
        # Death is only concluded in order: a drop, then a refusal, then ZooKeeper.
        (Phase.WATCHING, Seen.REFUSED),
        (Phase.WATCHING, Seen.SESSION_GONE),
        (Phase.PROBING, Seen.SESSION_GONE),
        (Phase.IDLE, Seen.DROPPED),
        (Phase.STANDBY, Seen.SESSION_GONE),
        (Phase.DEAD, Seen.DROPPED),
    ],
)
def test_everything_else_is_ignored(phase, seen):
    assert next_phase(phase, seen) is None


def test_dead_is_reached_only_through_every_piece_of_evidence():
    """No path from WATCHING to DEAD skips the drop, the refusal or ZooKeeper's word."""
    paths = {(Phase.WATCHING, ())}
    reached: set[tuple[Seen, ...]] = set()
    for _ in range(6):
        grown = set()
        for phase, trail in paths:
            for seen in Seen:
                if seen in (Seen.FOLLOW, Seen.UNFOLLOW):
                    continue
                new = next_phase(phase, seen)
                if new is None:
                    continue
                if new is Phase.DEAD:
                    reached.add(trail + (seen,))
                grown.add((new, trail + (seen,)))
        paths = grown
    assert reached and all(t[-3:] == (Seen.DROPPED, Seen.REFUSED, Seen.SESSION_GONE) for t in reached)


# --- the evidence ----------------------------------------------------------------------------


def test_zk_servers_of_a_connect_string():
    assert zk_servers("a:2181,b:2182/chroot") == [("a", 2181), ("b", 2182)]
    assert zk_servers("[::1]:2181") == [("::1", 2181)]


def test_connected_sessions_lists_every_servers_sessions(monkeypatch):
    monkeypatch.setattr(takeover, "four_letter_word", lambda host, port, command, **_: CONS)
    assert connected_sessions([("a", 1), ("b", 2)], None) == {0x1000A6F0F6F0000}


def test_connected_sessions_cannot_tell_when_cons_is_refused_or_a_server_is_down(monkeypatch):
    monkeypatch.setattr(takeover, "four_letter_word",
                        lambda *_, **__: "cons is not executed because it is not in the whitelist.\n")
    assert connected_sessions([("a", 1)], None) is None

    def down(host, *_, **__):
        if host == "b":
            raise ConnectionRefusedError()
        return CONS

    monkeypatch.setattr(takeover, "four_letter_word", down)
    assert connected_sessions([("a", 1), ("b", 2)], None) is None


def test_probe_port_tells_refused_from_answered():
    port = free_port("127.0.0.1")
    assert asyncio.run(probe_port(f"meta://127.0.0.1:{port}")) is Seen.REFUSED
    with socket.create_server(("127.0.0.1", 0)) as listening:
        # Accepted by the kernel's backlog even if nobody calls accept(): like a SIGSTOPped broker.
        bound = listening.getsockname()[1]
        assert asyncio.run(probe_port(f"meta://127.0.0.1:{bound}")) is Seen.ANSWERED


# --- the deposal inside the election transaction -------------------------------------------


class _Answer:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


class _Client:
    def __init__(self, owner, sync_set=None):
        self.owner, self.sync_set = owner, sync_set

    def exists_async(self, path):
        return _Answer(None if self.owner is None else SimpleNamespace(ephemeralOwner=self.owner, version=0))

    def get_async(self, path):
        if self.sync_set is None:
            return _Answer(error=NoNodeError())
        data = json.dumps({"slaves": sorted(self.sync_set), "epoch": 1, "min": 1}).encode()
        return _Answer((data, SimpleNamespace(version=7)))


class _Tx:
    def __init__(self):
        self.ops = []

    def delete(self, path, version=-1):
        self.ops.append(("delete", path, version))

    def check(self, path, version):
        self.ops.append(("check", path, version))


PATHS = ZkPaths("/r")


def test_deposal_deletes_only_the_dead_sessions_lock():
    tx = _Tx()
    assert _add_deposal(_Client(owner=42), PATHS, 0, tx, Deposal(42)) is True
    assert tx.ops == [("delete", PATHS.master(0), 0)]
    tx = _Tx()
    assert _add_deposal(_Client(owner=43), PATHS, 0, tx, Deposal(42)) is False  # another session holds it now
    assert tx.ops == []


def test_deposal_of_an_expired_lock_is_the_ordinary_election():
    tx = _Tx()
    assert _add_deposal(_Client(owner=None), PATHS, 0, tx, Deposal(42)) is True
    assert tx.ops == []


def test_sync_deposal_checks_the_sync_set_still_names_us():
    tx = _Tx()
    assert _add_deposal(_Client(owner=42, sync_set={1}), PATHS, 0, tx, Deposal(42, sync_member=1)) is True
    assert ("check", PATHS.sync_set(0), 7) in tx.ops
    for sync_set in ({2}, None):
        tx = _Tx()
        assert _add_deposal(_Client(owner=42, sync_set=sync_set), PATHS, 0, tx, Deposal(42, sync_member=1)) is False
        assert tx.ops == []
