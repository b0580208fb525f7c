"""Reconnecting to a ZooKeeper that lost its data (metaq/zk/data_loss.py): when the zxid is forgotten."""

from __future__ import annotations

from types import SimpleNamespace

from metaq.zk.data_loss import ReconnectAfterDataLoss


def _listener(last_zxid: int, servers: dict[tuple[str, int], int | None]) -> ReconnectAfterDataLoss:
    client = SimpleNamespace(last_zxid=last_zxid, hosts=list(servers))
    return ReconnectAfterDataLoss(client, grace_s=1.0, probe=lambda host, port: servers[(host, port)])  # type: ignore[arg-type]


def test_a_server_behind_what_we_saw_lost_its_data_and_the_zxid_is_forgotten():
    listener = _listener(0x32, {("a", 1): None, ("b", 2): 0x1})
    assert listener.forget_if_server_behind()
    assert listener.client.last_zxid == 0


def test_servers_at_or_past_what_we_saw_or_silent_keep_zookeepers_check():
    for servers in ({("a", 1): 0x32}, {("a", 1): 0x40}, {("a", 1): None}):
        listener = _listener(0x32, servers)
        assert not listener.forget_if_server_behind()
        assert listener.client.last_zxid == 0x32
