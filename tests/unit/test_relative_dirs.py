"""A relative directory given to the tools that start processes is made absolute.

ZooKeeper and the brokers run with their own directory as their cwd and are given their
config file's path: a path relative to the caller's cwd named nothing there (found by
`python -m chaos campaign --out docs/campaign/NAME`: every run ended at once, ZooKeeper
exiting with "zoo.cfg file is missing")."""

from __future__ import annotations

from pathlib import Path

from chaos.cluster import ChaosCluster
from metaq.tools.launcher import BrokerFactory
from metaq.zk.embedded import EmbeddedZooKeeper


def test_relative_directories_are_made_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert EmbeddedZooKeeper(data_dir="zk").data_dir == tmp_path / "zk"
    assert BrokerFactory(Path("brokers"), "127.0.0.1:2181", "/meta").tmp_dir == tmp_path / "brokers"
    assert ChaosCluster("runs/one", zk_nodes=1).work_dir == tmp_path / "runs" / "one"
