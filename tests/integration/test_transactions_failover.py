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
import random
import threading
from collections import Counter
from typing import Any

from metaq.client import Message, TransactionError, TransactionRolledBack
from metaq.client.session import AsyncMessageSessionFactory
from metaq.tools.launcher import BrokerProcess

from .failover_support import Group, make_pair, sync_system, wait_follows, wait_leads
from .test_transactions import PARTITIONS, TOPIC, client_config, visible

WRITERS = 2


def txn_of(message: bytes) -> str:
    """``w{w}-t{i}-{j}`` -> ``w{w}-t{i}``."""
    return message.decode().rpartition("-")[0]


#: One read-committed scan of one broker: (transaction, partition) -> messages seen.
Scan = Counter


class Outcomes:
    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self.unknown: set[str] = set()
        #: transaction -> partition -> messages its puts stored there (acked)
        self.sent: dict[str, Counter] = {}
        self.scans: list[tuple[str, Scan]] = []
        self.violations: list[str] = []

    def scan(self, messages: list[tuple[int, bytes]], where: str) -> None:
        counts = Counter(messages)
        twice = [m for m, n in counts.items() if n > 1]
        if twice:
            self.violations.append(f"{where}: messages seen twice: {twice[:3]}")
        self.scans.append((where, Counter((txn_of(m), p) for p, m in counts)))

    def check(self) -> None:
        """After the writers stopped (every outcome known): each scan saw each partition's share whole or not at all."""
        for where, seen in self.scans:
            for (name, partition), n in seen.items():
                if name in self.rolled_back:
                    self.violations.append(f"{where}: rolled-back transaction {name} visible in partition {partition}")
                elif name in self.committed and n != self.sent[name][partition]:
                    self.violations.append(f"{where}: transaction {name} partly visible in partition {partition}: "
                                           f"{n} of {self.sent[name][partition]}")


async def writer(w: int, config: Any, stop: threading.Event, outcomes: Outcomes) -> None:
    rng = random.Random(w)
    async with AsyncMessageSessionFactory(config) as factory:
        producer = factory.create_transactional_producer()
        i = 0
        while not stop.is_set():
            name, size = f"w{w}-t{i}", rng.randint(1, 4)
            i += 1
            sent = outcomes.sent[name] = Counter()
            try:
                await producer.begin_transaction(timeout_s=10)
                for j in range(size):
                    result = await producer.send_message(Message(TOPIC, f"{name}-{j}".encode()))
                    sent[result.partition.partition] += 1
                if rng.random() < 0.25:
                    await producer.rollback()
                    outcomes.rolled_back.add(name)
                    continue
                await producer.commit()
                outcomes.committed.add(name)
            except TransactionRolledBack:
                outcomes.rolled_back.add(name)
            except TransactionError:
                outcomes.unknown.add(name)
                if producer.in_transaction:
                    try:
                        await producer.rollback()
                    except TransactionError:
                        pass


async def scan(brokers: list[BrokerProcess]) -> list[tuple[str, list[tuple[int, bytes]]]]:
    found = []
    for broker in brokers:
        try:
            messages = [(p, m) for p in range(PARTITIONS) for m in await visible(broker, p)]
        except Exception:
            continue  # down or not serving right now
        found.append((broker.name, messages))
    return found


def test_transactions_stay_all_or_nothing_through_two_kill_9_failovers(broker_factory: Any, zk_client: Any,
                                                                        zk_root: str) -> None:
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(maxTxTimeoutInSeconds=10), group, partitions=PARTITIONS)
    outcomes, stop = Outcomes(), threading.Event()
    config = client_config(broker_factory)

    async def run() -> None:
        writers = [asyncio.ensure_future(writer(w, config, stop, outcomes)) for w in range(WRITERS)]

        async def reads(seconds: float) -> None:
            loop = asyncio.get_running_loop()
            until = loop.time() + seconds
            while loop.time() < until:
                for where, messages in await scan([a, b]):
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
        final = await scan([a, b])
        assert len(final) == 2, f"both brokers must answer at the end: {[w for w, _ in final]}"
        for where, messages in final:
            outcomes.scan(messages, f"{where} (final)")
            visible_txns = {txn_of(m) for _p, m in messages}
            missing = outcomes.committed - visible_txns
            extra = visible_txns - outcomes.committed - outcomes.unknown
            assert not missing, f"{where}: committed transactions not visible: {sorted(missing)[:5]}"
            assert not extra, f"{where}: visible transactions that were not committed: {sorted(extra)[:5]}"

    asyncio.run(run())
    outcomes.check()
    assert not outcomes.violations, outcomes.violations[:5]
    assert len(outcomes.committed) > 20 and outcomes.rolled_back, (len(outcomes.committed), len(outcomes.rolled_back))
