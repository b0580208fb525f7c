"""Transactional producers through two kill -9 failovers: all or nothing, per transaction.

A sync pair (A master, B slave, ``onSyncSlaveLoss=degrade``, ZK session 1500 ms), two
transactional producers committing or rolling back transactions of 1-4 messages over two
partitions, and a reader scanning both brokers read-committed all along. A is killed
(-9), B takes over, A comes back as its slave; then B is killed and A takes over again.

Checked:

* at every scan, on whichever broker answers, each partition shows a committed
  transaction's share of messages whole or not at all (a scan reads the partitions one
  after the other, and each partition's COMMIT marker lands on its own: atomic visibility
  is per partition, and every share is visible once ``commit`` returned), and no message
  twice;
* a transaction whose ``rollback`` returned, or whose ``commit`` raised
  ``TransactionRolledBack``, is never seen by any scan;
* at the end, on both brokers, exactly the transactions whose ``commit`` returned are
  visible (a transaction whose outcome stayed unknown may be there or not, but whole).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from chaos.transactions import WRITERS, TxnOutcomes, scan_all, transactional_writer

from .failover_support import Group, make_pair, sync_system, wait_follows, wait_leads
from .test_transactions import PARTITIONS, TOPIC, client_config


def test_transactions_stay_all_or_nothing_through_two_kill_9_failovers(broker_factory: Any, zk_client: Any,
                                                                        zk_root: str) -> None:
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(maxTxTimeoutInSeconds=10), group, partitions=PARTITIONS)
    outcomes, stop = TxnOutcomes(), threading.Event()
    config = client_config(broker_factory)
    replicas = {"A": a.address, "B": b.address}

    async def run() -> None:
        writers = [asyncio.ensure_future(transactional_writer(w, config, [TOPIC], stop, outcomes)) for w in range(WRITERS)]

        async def reads(seconds: float) -> None:
            loop = asyncio.get_running_loop()
            until = loop.time() + seconds
            while loop.time() < until:
                for where, messages in await scan_all(replicas, {TOPIC: PARTITIONS}):
                    outcomes.scan(messages, where)
                await asyncio.sleep(0.1)

        await reads(3)
        for victim, survivor in ((a, b), (b, a)):
            epoch = group.epoch()
            victim.kill()
            await asyncio.gather(reads(2), asyncio.to_thread(wait_leads, survivor, group, epoch))
            await asyncio.to_thread(victim.start, wait_zk=False)
            await asyncio.gather(reads(3), asyncio.to_thread(wait_follows, victim, survivor, group))
        stop.set()
        await asyncio.gather(*writers)
        await asyncio.sleep(1)  # the slave's committed offset catches up
        final = await scan_all(replicas, {TOPIC: PARTITIONS})
        assert len(final) == 2, f"both brokers must answer at the end: {[w for w, _ in final]}"
        for where, messages in final:
            outcomes.final(messages, where)

    asyncio.run(run())
    outcomes.check()
    assert not outcomes.violations, outcomes.violations[:5]
    assert len(outcomes.committed) > 20 and outcomes.rolled_back, (len(outcomes.committed), len(outcomes.rolled_back))
