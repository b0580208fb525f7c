"""``ChaosCluster.view`` (chaos/cluster.py): the epoch it reports belongs with the master it reports."""

from __future__ import annotations

from types import SimpleNamespace

from chaos.cluster import ChaosCluster
from metaq.zk.paths import ZkPaths

PATHS = ZkPaths("/meta")


class _Zk:
    """A ZooKeeper whose election commits (epoch 1 -> 2, master a -> b) right after the first
    read of the epoch node: the race the runner met while recording a failover."""

    def __init__(self) -> None:
        self.nodes = {PATHS.epoch(1): b"1", PATHS.master(1): b"meta://a"}
        self.epoch_reads = 0

    def _commit(self) -> None:
        self.nodes[PATHS.epoch(1)], self.nodes[PATHS.master(1)] = b"2", b"meta://b"

    def get_async(self, path: str):
        data = self.nodes.get(path)
        if path == PATHS.epoch(1):
            self.epoch_reads += 1
            if self.epoch_reads == 1:
                self._commit()  # after this read, before the master's
        if data is None:
            return SimpleNamespace(get=lambda timeout=None: (_ for _ in ()).throw(KeyError(path)))
        return SimpleNamespace(get=lambda timeout=None: (data, SimpleNamespace(ephemeralOwner=1)))

    def get_children_async(self, path: str, watch=None):
        return SimpleNamespace(get=lambda timeout=None: ["master"] if PATHS.master(1) in self.nodes else [])


def _cluster(zk: _Zk) -> ChaosCluster:
    cluster = ChaosCluster.__new__(ChaosCluster)
    cluster.paths = PATHS
    cluster._zk_client = zk  # type: ignore[attr-defined]
    return cluster


def test_a_view_never_pairs_a_new_master_with_the_old_epoch(monkeypatch) -> None:
    zk = _Zk()
    monkeypatch.setattr(ChaosCluster, "zk", property(lambda self: zk))
    monkeypatch.setattr("chaos.cluster.decode_epoch", lambda data: (int(data), None))
    view = _cluster(zk).view(1)
    assert (view.master, view.epoch) == ("meta://b", 2)
    assert zk.epoch_reads >= 3, "the epoch was read again after it changed under the members' read"
