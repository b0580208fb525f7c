"""Transactions over two topics in the chaos workload (chaos/transactions.py, chaos/runner.py):
every transaction's writes reach both topics and the history names each write's topic; the
checker judges the second topic like the first (hand-built histories: an aborted read there,
a transaction torn across the topics, in the final log or in a read-committed read)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from chaos.anomalies import READ_COMMITTED
from chaos.checker import check
from chaos.history import History
from chaos.runner import Workload, committed_messages_by_topic
from chaos.transactions import TxnOutcomes, spread_over
from metaq.client.message import Partition
from tests.unit.test_chaos_checker import failing
from tests.unit.test_chaos_checker_anomalies import Kafka

MAIN, SECOND = "chaos/0-0", "txn-b/0-1"


class _Producer:
    """A transactional producer's surface as the workload uses it; puts land round robin on
    two partitions of whichever topic each message names."""

    def __init__(self) -> None:
        self.in_transaction = False
        self.ends: dict[str, int] = {}
        self.sent = 0

    async def begin_transaction(self, timeout_s: int = 0) -> None:
        self.in_transaction = True

    async def send_message(self, message) -> SimpleNamespace:
        partition = Partition(0, self.sent % 2)
        self.sent += 1
        key = f"{message.topic}/{partition}"
        offset = self.ends.get(key, 0)
        self.ends[key] = offset + 20 + len(message.data)
        return SimpleNamespace(partition=partition, offset=offset, success=True)

    async def commit(self) -> None:
        self.in_transaction = False

    async def rollback(self) -> None:
        self.in_transaction = False


def test_every_transaction_of_the_workload_writes_both_topics_and_the_history_names_each_writes_topic():
    cluster = SimpleNamespace(topic="chaos", txn_topic="txn-b")
    history = History({"mode": "sync"})
    workload = Workload(cluster, history, monitor=None, seed=7, rate=1.0, transactions=True)
    producer, rng = _Producer(), random.Random(1)

    async def run() -> None:
        for number in range(40):
            await workload._transaction(producer, "x0", f"x0-t{number}", rng)

    asyncio.run(run())
    txns = [op for op in history.ops if op.get("f") == "txn" and op["type"] != "invoke"]
    assert len(txns) == 40 and {op["type"] for op in txns} == {"ok", "fail"}  # committed and rolled back
    for op in txns:
        topics = {partition.rsplit("/", 1)[0] for partition, _offset, _value in op["sends"]}
        assert topics == {"chaos", "txn-b"}, op
        assert all(offset is not None for _p, offset, _v in op["sends"]), op
    by_topic = committed_messages_by_topic(txns)
    assert set(by_topic) == {"chaos", "txn-b"} and all(by_topic.values()), by_topic


@pytest.mark.parametrize("count", [2, 3, 4])
def test_spread_over_reaches_every_topic(count):
    rng = random.Random(count)
    for _ in range(50):
        chosen = spread_over(["chaos", "txn-b"], count, rng)
        assert len(chosen) == count and set(chosen) == {"chaos", "txn-b"}


def test_spread_over_refuses_fewer_messages_than_topics():
    with pytest.raises(ValueError, match="1 messages cannot reach 2 topics"):
        spread_over(["chaos", "txn-b"], 1, random.Random(0))


def two_topics() -> Kafka:
    """Puts on the main topic; T1 committed over both topics (two messages on the second),
    T2 rolled back over both, T3 committed over both."""
    k = Kafka(partitions=(MAIN, SECOND))
    k.put("p0-0", partition=MAIN)
    k.txn("T1", [(MAIN, "t1-a"), (SECOND, "t1-b"), (SECOND, "t1-c")])
    k.txn("T2", [(SECOND, "t2-a"), (MAIN, "t2-b")], outcome="fail")
    k.txn("T3", [(SECOND, "t3-a"), (MAIN, "t3-b")])
    return k


def read_committed(k: Kafka, partition: str, pairs) -> None:
    """What the runner's read-committed reader records of one fetch."""
    k.h.read("committed-reader-g0", partition, pairs, "meta://s1", isolation=READ_COMMITTED)


def test_read_committed_reads_of_both_topics_pass():
    k = two_topics()
    for partition in (MAIN, SECOND):
        read_committed(k, partition, k.visible(partition))
    result = check(k.finish())
    assert result.ok, result.report()
    # The second topic's committed messages are among what lost-write and the read checks judged.
    assert result.checks["acked_lost"]["checked"] == 1 + 3 + 2
    assert result.checks["aborted-read"]["checked"] >= 6 and result.checks["intermediate-read"]["checked"] >= 3


def test_an_aborted_read_on_the_second_topic_is_caught():
    k = two_topics()
    (aborted,) = [r for r in k.records[SECOND] if r[1] == "t2-a"]
    read_committed(k, SECOND, [aborted])
    result = check(k.finish())
    assert failing(result) == {"aborted-read"}
    (case,) = result.violations("aborted-read")
    assert case["partition"] == SECOND and case["writer"]["txn"] == "T2"


def test_a_transaction_committed_on_one_topic_only_is_a_lost_write_on_the_other():
    # T3 committed, but the second topic's final log lost its message there (torn across
    # the topics: whole on the main topic, absent on the second).
    k = two_topics()
    (offset,) = [o for o, v in k.records[SECOND] if v == "t3-a"]
    del k.logs[SECOND][offset:]
    result = check(k.finish())
    assert "acked_lost" in failing(result) and result.stats["anomalies"]["lost-write"] == 1
    (case,) = result.violations("acked_lost")
    assert (case["partition"], case["value"], case["txn"]) == (SECOND, "t3-a", "T3"), case
    assert case["why"] == f"'t3-a' acked at {SECOND}@{offset}; the final log has no record there"


def test_a_read_committed_read_of_part_of_a_transaction_on_the_second_topic_is_torn():
    # The reader got T1's message on the main topic and its first on the second topic, then
    # read past its second there without it.
    k = two_topics()
    read_committed(k, MAIN, k.visible(MAIN))
    read_committed(k, SECOND, [r for r in k.visible(SECOND) if r[1] != "t1-c"])
    result = check(k.finish())
    assert "intermediate-read" in failing(result)
    assert failing(result) <= {"intermediate-read", "int-poll-skip"}
    (case,) = result.violations("intermediate-read")
    assert (case["partition"], case["txn"]) == (SECOND, "T1"), case


def test_the_scanning_checker_catches_a_transaction_visible_on_one_topic_only():
    """chaos.transactions' own checker (``python -m chaos.transactions``): at the end every
    committed transaction is whole on each partition it wrote, on both topics."""
    outcomes = TxnOutcomes()
    outcomes.committed |= {"w0-t0", "w0-t1"}
    outcomes.sent["w0-t0"] = Counter({"chaos-0": 1, "txn-b-2": 1})
    outcomes.sent["w0-t1"] = Counter({"chaos-1": 1, "txn-b-0": 2})
    whole = [("chaos-0", b"w0-t0-0"), ("txn-b-2", b"w0-t0-1"),
             ("chaos-1", b"w0-t1-0"), ("txn-b-0", b"w0-t1-1"), ("txn-b-0", b"w0-t1-2")]
    outcomes.final(whole, "g0-a")
    assert outcomes.check() == []
    torn = [m for m in whole if m[0] != "txn-b-2"]  # w0-t0 on chaos only
    outcomes.final(torn, "g0-b")
    assert outcomes.check() == ["g0-b: committed transactions missing from partitions they wrote: ['w0-t0 in txn-b-2']"]


def test_the_second_topic_is_in_the_cluster_only_where_transactions_run(tmp_path) -> None:
    from chaos.cluster import TOPIC, TXN_TOPIC, ChaosCluster

    assert ChaosCluster(tmp_path / "txn", zk_nodes=1).topics == {TOPIC: 2, TXN_TOPIC: 3}
    plain = ChaosCluster(tmp_path / "plain", zk_nodes=1, txn_partitions=0)
    assert plain.topics == {TOPIC: 2}
    assert [name for _topic, _n, name in plain.partition_names(1)] == [f"{TOPIC}/1-0", f"{TOPIC}/1-1"]
    # What ``python -m chaos run`` builds (nothing started here).
    from chaos.runner import Run

    assert TXN_TOPIC in Run("kill-master", 1, 1, tmp_path / "run-txn", zk_nodes=1, transactions=True).cluster.topics
    assert TXN_TOPIC not in Run("kill-master", 1, 1, tmp_path / "run-plain", zk_nodes=1).cluster.topics
