"""Chaos with transactional producers (chaos/transactions.py): all or nothing per transaction.

The chaos topology (brokers and ZooKeeper behind the fault proxy, sync mode), two
transactional producers through the real client, each transaction spread over two topics,
a reader scanning both topics on every replica read-committed every 0.1 s; the fault schedule of one scenario with a fixed seed. The
checker requires, of every scan: each partition's share of a committed transaction whole
or absent, no rolled-back transaction, no message twice; at the end, on every replica,
exactly the committed transactions.
"""

from __future__ import annotations

import pytest

from tests.chaos.run_support import Outcome, transactions_run

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("scenario, seed", [
    pytest.param("kill-master", 1, marks=transactions_run("kill-master", 1, 15)),
    pytest.param("partition-master-peers", 2, marks=transactions_run("partition-master-peers", 2, 15)),
])
def test_transactions_are_all_or_nothing_under_faults(chaos_outcome: Outcome, scenario: str, seed: int) -> None:
    # python -m chaos.transactions --scenario SCENARIO --seed SEED --seconds 15 (the second run
    # starts beside the first: tests/chaos/run_support.py).
    assert (chaos_outcome.out / "transactions.json").exists(), chaos_outcome.stderr_tail
    result = chaos_outcome.json("transactions.json")
    assert (result["scenario"], result["seed"]) == (scenario, seed)
    assert result["faults"] and all(f.get("skipped") is None for f in result["faults"]), result["faults"]
    assert not result["violations"], result["violations"]
    assert result["committed"] > 50 and result["rolled_back"] > 10, result
    # Both topics got committed transactions' messages (every transaction writes both).
    by_topic = result["committed_messages_by_topic"]
    assert set(by_topic) == {"chaos", "txn-b"} and min(by_topic.values()) > 50, by_topic
