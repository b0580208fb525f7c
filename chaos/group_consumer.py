"""The consumer-group workload: consumer *processes* of one group, killed, stopped and restarted.

``ConsumerGroupLoad`` (run by chaos/runner.py) keeps ``size`` members of group
``chaos-g0`` alive, each a separate OS process (``python -m chaos.group_consumer``)
subscribed to both of the cluster's topics (the workload's and the transactions' second
one, ``ChaosCluster.topics``), running the real client's consumer
(``AsyncMessageConsumer``: ZooKeeper owners and offsets, read committed, ``read_from`` master / slave / prefer-slave in turn, offsets
committed every 0.5 s). Every few seconds (seeded) one member is SIGKILLed (no commit: it
redelivers since its last commit) or SIGTERMed (it commits and leaves the group), and
restarted under a new process name. At the end every member leaves, and one drain member
reads the group to the end of the settled logs.

Each member writes its history to a JSON-lines file as it goes (one line per assignment
change and per delivered batch; a line written before SIGKILL is in the page cache, so it
survives): ``{"f": "assign", "time", "generation", "partitions"}`` and ``{"f": "poll",
"time", "generation", "partition", "pairs"}``, and ``{"f": "owns", "partitions"}`` each time
the set of partitions it fetches changes (for the drain; not part of the history). A *generation* is one partition fetcher's
life: a new one starts each time the member claims a partition (a rebalance). The load
merges the files into the history (``History.assign`` / ``History.poll`` records, in time
order; times are on the runner's monotonic clock, which the members share).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

GROUP = "chaos-g0"
READ_FROM = ("master", "slave", "prefer-slave")
REPO = Path(__file__).resolve().parent.parent


# --- the member process -------------------------------------------------------------------------


class MemberLog:
    """What one member writes: its assignment changes and delivered batches."""

    def __init__(self, out: IO[str], t0: float) -> None:
        self.out, self.t0 = out, t0
        self.generations: dict[Any, int] = {}  # partition fetcher -> its generation (strong refs: no id reuse)
        self.current: dict[str, int] = {}  # partition name -> generation now

    def write(self, **record: Any) -> None:
        record["time"] = round(time.monotonic() - self.t0, 6)
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")  # line-buffered: one write per line

    def batch(self, consumer: Any, topic: str, messages: list[Any]) -> None:
        from chaos.history import value_of

        if not messages:
            return
        partition = messages[0].partition
        name = f"{topic}/{partition}"
        fetcher = consumer.fetchers.get((topic, partition))
        if fetcher is not None and fetcher not in self.generations:
            self.generations[fetcher] = len(self.generations) + 1
            self.current[name] = self.generations[fetcher]
            self.write(f="assign", generation=self.generations[fetcher], partitions=sorted(self.current))
        # A fetcher being dropped (already out of ``fetchers``) still delivers as its generation.
        generation = self.generations.get(fetcher, self.current.get(name, 0))
        self.write(f="poll", generation=generation, partition=name,
                   pairs=[[m.offset, value_of(bytes(m.data))] for m in messages])


async def member(args: argparse.Namespace) -> None:
    from metaq.client import AsyncMessageSessionFactory, MetaClientConfig
    from metaq.client.config import ConsumerConfig
    from metaq.client.connection import Credentials

    credentials = Credentials(args.user, os.environ.get("CHAOS_CLIENT_PASSWORD")) if args.user else Credentials()
    config = MetaClientConfig(zk_connect=args.zk_connect, zk_root=args.zk_root, zk_session_timeout_ms=10_000,
                              request_timeout_s=3.0, connect_timeout_s=1.0,
                              address_map=json.loads(args.address_map), credentials=credentials)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)  # SIGTERM: commit, leave the group, exit
    with open(args.out, "a", buffering=1) as out:
        log = MemberLog(out, args.t0)
        async with AsyncMessageSessionFactory(config) as factory:
            consumer = factory.create_consumer(ConsumerConfig(
                group=args.group, read_from=args.read_from, consumer_id=args.process, commit_interval_s=0.5,
                fetch_wait_ms=500, claim_timeout_s=30.0, recover_dir=str(Path(args.out).with_suffix(".recover"))))
            for topic in args.topic:
                consumer.subscribe(topic, batch_listener=lambda ms, topic=topic: log.batch(consumer, topic, ms))
            await consumer.complete_subscribe()
            owned: list[str] = []
            while not stop.is_set():  # what it owns, for the drain to know it has every partition
                now = sorted(f"{topic}/{partition}" for topic, partition in consumer.fetchers)
                if now != owned:
                    owned = now
                    log.write(f="owns", partitions=owned)
                try:
                    await asyncio.wait_for(stop.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass
            await consumer.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.group_consumer", description="one consumer-group member")
    for name in ("--zk-connect", "--zk-root", "--group", "--process", "--read-from", "--out", "--address-map"):
        p.add_argument(name, required=True)
    p.add_argument("--topic", action="append", required=True, help="a topic to subscribe to (repeatable)")
    p.add_argument("--t0", type=float, required=True, help="the runner's monotonic clock origin")
    p.add_argument("--user", default=None, help="SCRAM user (password in $CHAOS_CLIENT_PASSWORD)")
    asyncio.run(member(p.parse_args(argv)))
    return 0


# --- the load (in the runner) -------------------------------------------------------------------


class ConsumerGroupLoad:
    """Keeps ``size`` members alive, churns them (seeded), and merges their histories."""

    def __init__(self, cluster: Any, history: Any, seed: int, out: Path, size: int = 3,
                 churn_s: tuple[float, float] = (3.0, 6.0)) -> None:
        self.cluster, self.history, self.size, self.churn_s = cluster, history, size, churn_s
        self.dir = Path(out) / "consumers"
        self.rng = random.Random(f"consumers/{seed}")
        self.members: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}  # slot -> (process name, process)
        self.started: list[str] = []
        self.signals: dict[str, int] = {"SIGKILL": 0, "SIGTERM": 0}
        self.crashes: list[str] = []  # members that exited before they were signalled, non-zero
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self, slot: int, read_from: str) -> None:
        name = f"{GROUP}-c{slot}.{len(self.started)}"  # a restart is a new process
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        credentials = self.cluster.credentials
        if credentials.password:
            env["CHAOS_CLIENT_PASSWORD"] = credentials.password
        cmd = [sys.executable, "-m", "chaos.group_consumer", "--zk-connect", self.cluster.zk_connect,
               "--zk-root", self.cluster.zk_root, *(f"--topic={topic}" for topic in self.cluster.topics), "--group", GROUP,
               "--process", name, "--read-from", read_from, "--out", str(self.dir / f"{name}.jsonl"),
               "--address-map", json.dumps(self.cluster.client_address_map), "--t0", repr(self.history.t0)]
        if credentials.user:
            cmd += ["--user", credentials.user]
        with open(self.dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.members[slot] = (name, proc)
        self.started.append(name)
        self.history.fault("consumer-start", name, read_from=read_from, pid=proc.pid)

    def start(self) -> None:
        for slot in range(self.size):
            self._spawn(slot, READ_FROM[slot % len(READ_FROM)])
        self._thread = threading.Thread(target=self._churn, daemon=True, name="chaos-consumers")
        self._thread.start()

    def _churn(self) -> None:
        """Every few seconds: one member SIGKILLed (no commit) or SIGTERMed (commit, leave),
        and started again a moment later with another ``read_from``."""
        while not self._halt.wait(self.rng.uniform(*self.churn_s)):
            slot = self.rng.randrange(self.size)
            how = self.rng.choice((signal.SIGKILL, signal.SIGTERM))
            self._stop(slot, how)
            if self._halt.wait(self.rng.uniform(0.5, 1.5)):
                return
            self._spawn(slot, self.rng.choice(READ_FROM))

    def _stop(self, slot: int, how: signal.Signals, wait_s: float = 20.0) -> None:
        self._wait(self._signal(slot, how), wait_s)

    def _signal(self, slot: int, how: signal.Signals) -> subprocess.Popen[bytes]:
        name, proc = self.members.pop(slot)
        if proc.poll() not in (None, 0):  # gone before anyone stopped it: a crash, the run fails
            self.crashes.append(f"consumer {name} exited by itself with code {proc.returncode} "
                                f"(see consumers/{name}.log)")
        self.signals[how.name] += 1
        self.history.fault("consumer-" + ("kill" if how == signal.SIGKILL else "stop"), name, pid=proc.pid)
        proc.send_signal(how)  # by pid: a process this load started
        return proc

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], wait_s: float) -> None:
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()  # it did not leave in time: by pid, as it was started
            proc.wait()

    def stop(self) -> None:
        """Stop churning; every member commits and leaves (all at once)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(30)
        for proc in [self._signal(slot, signal.SIGTERM) for slot in list(self.members)]:
            self._wait(proc, 20.0)

    def drain(self, idle_s: float = 4.0, limit_s: float = 90.0) -> None:
        """One member reads the group to the end (after the load stopped and the cluster
        settled): once it owns every partition (a SIGKILLed member's claims last until its
        ZooKeeper session expires), until its file has not grown for ``idle_s`` (``limit_s``
        at most)."""
        self._spawn(0, "master")
        name, _proc = self.members[0]
        path = self.dir / f"{name}.jsonl"
        every = {name for g in range(self.cluster.num_groups) for _t, _n, name in self.cluster.partition_names(g)}
        deadline, last, since = time.monotonic() + limit_s, "", time.monotonic()
        while time.monotonic() < deadline:
            text = path.read_text() if path.exists() else ""
            if text != last:
                last, since = text, time.monotonic()
            elif time.monotonic() - since >= idle_s and every <= self._owned(text):
                break
            time.sleep(0.2)
        self._stop(0, signal.SIGTERM)

    @staticmethod
    def _owned(text: str) -> set[str]:
        """The partitions a member's file says it owns now (its last ``owns`` record)."""
        for line in reversed(text.splitlines()):
            if '"f":"owns"' in line:
                try:
                    return set(json.loads(line)["partitions"])
                except ValueError:
                    continue
        return set()

    def kill_all(self) -> None:
        """Whatever is still running (an error path): SIGKILL, by pid."""
        for slot in list(self.members):
            self._stop(slot, signal.SIGKILL, wait_s=5.0)

    def merge(self) -> int:
        """Every member's records into the history; returns how many."""
        records = []
        for name in self.started:
            path = self.dir / f"{name}.jsonl"
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                try:
                    records.append((name, json.loads(line)))
                except ValueError:
                    continue  # a line cut by SIGKILL
        self.history.merge_consumer_records(GROUP, records)
        return len(records)

    def reached_end(self) -> list[str]:
        return unreached(self.history, GROUP)


def unreached(history: Any, group: str) -> list[str]:
    """The partitions whose last committed message group ``group`` was never given (after its
    records were merged and the final snapshot taken): empty when it ran to the end."""
    from chaos.anomalies import transaction_marker
    from chaos.checker import build_index
    from chaos.history import is_control

    delivered = {v for op in history.ops if op.get("f") == "poll" and op.get("group") == group
                 for pairs in (op.get("polls") or {}).values() for _o, v in pairs}
    # A read-committed consumer is never given a rolled-back (or maybe rolled-back) transaction's
    # messages, nor those of one whose final marker is an ABORT although its client was told
    # committed (async: a failover took back its COMMIT marker and the new master aborted it).
    logs = build_index(history).logs
    hidden = {value for op in history.ops if op.get("f") == "txn" and op["type"] != "invoke"
              and (op["type"] in ("fail", "info") or transaction_marker(logs, op) == "ABORT")
              for _p, _o, value in op.get("sends") or []}
    short = []
    for rep in history.final["replicas"].values():
        if rep.get("role") != "master":
            continue
        for partition, snap in rep.get("partitions", {}).items():
            values = [r[3] for r in snap.get("records", [])
                      if r[3] is not None and not is_control(r[3]) and r[3] not in hidden]
            if values and values[-1] not in delivered:
                short.append(partition)
    return short


if __name__ == "__main__":
    sys.exit(main())
