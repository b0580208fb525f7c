"""Chaos with transactional producers (chaos/transactions.py): all or nothing per transaction.

The chaos topology (brokers and ZooKeeper behind the fault proxy, sync mode), two
transactional producers through the real client, a reader scanning every replica
read-committed every 0.1 s; the fault schedule of one scenario with a fixed seed. The
checker requires, of every scan: each partition's share of a committed transaction whole
or absent, no rolled-back transaction, no message twice; at the end, on every replica,
exactly the committed transactions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.transactions import run

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("scenario, seed", [("kill-master", 1), ("partition-master-peers", 2)])
def test_transactions_are_all_or_nothing_under_faults(tmp_path: Path, scenario: str, seed: int) -> None:
    result = run(scenario, 15, seed, tmp_path)
    assert result["faults"] and all(f.get("skipped") is None for f in result["faults"]), result["faults"]
    assert not result["violations"], result["violations"]
    assert result["committed"] > 50 and result["rolled_back"] > 10, result
