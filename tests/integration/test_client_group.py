"""A consumer group of three real `metaq consume` processes, and a producer across broker crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from kazoo.exceptions import NoNodeError

from metaq.client import Message, MessageSessionFactory, MetaClientConfig
from metaq.zk.paths import ZkPaths
from tests.harness import REPO_ROOT, wait_until

SYSTEM = {"unflushThreshold": 0}
TOPIC = "events"
COMMIT_INTERVAL = 1.0


class ConsumeProcess:
    """`python -m metaq consume` with stdout to a file: one line per message."""

    def __init__(self, tmp: Path, name: str, zk: str, zk_root: str) -> None:
        self.out = tmp / f"{name}.out"
        self.err = tmp / f"{name}.err"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "metaq", "consume", "--zk", zk, "--zk-root", zk_root, "--topic", TOPIC,
             "--group", "workers", "--from-beginning", "--commit-interval", str(COMMIT_INTERVAL),
             "--zk-session-timeout-ms", "4000", "--consumer-id", name, "--recover-dir", str(tmp / "recover")],
            stdout=open(self.out, "wb"), stderr=open(self.err, "wb"), cwd=REPO_ROOT, env=env,
        )

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        return self.err.read_text()


def owners(zk_client, zk_root: str) -> dict[str, str]:
    """Partition -> owning member; a node released between the listing and its read (a
    rebalance in progress) is left out: the callers poll until the ownership settles."""
    path = ZkPaths(zk_root).owners("workers", TOPIC)
    owned = {}
    try:
        children = zk_client.get_children(path)
    except NoNodeError:
        return owned
    for child in children:
        try:
            owned[child] = zk_client.get(f"{path}/{child}")[0].decode()
        except NoNodeError:
            pass
    return owned


def test_group_of_three_processes_shares_and_rebalances_without_loss(broker_factory, zk, zk_root, zk_client, tmp_path) -> None:
    for broker_id in (0, 1):
        broker_factory(broker_id, {TOPIC: 3}, system=SYSTEM)
    members = [ConsumeProcess(tmp_path, f"c{k}", zk.connect_string, zk_root) for k in range(3)]
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000)
    sent: list[str] = []
    try:
        with MessageSessionFactory(config) as factory:
            producer = factory.create_producer()

            def produce(n: int) -> None:
                batch = [f"{len(sent) + i:06d}" for i in range(n)]
                results = producer.send_batch([Message(TOPIC, d.encode()) for d in batch])
                assert all(r.success for r in results), [r.error_message for r in results if not r.success]
                sent.extend(batch)

            # All three own two of the six partitions each, no partition twice.
            wait_until(lambda: Counter(owners(zk_client, zk_root).values()) == {"workers_c0": 2, "workers_c1": 2, "workers_c2": 2},
                       30, interval=0.2, message="three members owning two partitions each")
            for _ in range(5):
                produce(40)
                time.sleep(0.2)
            wait_until(lambda: sum(len(m.lines()) for m in members) >= len(sent), 20, message="first 200 consumed")
            before = [set(m.lines()) for m in members]
            assert sum(len(m.lines()) for m in members) == len(sent), "duplicates without any failure"
            assert all(before), "every member got a share"
            assert set().union(*before) == set(sent)

            # Let a commit happen, then crash one member mid-stream.
            time.sleep(COMMIT_INTERVAL * 1.5)
            produce(40)
            time.sleep(0.3)
            victim = members[1]
            victim.kill()
            victim_lines = victim.lines()
            for _ in range(5):
                produce(40)
                time.sleep(0.2)
            # Its session expires (4 s), the two survivors split its partitions and go on
            # from its last committed offsets.
            wait_until(lambda: Counter(owners(zk_client, zk_root).values()) == {"workers_c0": 3, "workers_c2": 3},
                       30, interval=0.2, message="two survivors owning three partitions each")
            survivors = [members[0], members[2]]
            wait_until(lambda: set().union(*(set(m.lines()) for m in survivors), victim_lines) >= set(sent),
                       30, message="every sent message consumed")
    finally:
        errors = [m.stop() for m in members]
    all_lines = [line for m in members for line in m.lines()]
    counts = Counter(all_lines)
    assert set(counts) == set(sent), "no message lost, nothing unknown"
    duplicates = {line: n for line, n in counts.items() if n > 1}
    print(f"\n{len(sent)} sent, {len(all_lines)} consumed, {len(duplicates)} duplicates "
          f"(victim consumed {len(victim_lines)}; commit interval {COMMIT_INTERVAL}s)")
    # Duplicates only come from the crash: messages the victim consumed after its last commit,
    # consumed again by its successor. Its last batch (40 messages, after the last commit) bounds them.
    assert set(duplicates) <= set(victim_lines)
    assert all(n == 2 for n in duplicates.values())
    assert len(duplicates) <= 40 + 40, duplicates
    for err in (errors[0], errors[2]):
        assert "consumed" in err and "Traceback" not in err


def test_producer_keeps_going_while_brokers_die_and_return(broker_factory, zk, zk_root) -> None:
    brokers = [broker_factory(b, {TOPIC: 2}, system=SYSTEM) for b in (0, 1)]
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000,
                              send_timeout_s=1.5, send_retry_max_wait_s=0.3)
    results = []
    with MessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        producer.publish(TOPIC)

        def send(n: int, tag: str):
            batch = [producer.send_message(Message(TOPIC, f"{tag}{i}".encode())) for i in range(n)]
            results.extend(batch)
            return batch

        assert {r.partition.broker_id for r in send(8, "up") if r.success} == {0, 1}
        # Broker 1 crashes: its znodes linger until its session expires, so sends first
        # hit a refused connection, are retried elsewhere, and broker 1 is skipped.
        brokers[1].kill()
        phase = send(20, "one-down")
        assert all(r.success for r in phase), [r.error_message for r in phase if not r.success]
        assert {r.partition.broker_id for r in phase} == {0}
        # Both down: every send ends in a clear failure, none in silence or an exception.
        brokers[0].kill()
        phase = send(3, "all-down")
        assert not any(r.success for r in phase)
        for r in phase:
            assert r.error_message and ("unreachable" in r.error_message or "no available partition" in r.error_message), r
            assert not r.outcome_unknown
        # Both come back (same ports, same data): sends flow to both again.
        for broker in brokers:
            broker.start()
        wait_until(lambda: len(factory.aio.cluster.snapshot.writable_partitions(TOPIC)) == 4, 15,
                   message="both masters back in the client's view")
        # The producer still skips broker 1 (it refused a moment ago) until its reconnect probe
        # succeeds, a fraction of a second later; meanwhile the sends go to broker 0.
        back: list = []

        def both_take_sends() -> bool:
            phase = send(4, "back")
            back.extend(phase)
            return {r.partition.broker_id for r in phase if r.success} == {0, 1}

        wait_until(both_take_sends, 10, message="sends reach both restarted masters")
        assert all(r.success for r in back), [r.error_message for r in back if not r.success]
    assert len(results) == 8 + 20 + 3 + len(back)  # every send ended in a SendResult
