"""The chaos monitor's record of a failover's lag (what async_loss_bound allows to be lost)."""

from pathlib import Path

from chaos import runner
from chaos.history import History
from metaq.ha.epochs import EpochCache
from metaq.record import encode_batch


class _Broker:
    def __init__(self, name: str, data_dir: Path, log: bytes) -> None:
        self.name, self.group, self.log, self._dir = name, 0, log, data_dir

    def data_dir(self) -> Path:
        return self._dir

    def disk_log(self, topic: str, partition: int) -> bytes:
        return self.log

    def disk_end(self, topic: str, partition: int) -> int:
        return len(self.log)


class _Cluster:
    topic, partitions = "chaos", 1

    def __init__(self, brokers: dict[str, _Broker]) -> None:
        self.brokers = brokers

    def partition_names(self, group: int) -> list[tuple[str, int, str]]:
        return [(self.topic, 0, f"{self.topic}/{group}-0")]

    def by_url(self, url: str) -> _Broker:
        return self.brokers[url]

    def client_address(self, url: str) -> tuple[str, int]:
        return ("127.0.0.1", 1)


def test_the_lag_is_the_old_masters_log_past_the_new_epochs_start_even_when_the_new_master_does_not_answer(tmp_path, monkeypatch):
    # Campaign seed 3026 recorded a lag of 0 for a failover that took back an ack: the new
    # master did not answer in time (load 30), its log end *now* stood in for its epoch's
    # start, and the old master's log was read only after that, when it could have rejoined.
    common = encode_batch([(b"a", None), (b"b", None)])
    old = _Broker("g0-b", tmp_path / "b", common + encode_batch([(b"acked-then-lost", None)]))
    new = _Broker("g0-a", tmp_path / "a", common + encode_batch([(b"new-1", None), (b"new-2", None)]))
    (new.data_dir() / "chaos-0").mkdir(parents=True)
    cache = EpochCache(new.data_dir() / "chaos-0", [(1, 0), (8, len(common))])
    cache.save()
    asked = []

    def no_answer(address, keys, epoch, timeout=2.0):
        asked.append(timeout)
        old.log = common  # meanwhile the old master came back and truncated to follow
        return dict.fromkeys(keys)

    monkeypatch.setattr(runner, "_epoch_starts", no_answer)
    history = History({"mode": "async"})
    monitor = runner.Monitor(_Cluster({"meta://b": old, "meta://a": new}), history)
    monitor._failover(0, "meta://b", "meta://a", 8)
    assert history.failovers[0]["lag"] == {"chaos/0-0": {"bytes": len(encode_batch([(b"acked-then-lost", None)])), "messages": 1}}
    assert len(asked) == 3  # asked again before the checkpoint on disk was read


def test_a_new_master_that_does_not_answer_is_asked_about_every_partition_at_once(tmp_path, monkeypatch):
    """Two topics of 2 and 3 partitions: three rounds of asking in all, not three per
    partition (up to 14 s each, the monitor blocked meanwhile)."""
    new = _Broker("g0-a", tmp_path / "a", encode_batch([(b"new-1", None)]))
    rounds: list[list[tuple[str, int]]] = []

    def no_answer(address, keys, epoch, timeout=2.0):
        rounds.append(list(keys))
        return {key: (7 if key == ("txn-b", 1) else None) for key in keys}  # one partition answers

    class _TwoTopics(_Cluster):
        def partition_names(self, group: int) -> list[tuple[str, int, str]]:
            return [(t, n, f"{t}/{group}-{n}") for t, count in (("chaos", 2), ("txn-b", 3)) for n in range(count)]

    monkeypatch.setattr(runner, "_epoch_starts", no_answer)
    monitor = runner.Monitor(_TwoTopics({"meta://a": new}), History({"mode": "async"}))
    starts = monitor._epoch_starts("meta://a", new, [(t, n) for t, n, _ in monitor.cluster.partition_names(0)], 8)
    assert len(rounds) == 3 and len(rounds[0]) == 5 and ("txn-b", 1) not in rounds[1]
    assert starts[("txn-b", 1)] == 7
    assert all(start == len(new.log) for key, start in starts.items() if key != ("txn-b", 1))  # no checkpoint: the log end


def test_the_new_master_is_asked_through_the_clusters_connection_logged_in_with_secure(tmp_path):
    """Campaign seed 7104 (--secure): the monitor asked ``epochs`` on connections of its own,
    never logged in; each was closed ("op 'epochs' before login") and every failover's epoch
    start came from the checkpoint on disk. It asks through the cluster's ``connect`` (the
    workload's credentials) now."""
    new = _Broker("g0-a", tmp_path / "a", encode_batch([(b"new-1", None)]))
    connected: list[tuple[str, float]] = []

    class _LoggedIn:
        async def request(self, header: dict, timeout: float) -> dict:
            assert header["op"] == "epochs"
            return {"entries": [[7, 3], [8, 11]]}

        def close(self) -> None:
            pass

    class _Secured(_Cluster):
        async def connect(self, url: str, timeout: float) -> _LoggedIn:
            connected.append((url, timeout))
            return _LoggedIn()

    monitor = runner.Monitor(_Secured({"meta://a": new}), History({"mode": "sync"}))
    starts = monitor._epoch_starts("meta://a", new, [("chaos", 0)], 8)
    assert starts == {("chaos", 0): 11}  # the broker's answer, not the log end on disk (len(new.log))
    assert connected == [("meta://a", 2.0)]
