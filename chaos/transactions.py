"""Chaos with transactional producers: every transaction all or nothing, through faults.

    python -m chaos.transactions --scenario kill-master --seconds 15 --seed 1 --out DIR

The chaos topology (chaos/cluster.py: brokers and ZooKeeper behind fault proxies), a
seeded fault schedule (chaos/scenarios.py), and instead of the plain workload:

* ``WRITERS`` transactional producers (the real client, through the proxies) running
  transactions of 2-4 messages spread over both topics' partitions (the cluster's
  ``topic`` and ``txn_topic``: every transaction writes to each), three in four
  committed, one in four rolled back; every outcome recorded: committed (``commit``
  returned), rolled back (``rollback`` returned, or ``commit`` raised
  ``TransactionRolledBack``), unknown (a step gave up);
* a reader scanning both topics on every replica (masters and slaves) read-committed
  every 0.1 s.

``TxnOutcomes.check`` then requires, of every scan of every replica: each partition's
share of a committed transaction whole or absent (a scan reads partitions one after
the other, and each partition's COMMIT marker lands on its own), no rolled-back
transaction, no message twice; and at the end, on every replica once settled, exactly
the committed transactions, each on both topics (an unknown one may be there or not,
whole).

The same checker serves ``tests/integration/test_transactions_failover.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from metaq.client import Message, MetaClientConfig, TransactionError, TransactionRolledBack, XAError, Xid
from metaq.client.transactional import ROLLED_BACK_CODES, ProducerFenced
from metaq.client.xa import TMFAIL
from metaq.txn.xa import Code
from metaq.client.connection import BrokerConnection
from metaq.client.session import AsyncMessageSessionFactory
from metaq.protocol import commands as c
from metaq.protocol.replies import aborted_spans
from metaq.txn.reader import committed_records

WRITERS = 2


async def read_committed(address: tuple[str, int], topic: str, partition: int) -> list[bytes]:
    """Every message a read-committed consumer of the broker at ``address`` gets from ``partition`` now."""
    conn = await BrokerConnection.open(*address, timeout=5)
    found: list[bytes] = []
    offset = 0
    try:
        while True:
            reply = await conn.request({"op": "get", "topic": topic, "partition": partition, "offset": offset,
                                        "max_size": 1 << 20}, timeout=10)
            if reply.code != c.OK:
                if reply.code != c.NOT_FOUND:
                    raise ConnectionError(f"get at {offset}: {reply.code} {reply.message}")
                return found
            if "lso" in reply.header and offset + len(reply.body) > reply["lso"]:
                raise AssertionError(f"a reply past the last stable offset: {reply.header}")
            filtered = committed_records(reply.body, offset, aborted_spans(reply.header))
            found += [bytes(r.data) for r in filtered.records]
            if filtered.next_offset <= offset:
                raise AssertionError(f"no progress at {offset}: {reply.header}")
            offset = filtered.next_offset
    finally:
        conn.close()


def spread_over(topics: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """The topic of each of a transaction's ``count`` messages: every topic at least once
    (``count`` >= len(topics)), the rest at random, in a random order. A transaction that
    commits must then be visible whole on every topic; one rolled back on none."""
    if isinstance(topics, str):
        raise TypeError(f"topics must be a list of topic names, not one name: {topics!r}")
    if count < len(topics):
        raise ValueError(f"{count} messages cannot reach {len(topics)} topics")
    chosen = [*topics, *(rng.choice(topics) for _ in range(count - len(topics)))]
    rng.shuffle(chosen)
    return chosen


def partition_key(topic: str, partition: int) -> str:
    """How ``TxnOutcomes`` names a partition: ``{topic}-{n}`` (its directory name)."""
    return f"{topic}-{partition}"


def txn_of(message: bytes) -> str:
    """``w{w}-t{i}-{j}`` -> ``w{w}-t{i}``."""
    return message.decode().rpartition("-")[0]


class TxnOutcomes:
    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self.unknown: set[str] = set()
        #: transaction -> partition (``partition_key``) -> messages its acked puts stored there
        self.sent: dict[str, Counter[str]] = {}
        #: every scan: (replica, Counter of (transaction, partition))
        self.scans: list[tuple[str, Counter[tuple[str, str]]]] = []
        self.violations: list[str] = []

    def scan(self, messages: list[tuple[str, bytes]], where: str) -> None:
        counts = Counter(messages)
        twice = [m for m, n in counts.items() if n > 1]
        if twice:
            self.violations.append(f"{where}: messages seen twice: {twice[:3]}")
        self.scans.append((where, Counter((txn_of(m), p) for p, m in counts)))

    def final(self, messages: list[tuple[str, bytes]], where: str) -> None:
        """A scan once everything settled: exactly the committed transactions (unknown ones optional)."""
        self.scan(messages, f"{where} (final)")
        seen = {txn_of(m) for _p, m in messages}
        missing, extra = self.committed - seen, seen - self.committed - self.unknown
        if missing:
            self.violations.append(f"{where}: committed transactions not visible at the end: {sorted(missing)[:5]}")
        # Whole on every partition it wrote, on each topic: a transaction visible on one
        # topic and absent from the other is torn (a scan's partial partition is check's).
        visible = {(txn_of(m), p) for p, m in messages}
        torn = sorted(f"{name} in {p}" for name in self.committed & seen for p in self.sent[name]
                      if (name, p) not in visible)
        if torn:
            self.violations.append(f"{where}: committed transactions missing from partitions they wrote: {torn[:5]}")
        if extra:
            self.violations.append(f"{where}: visible transactions that were not committed: {sorted(extra)[:5]}")

    def check(self) -> list[str]:
        """After the writers stopped (every outcome known): the violations of every scan."""
        for where, seen in self.scans:
            for (name, partition), n in seen.items():
                if name in self.rolled_back:
                    self.violations.append(f"{where}: rolled-back transaction {name} visible in partition {partition}")
                elif name in self.committed and n != self.sent[name][partition]:
                    self.violations.append(f"{where}: transaction {name} partly visible in partition {partition}: "
                                           f"{n} of {self.sent[name][partition]}")
        return self.violations

    def summary(self) -> dict[str, Any]:
        by_topic: Counter[str] = Counter()
        for name in self.committed:
            for key, n in self.sent[name].items():
                by_topic[key.rpartition("-")[0]] += n
        return {"committed": len(self.committed), "rolled_back": len(self.rolled_back), "unknown": len(self.unknown),
                "committed_messages_by_topic": dict(sorted(by_topic.items())),
                "scans": len(self.scans), "violations": self.violations[:20]}


async def transactional_writer(w: int, config: MetaClientConfig, topics: Sequence[str], stop: threading.Event,
                               outcomes: TxnOutcomes) -> None:
    rng = random.Random(w)
    async with AsyncMessageSessionFactory(config) as factory:
        producer = factory.create_transactional_producer()
        i = 0
        while not stop.is_set():
            name = f"w{w}-t{i}"
            i += 1
            sent = outcomes.sent[name] = Counter()
            try:
                await producer.begin_transaction(timeout_s=TXN_TIMEOUT_S)
                for j, topic in enumerate(spread_over(topics, rng.randint(2, 4), rng)):
                    result = await producer.send_message(Message(topic, f"{name}-{j}".encode()))
                    assert result.partition is not None
                    sent[partition_key(topic, result.partition.partition)] += 1
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


async def scan_all(replicas: dict[str, tuple[str, int]],
                   topics: dict[str, int]) -> list[tuple[str, list[tuple[str, bytes]]]]:
    """One read-committed scan of every partition of ``topics`` (topic -> partition count) on
    each replica that answers: (name, [(``partition_key``, message), ...])."""
    found = []
    for name, address in replicas.items():
        try:
            messages = [(partition_key(topic, p), m) for topic, count in topics.items() for p in range(count)
                        for m in await read_committed(address, topic, p)]
        except (OSError, ConnectionError, asyncio.TimeoutError):
            continue  # down, cut off or not serving right now
        found.append((name, messages))
    return found


# --- the runner's transactional workloads (python -m chaos run --transactions) -----------------

#: The timeout (seconds) every other transaction of the workload asks for: local, XA and
#: the zombie's. Each ``txn`` invocation records its timeout as ``timeout_s``: while its
#: client's outcome is unknown, only the broker's timer (or a reader getting past it) shows
#: when it was decided, which is when the liveness check awaits the reads it holds back.
TXN_TIMEOUT_S = 10
#: A transaction left open on purpose asks for this timeout (seconds) and then waits
#: ``TIMEOUT_WAIT_S`` before its commit: three timeouts, time for the broker's timer.
TIMED_OUT_TIMEOUT_S = 1
TIMED_OUT_WAIT_S = 3.0
#: The zombie's pause between rounds (seconds).
ZOMBIE_ROUND_GAP_S = 0.3
#: XA format id of the workload's transactions ("MQ").
XA_FORMAT = 0x4D51
#: XA codes after which the branch surely is rolled back (XA_RB*, and a heuristic rollback).
XA_ROLLED_BACK = ROLLED_BACK_CODES | {int(Code.XA_HEURRB)}


async def send_values(producer: Any, topics: Sequence[str], txn: str, sends: list[list[Any]]) -> None:
    """Send ``{txn}-0`` .. ``{txn}-{n-1}`` in the producer's open transaction, message j to
    ``topics[j]`` (``spread_over``); each goes into ``sends`` as ``[partition, acked offset or
    None, value]`` (the history's form: ``partition`` is ``{topic}/{brokerId}-{n}``, so the
    checker sees which topic each went to). Raises TransactionError on the first send that
    was not stored."""
    for j, topic in enumerate(topics):
        value = f"{txn}-{j}"
        try:
            result = await producer.send_message(Message(topic, value.encode()))
        except Exception:
            # The client gave up on it (retries exhausted): it may be stored all the same, so it
            # is one of the transaction's messages, at an unknown partition and offset.
            sends.append([None, None, value])
            raise
        part = f"{topic}/{result.partition}" if result.partition is not None else None
        sends.append([part, result.offset if result.success and result.offset >= 0 else None, value])
        if not result.success:
            raise TransactionError(f"send failed: {result.error_message}")


async def roll_back(producer: Any) -> bool:
    """Roll back the local producer's open transaction; whether it surely is rolled back now."""
    if not producer.in_transaction:
        return False
    try:
        await producer.rollback()
        return True
    except Exception:
        return False


class TransactionLoad:
    """The transactions the chaos workload runs beyond plain local ones, each spread over both
    topics (``targets``: the cluster's ``topic`` and ``txn_topic``) and each one ``txn``
    operation of the history (``ok`` committed, ``fail`` surely rolled back, ``info``
    unknown), so that the read-committed checks (precommitted-read, aborted-read,
    intermediate-read, G1c) judge what the consumers saw of them:

    * ``xa_producer``: XA branches (start, sends, end) rolled back, committed in one phase,
      or prepared and committed in two, one in ten left open past its timeout;
    * ``timed_out``: a transaction left open past its timeout: the broker must roll it
      back, so its commit must fail;
    * ``zombie``: one transactional id started twice, again and again: each round the
      current instance opens a transaction, a new instance of the same id runs one, and
      the older one's commit must be refused (fenced), its messages never visible.

    A commit the broker should have refused (past the timeout, or by a fenced instance)
    is recorded as what it was (``ok``) and also listed in ``problems``: the run fails."""

    def __init__(self, workload: Any) -> None:
        self.workload = workload
        self.history = workload.history
        #: Every transaction spreads its messages over both (``spread_over``).
        self.topics = [workload.cluster.topic, workload.cluster.txn_topic]
        self.problems: list[str] = []
        self.counts: Counter[str] = Counter()

    def targets(self, rng: random.Random, low: int, high: int) -> list[str]:
        """The topics of a transaction's ``low``-``high`` messages, both topics among them."""
        return spread_over(self.topics, rng.randint(low, high), rng)

    async def timed_out(self, producer: Any, process: str, txn: str, rng: random.Random) -> None:
        op = self.history.invoke(process, "txn", txn=txn, timeout_s=TIMED_OUT_TIMEOUT_S)
        sends: list[list[Any]] = []
        self.counts["timed_out"] += 1
        began = time.monotonic()
        try:
            await producer.begin_transaction(timeout_s=TIMED_OUT_TIMEOUT_S)
            await send_values(producer, self.targets(rng, 2, 3), txn, sends)
        except Exception as exc:
            await self._settle_open(producer, op, sends, exc)
            return
        await asyncio.sleep(TIMED_OUT_WAIT_S)
        commit_time = self.history.now()
        try:
            await producer.commit()
        except TransactionRolledBack as exc:
            self.history.fail(op, f"timed out: {exc}", sends=sends)
        except Exception as exc:  # e.g. the commit's retries ran out in a failover
            self.history.info(op, f"unknown: {exc}", sends=sends)
        else:
            self.history.ok(op, sends=sends, commit_time=commit_time)
            self.problems.append(f"transaction {txn} committed {time.monotonic() - began:.1f}s after it began "
                                 f"with a {TIMED_OUT_TIMEOUT_S}s timeout")

    async def _settle_open(self, producer: Any, op: int, sends: list[list[Any]], exc: Exception) -> None:
        """A step before the commit gave up: roll back what we can; fail if surely rolled back."""
        if await roll_back(producer) or isinstance(exc, TransactionRolledBack):
            self.history.fail(op, f"rolled back after: {exc}", sends=sends)
        else:
            self.history.info(op, f"unknown: {exc}", sends=sends)
        await asyncio.sleep(0.1)

    async def xa_producer(self, name: str) -> None:
        rng = random.Random(f"workload/{name}/{self.workload.seed}")
        async with AsyncMessageSessionFactory(self.workload.client_config()) as factory:
            producer = factory.create_xa_producer()
            for number in itertools.count():
                if self.workload.stopping.is_set():
                    break
                await self._xa_transaction(producer, name, f"{name}-t{number}", rng)
                await asyncio.sleep(1 / self.workload.rate)

    async def _xa_transaction(self, producer: Any, process: str, txn: str, rng: random.Random) -> None:
        resource = producer.xa_resource()
        xid = Xid(XA_FORMAT, txn.encode(), b"b0")
        left_open = rng.random() < 0.1
        timeout_s = TIMED_OUT_TIMEOUT_S if left_open else TXN_TIMEOUT_S
        resource.set_transaction_timeout(timeout_s)
        op = self.history.invoke(process, "txn", txn=txn, xa=True, timeout_s=timeout_s)
        sends: list[list[Any]] = []
        decided, commit_time = False, None
        began = time.monotonic()
        try:
            await resource.start(xid)
            await send_values(producer, self.targets(rng, 2, 4), txn, sends)
            await resource.end(xid)
            if left_open:
                self.counts["timed_out"] += 1
                await asyncio.sleep(TIMED_OUT_WAIT_S)
            choice = rng.random()
            if choice < 0.2 and not left_open:
                await resource.rollback(xid)
                self.history.fail(op, "rolled back", sends=sends)
                self.counts["xa_rolled_back"] += 1
                return
            one_phase = choice < 0.5
            if not one_phase:
                await resource.prepare(xid)
            decided, commit_time = True, self.history.now()
            await resource.commit(xid, one_phase=one_phase)
        except XAError as exc:
            if exc.code in XA_ROLLED_BACK:
                self.history.fail(op, f"rolled back by the broker: {exc}", sends=sends)
            elif not decided and await self._xa_roll_back(resource, xid):
                self.history.fail(op, f"rolled back after: {exc}", sends=sends)
            else:
                self.history.info(op, f"unknown: {exc}", sends=sends)
            return
        except Exception as exc:  # a step gave up (retries through a failover ran out)
            if not decided and await self._xa_roll_back(resource, xid):
                self.history.fail(op, f"rolled back after: {exc}", sends=sends)
            else:
                self.history.info(op, f"unknown: {exc}", sends=sends)
            await asyncio.sleep(0.1)
            return
        self.history.ok(op, sends=sends, commit_time=commit_time, phases=1 if one_phase else 2)
        self.counts["xa_committed"] += 1
        if left_open:
            self.problems.append(f"XA branch {txn} committed {time.monotonic() - began:.1f}s after it began "
                                 f"with a {TIMED_OUT_TIMEOUT_S}s timeout")

    @staticmethod
    async def _xa_roll_back(resource: Any, xid: Xid) -> bool:
        """Roll back a branch a step gave up in, as a transaction manager does: XA allows no
        rollback while the branch is associated (XAER_PROTO), so a branch whose send gave up
        is ended with TMFAIL first. Without that, every such branch stayed open until its
        timeout, holding its partitions' reads (campaign seed 6200)."""
        try:
            if resource.associated is not None:
                await resource.end(xid, TMFAIL)
            await resource.rollback(xid)
            return True
        except XAError as exc:
            return exc.code in XA_ROLLED_BACK
        except Exception:
            return False

    async def zombie(self, name: str) -> None:
        """Rounds of: the current instance of transactional id ``name`` opens a
        transaction; a new instance of the id runs one (its start fences the older and
        has the broker roll back the older's open transaction); the older commits, which
        must be refused. The new instance is the current one of the next round. Every
        instance names broker group 0, where the id's transactions run."""
        rng = random.Random(f"workload/{name}/{self.workload.seed}")
        async with AsyncMessageSessionFactory(self.workload.client_config()) as factory:
            current = factory.create_transactional_producer(transactional_id=name, broker_id=0)
            for number in itertools.count():
                if self.workload.stopping.is_set():
                    break
                older_txn = f"{name}-t{number}-older"
                op = self.history.invoke(f"{name}-older", "txn", txn=older_txn, zombie=True, timeout_s=TXN_TIMEOUT_S)
                sends: list[list[Any]] = []
                try:
                    await current.begin_transaction(timeout_s=TXN_TIMEOUT_S)
                    await send_values(current, self.targets(rng, 2, 2), older_txn, sends)
                except Exception as exc:
                    await self._settle_open(current, op, sends, exc)
                    current = factory.create_transactional_producer(transactional_id=name, broker_id=0)
                    continue
                older_epoch = current.sender.producer_epoch
                newer = factory.create_transactional_producer(transactional_id=name, broker_id=0)
                await self.workload._transaction(newer, f"{name}-newer", f"{name}-t{number}-newer", rng)
                # The newer instance got its epoch from the broker: the older one is fenced.
                fenced = newer.sender.producer_epoch > older_epoch
                await self._zombie_commit(current, op, sends, older_txn, fenced)
                current = newer
                # Each round is a new instance (an init_producer): a few a second is plenty.
                await asyncio.sleep(max(1 / self.workload.rate, ZOMBIE_ROUND_GAP_S))

    async def _zombie_commit(self, older: Any, op: int, sends: list[list[Any]], txn: str, fenced: bool) -> None:
        commit_time = self.history.now()
        try:
            await older.commit()
        except (ProducerFenced, TransactionRolledBack) as exc:
            self.history.fail(op, f"older instance refused: {exc}", sends=sends)
            self.counts["zombies_fenced"] += 1
        except Exception as exc:
            self.history.info(op, f"unknown: {exc}", sends=sends)
        else:
            self.history.ok(op, sends=sends, commit_time=commit_time)
            if fenced:
                self.problems.append(f"zombie transaction {txn} committed after a newer instance of its "
                                     f"transactional id started")

    def line(self) -> str:
        c = self.counts
        return (f"XA (xa0): {c['xa_committed']} committed, {c['xa_rolled_back']} rolled back by it; "
                f"{c['timed_out']} left open past a {TIMED_OUT_TIMEOUT_S}s timeout; "
                f"zombie (z0): {c['zombies_fenced']} older instances fenced; "
                f"commits that should have been refused: {len(self.problems)}")


# --- the chaos run ----------------------------------------------------------------------------


def run(scenario: str, seconds: float, seed: int, out: Path, mode: str = "sync") -> dict[str, Any]:
    from .cluster import ChaosCluster
    from .scenarios import inject, schedule

    outcomes, stop = TxnOutcomes(), threading.Event()
    faults: list[dict[str, Any]] = []
    with ChaosCluster(out / "cluster", mode=mode) as cluster:
        config = MetaClientConfig(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root, zk_session_timeout_ms=5000,
                                  send_timeout_s=30, address_map=cluster.client_address_map)
        replicas = {b.name: (b.address, b.client_port) for b in cluster.brokers}
        topics = cluster.topics

        async def load() -> None:
            writers = [asyncio.ensure_future(transactional_writer(w, config, list(topics), stop, outcomes))
                       for w in range(WRITERS)]
            while not stop.is_set():
                for where, messages in await scan_all(replicas, topics):
                    outcomes.scan(messages, where)
                await asyncio.sleep(0.1)
            await asyncio.gather(*writers)

        loader = threading.Thread(target=lambda: asyncio.run(load()), daemon=True)
        loader.start()
        rng = random.Random(f"inject/{seed}")
        stop_at = time.monotonic() + seconds
        time.sleep(2)
        for number, step in enumerate(schedule(scenario, seed, 1, 1, cluster.session_ms / 1000)):
            if time.monotonic() >= stop_at:
                break
            target, details, heal = inject(cluster, step, rng)
            faults.append({"step": number, "kind": step.kind, "target": target, **details})
            time.sleep(step.hold_s)
            heal()
            cluster.wait_settled()
            time.sleep(step.gap_s)
        stop.set()
        loader.join(120)
        cluster.wait_settled()
        time.sleep(1)  # slaves' committed offsets catch up
        for where, messages in asyncio.run(scan_all(replicas, topics)):
            outcomes.final(messages, where)
    outcomes.check()
    result = {"scenario": scenario, "seed": seed, "faults": faults, **outcomes.summary()}
    (out / "transactions.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.transactions", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="kill-master")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", default="sync", choices=("sync", "async"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.scenario, args.seconds, args.seed, args.out, args.mode)
    print(json.dumps(result, indent=2))
    return 0 if not result["violations"] and result["committed"] else 1


if __name__ == "__main__":
    sys.exit(main())
