"""What a broker costs as it grows: partitions, log size, catch-up, connections, message size.

    python bench/scale.py [--dims partitions,log,catchup,connections,msgsize,idle]
                          [--partitions 10,100,1000,10000] [--log-gib 1,10] [--catchup-gib 2]
                          [--connections 100,1000,10000] [--idle-seconds 30] [--produce-seconds 5]
                          [--baseline DIR] [--json results.json] [--dir WORKDIR]
    python bench/scale.py --table results.json      # the markdown tables of a saved run

Every figure comes from real processes (an embedded ZooKeeper, ``metaq broker`` OS processes,
read from /proc) on this machine, in one run; pick dimensions and sizes to fit the time at
hand. The defaults are the full sizes, except the 50 GiB log (``--log-gib 1,10,50``: it needs
~55 GB of free disk; the bench refuses sizes that would leave less than 10 GB free).
Everything written goes under a temporary directory (or ``--dir``) and is removed at the end.

Dimensions:

* ``partitions``: for each size, a sync pair (``conf/sync-pair``'s settings: group commit,
  ``onSyncSlaveLoss=degrade``, ``zk.zkSessionTimeoutMs=2000``) and one topic of that many
  partitions made by ``metaq topics create`` (create time: until both serve it; then until
  every replica of the slave follows); ZooKeeper nodes and bytes (and the biggest node);
  RSS, open descriptors and CPU of master and slave idle over ``--idle-seconds``; batched
  produce (100 x 100 B per put, 32 in flight) to one partition and round-robin over all;
  a clean restart of the slave (its SIGTERM timed; until it is back in the sync set); a kill
  -9 of the master (first acked write on the new master, and until a put to every partition
  was acked; what its take-over spent flushing the logs and making every partition's epoch
  history durable, from its log); then a SIGTERM of the new master (timed: every log dirty).
* ``log``: a standalone broker over N GiB in one partition and spread over 100 (segments
  written directly, 1 GiB each): start, restart after a clean stop and after kill -9, RSS.
* ``catchup``: a slave started empty copies N GiB from its master: MB/s, beside ``cat`` of
  the same segment files and a loopback TCP transfer of them (``sendfile``), same run.
* ``connections``: N idle authenticated connections (``securityEnabled=true``, SCRAM) to a
  master: its RSS and descriptors, and another producer's put latency p50/p99 beside them.
* ``msgsize``: 100 B, 10 KiB and 1 MiB messages on the sync pair (MB/s), beside ``dd``'s
  write bandwidth (``conv=fdatasync``) on the same disk.
* ``idle``: idle CPU of a standalone master with ``--idle-partitions`` (default 1,000; every
  partition written once), this code against ``--baseline DIR`` (a checkout of another
  version), interleaved A B A B: the cost of the broker's own timers outside replication;
  then a put to every partition and a SIGTERM: how long the stop takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq import record  # noqa: E402
from metaq.client.connection import BrokerConnection, Credentials  # noqa: E402
from metaq.protocol.messages import PutRequest  # noqa: E402
from metaq.protocol.replies import fetch_stats  # noqa: E402
from metaq.store.log import PartitionLog  # noqa: E402
from metaq.tools.launcher import BrokerFactory, BrokerProcess, port_accepts, wait_until  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402
from metaq.zk.group import read_group_state  # noqa: E402
from metaq.zk.paths import ZkPaths  # noqa: E402
from metaq.zk.session import zk_session  # noqa: E402

TOPIC = "scale"
SYNC_PAIR = {"unflushThreshold": 0, "replicationMode": "sync", "minSyncSlaves": 1, "syncSlaveTimeoutMs": 2000,
             "onSyncSlaveLoss": "degrade", "autoFailover": "true"}
ZK_SETTINGS = {"zk.zkSessionTimeoutMs": 2000}
NO_ZK = {"zk.zkEnable": "false"}
#: How long one phase may wait for a state that may never come (the figure is then "> limit").
PHASE_LIMIT_S = 90.0
GIB = 1024 ** 3
#: Free disk the log dimension leaves at least.
KEEP_FREE_BYTES = 10 * GIB
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The new master's log line of its take-over steps (metaq/ha/leadership.py, ``take_up``).
TAKEOVER_LINE = re.compile(r"epoch \d+: every log flushed in ([\d.]+) s, \d+ partitions' epoch histories durable in ([\d.]+) s")


# --- process figures, from /proc ----------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Percent of one core each process used over ``seconds`` while nothing was sent to it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: round(100 * (cpu_seconds(pid) - before[name]) / seconds, 1) for name, pid in pids.items()}


def footprint(prefix: str, broker: BrokerProcess) -> dict[str, float]:
    assert broker.pid is not None
    return {f"{prefix}_rss_mib": round(rss_mib(broker.pid), 1), f"{prefix}_fds": open_fds(broker.pid)}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(predicate: Callable[[], Any], limit: float = PHASE_LIMIT_S, interval: float = 0.1) -> float | None:
    """Seconds until ``predicate()`` holds, or None if it did not within ``limit``."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            if predicate():
                return round(time.monotonic() - started, 2)
        except Exception:  # a broker not up yet: asked again
            pass
        time.sleep(interval)
    return None


# --- the wire -----------------------------------------------------------------------------


def batch_body(count: int, size: int) -> bytes:
    return record.encode_batch([(b"m" * size, None)] * count)


async def put_once(conn: BrokerConnection, partition: int, body: bytes, count: int, timeout: float = 10.0) -> bool:
    header = PutRequest(topic=TOPIC, partition=partition, count=count).to_header()
    reply = await conn.request(header, body, timeout=timeout)
    return reply.code == 200


async def produce(port: int, partitions: list[int], seconds: float, count: int = 100, size: int = 100,
                  in_flight: int = 32, credentials: Credentials | None = None) -> dict[str, float]:
    """Puts of ``count`` x ``size`` B, ``in_flight`` at a time on one connection, partitions in turn."""
    body = batch_body(count, size)
    conn = await (credentials or Credentials()).open("127.0.0.1", port, timeout=10)
    latencies: list[float] = []
    acked = failed = 0
    deadline = time.monotonic() + seconds
    turn = iter(range(1 << 62))

    async def worker() -> None:
        nonlocal acked, failed
        while time.monotonic() < deadline:
            partition = partitions[next(turn) % len(partitions)]
            started = time.perf_counter()
            try:
                ok = await put_once(conn, partition, body, count)
            except (asyncio.TimeoutError, ConnectionError):
                ok = False
            latencies.append(time.perf_counter() - started)
            if ok:
                acked += 1
            else:
                failed += 1

    started = time.monotonic()
    try:
        await asyncio.gather(*(worker() for _ in range(in_flight)))
    finally:
        conn.close()
    took = time.monotonic() - started
    return {"mb_s": round(acked * count * size / took / 1e6, 1), "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 1), "failed_puts": failed}


async def put_everywhere(port: int, partitions: int, limit: float) -> tuple[int, float]:
    """One put to every partition, retried until acked: (partitions acked, seconds)."""
    body = batch_body(1, 100)
    pending = set(range(partitions))
    started = time.monotonic()
    conn: BrokerConnection | None = None
    while pending and time.monotonic() - started < limit:
        try:
            if conn is None or not conn.is_open:
                conn = await BrokerConnection.open("127.0.0.1", port, timeout=5)
            batch = sorted(pending)[:500]
            results = await asyncio.gather(*(put_once(conn, p, body, 1, timeout=5) for p in batch), return_exceptions=True)
            pending -= {p for p, ok in zip(batch, results) if ok is True}
        except (OSError, ConnectionError, asyncio.TimeoutError):
            conn = None
            await asyncio.sleep(0.1)
    if conn is not None:
        conn.close()
    return partitions - len(pending), round(time.monotonic() - started, 2)


async def first_ack(port: int, limit: float) -> float | None:
    body = batch_body(1, 100)
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            conn = await BrokerConnection.open("127.0.0.1", port, timeout=2)
            try:
                if await put_once(conn, 0, body, 1, timeout=5):
                    return round(time.monotonic() - started, 2)
            finally:
                conn.close()
        except (OSError, ConnectionError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.05)
    return None


def stats(broker: BrokerProcess, item: str = "") -> Any:
    async def ask() -> Any:
        conn = await BrokerConnection.open(*broker.address, timeout=5)
        try:
            return await fetch_stats(conn, item, timeout=30)
        finally:
            conn.close()

    return asyncio.run(ask())


def replicas_following(slave: BrokerProcess) -> int:
    return sum(1 for _name, row in stats(slave).replica_rows().items() if row.get("state") == "following")


# --- ZooKeeper ----------------------------------------------------------------------------


def timed_stop(broker: BrokerProcess) -> float | None:
    """SIGTERM ``broker``: seconds until it exited, or None if it had to be killed."""
    started = time.monotonic()
    broker.stop(timeout=PHASE_LIMIT_S)
    took = round(time.monotonic() - started, 2)
    return took if took < PHASE_LIMIT_S else None


def zk_tree(connect: str, root: str) -> dict[str, Any]:
    """Nodes, bytes of data and the biggest node under ``root``."""
    nodes = total = 0
    biggest = (0, "")
    with zk_session(connect) as client:
        stack = [root]
        while stack:
            path = stack.pop()
            data, stat = client.get(path)
            nodes += 1
            total += len(data or b"")
            biggest = max(biggest, (len(data or b""), path))
            if stat.numChildren:
                stack.extend(f"{path}/{child}" for child in client.get_children(path))
    return {"zk_nodes": nodes, "zk_bytes": total, "zk_biggest_node_bytes": biggest[0], "zk_biggest_node": biggest[1]}


def in_sync_set(connect: str, root: str, slave_id: int) -> bool:
    with zk_session(connect) as client:
        return slave_id in read_group_state(client, ZkPaths(root), 0).sync_set


def master_url(connect: str, root: str) -> str | None:
    with zk_session(connect) as client:
        found = client.exists(ZkPaths(root).master(0))
        return client.get(ZkPaths(root).master(0))[0].decode() if found else None


# --- dimension: partitions --------------------------------------------------------------


def metaq_cli(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "metaq", *argv], cwd=REPO, env=env, text=True, capture_output=True,
                          timeout=timeout)


def partitions_row(work: Path, partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"partitions": partitions}
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    zk.start()
    root = "/scale"
    factory = BrokerFactory(work, zk.connect_string, root)
    try:
        master = factory(0, {"seed": 1}, SYNC_PAIR, name="A", zookeeper=ZK_SETTINGS)
        slave = factory(0, {"seed": 1}, SYNC_PAIR, {"slaveId": 1}, name="B", zookeeper=ZK_SETTINGS)
        wait_until(lambda: in_sync_set(zk.connect_string, root, 1), 60, message="the slave in the sync set")
        started = time.monotonic()
        created = metaq_cli("topics", "create", "--zk", zk.connect_string, "--zk-root", root, "--broker-id", "0",
                            "--topic", TOPIC, "--partitions", str(partitions), "--wait", str(int(2 * PHASE_LIMIT_S)))
        row["create_s"] = round(time.monotonic() - started, 2) if created.returncode == 0 else None
        if created.returncode != 0:
            row["create_error"] = (created.stdout + created.stderr).strip().splitlines()[-1:]
        waited = timed(lambda: replicas_following(slave) >= partitions + 1)
        row["slave_all_replicas_s"] = None if waited is None else round(time.monotonic() - started, 2)
        if waited is None:
            row["slave_replicas_following"] = replicas_following(slave)
        row.update(zk_tree(zk.connect_string, root))
        # Every partition written once, so every log is open (and counted) on both brokers.
        row["first_put_all"] = asyncio.run(put_everywhere(master.port, partitions, PHASE_LIMIT_S))[0]
        time.sleep(5)
        row.update(footprint("master", master))
        row.update(footprint("slave", slave))
        cpu = idle_cpu({"master": master.pid, "slave": slave.pid}, args.idle_seconds)  # type: ignore[dict-item]
        row["master_idle_cpu_pct"], row["slave_idle_cpu_pct"] = cpu["master"], cpu["slave"]
        one = asyncio.run(produce(master.port, [0], args.produce_seconds))
        spread = asyncio.run(produce(master.port, list(range(partitions)), args.produce_seconds))
        row["produce_one_mb_s"], row["produce_one_p99_ms"] = one["mb_s"], one["p99_ms"]
        row["produce_all_mb_s"], row["produce_all_p99_ms"] = spread["mb_s"], spread["p99_ms"]
        row["produce_failed_puts"] = one["failed_puts"] + spread["failed_puts"]
        # A clean restart of the slave (its SIGTERM timed): until it is back in the sync set.
        row["slave_sigterm_s"] = timed_stop(slave)
        started = time.monotonic()
        slave.start(wait=False)
        row["slave_restart_in_sync_set_s"] = timed(lambda: in_sync_set(zk.connect_string, root, 1) and
                                                   replicas_following(slave) >= partitions + 1)
        # kill -9 of the master: the slave takes over.
        master.kill()
        started = time.monotonic()
        row["failover_took_over_s"] = timed(lambda: master_url(zk.connect_string, root) == slave.url, interval=0.02)
        took = asyncio.run(first_ack(slave.port, PHASE_LIMIT_S)) if row["failover_took_over_s"] is not None else None
        row["failover_first_ack_s"] = None if took is None else round(time.monotonic() - started, 2)
        served = asyncio.run(put_everywhere(slave.port, partitions, PHASE_LIMIT_S))[0] if took is not None else 0
        row["failover_all_served_s"] = round(time.monotonic() - started, 2) if served == partitions else None
        row["failover_partitions_served"] = served
        row["failover_flush_s"], row["failover_epochs_s"] = takeover_steps(slave)
        # SIGTERM of the new master right after a put to every partition: 10,000 dirty logs.
        row["master_sigterm_s"] = timed_stop(slave)
    finally:
        factory.stop_all()
        zk.stop()
    return row


def takeover_steps(broker: BrokerProcess) -> tuple[float | None, float | None]:
    """What the broker's last take-over spent flushing every log and making every partition's
    epoch history durable (its log line ``epoch N: every log flushed in X s, ... durable in Y s``)."""
    found = TAKEOVER_LINE.findall(broker.log_text())
    return (float(found[-1][0]), float(found[-1][1])) if found else (None, None)


# --- dimension: log size ----------------------------------------------------------------


def fill_log(directory: Path, nbytes: int, segment_bytes: int = GIB) -> None:
    """``nbytes`` of valid records in ``directory`` (segments of ``segment_bytes``), flushed."""
    chunk = batch_body(16, 64 * 1024 - 64)
    log_ = PartitionLog(directory, max_segment_size=segment_bytes)
    for _ in range(max(1, nbytes // len(chunk))):
        log_.append(chunk)
    log_.flush()
    log_.close()


def ensure_room(nbytes: int, where: Path) -> None:
    free = shutil.disk_usage(where).free
    if free - nbytes < KEEP_FREE_BYTES:
        raise SystemExit(f"not enough free disk for {nbytes / GIB:.0f} GiB under {where}: {free / GIB:.0f} GiB free,"
                         f" {KEEP_FREE_BYTES / GIB:.0f} GiB must stay free")


def log_row(work: Path, gib: int, spread: int) -> dict[str, Any]:
    ensure_room(gib * GIB, work)
    row: dict[str, Any] = {"log_gib": gib, "partitions": spread}
    broker = BrokerProcess(work, "127.0.0.1:1", 0, topics={TOPIC: spread}, zookeeper=NO_ZK, name=f"log-{gib}-{spread}")
    started = time.monotonic()
    for partition in range(spread):
        fill_log(broker.dir / "data" / f"{TOPIC}-{partition}", gib * GIB // spread)
    row["fill_mb_s"] = round(gib * GIB / (time.monotonic() - started) / 1e6)
    try:
        for case in ("first_start", "restart_after_clean_stop", "restart_after_kill9"):
            if case == "restart_after_clean_stop":
                broker.stop()
            elif case == "restart_after_kill9":
                broker.kill()
            started = time.monotonic()
            broker.start(wait=False)
            row[f"{case}_s"] = timed(lambda: port_accepts(*broker.address), interval=0.02)
            time.sleep(2)
            row[f"{case}_rss_mib"] = round(rss_mib(broker.pid), 1)  # type: ignore[arg-type]
        row["fds"] = open_fds(broker.pid)  # type: ignore[arg-type]
    finally:
        broker.stop()
        shutil.rmtree(broker.dir, ignore_errors=True)
    return row


# --- dimension: catch-up ----------------------------------------------------------------


def read_files_mb_s(paths: list[Path]) -> float:
    """``cat`` of the files to /dev/null."""
    total = sum(p.stat().st_size for p in paths)
    started = time.monotonic()
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)
    return round(total / (time.monotonic() - started) / 1e6)


def loopback_mb_s(paths: list[Path]) -> float:
    """The same files sent over a loopback TCP connection with ``sendfile``, read and dropped."""
    server = socket.create_server(("127.0.0.1", 0))
    total = sum(p.stat().st_size for p in paths)
    received = [0]

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(1 << 20):
                received[0] += len(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    started = time.monotonic()
    with socket.create_connection(server.getsockname()) as sender:
        for path in paths:
            with open(path, "rb") as f:
                sender.sendfile(f)
    reader.join()
    server.close()
    assert received[0] == total
    return round(total / (time.monotonic() - started) / 1e6)


def catchup_row(work: Path, gib: int) -> dict[str, Any]:
    ensure_room(2 * gib * GIB, work)
    row: dict[str, Any] = {"catchup_gib": gib}
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    zk.start()
    factory = BrokerFactory(work, zk.connect_string, "/catchup")
    try:
        master = factory(0, {TOPIC: 1}, {}, name="M", zookeeper=ZK_SETTINGS, start=False)
        fill_log(master.dir / "data" / f"{TOPIC}-0", gib * GIB, segment_bytes=256 * 1024 * 1024)
        master.start()
        size = master.disk_log(TOPIC, 0)
        end = size[0] + len(size[1])
        del size
        slave = factory(0, {TOPIC: 1}, {}, {"slaveId": 1}, name="S", zookeeper=ZK_SETTINGS, start=False)
        slave.start(wait=False)

        def copied() -> int:
            return int(stats(slave, TOPIC).get(f"{TOPIC}-0-0", {}).get("max_offset", 0))

        # Timed from the first bytes copied (the slave's own start and registration apart).
        timed(lambda: copied() > 0, interval=0.02)
        first, started = copied(), time.monotonic()
        took = timed(lambda: copied() >= end, limit=600, interval=0.1)
        row["catchup_mb_s"] = None if took is None else round((end - first) / (time.monotonic() - started) / 1e6)
        segments = sorted((master.dir / "data" / f"{TOPIC}-0").glob("*.meta"))
        row["cat_mb_s"] = read_files_mb_s(segments)
        row["loopback_sendfile_mb_s"] = loopback_mb_s(segments)
    finally:
        factory.stop_all()
        zk.stop()
    return row


# --- dimension: connections -------------------------------------------------------------


def secured_system(directory: Path) -> tuple[dict[str, Any], Credentials]:
    from metaq.security.credentials import SecurityFile
    from metaq.security.group import write_group_secret

    directory.mkdir(parents=True, exist_ok=True)
    write_group_secret(directory / "group.secret")
    users = SecurityFile({}, str(directory / "security.ini"))
    users.add_user("bench", "bench-password", produce="*", consume="*")
    users.save()
    system = {"securityEnabled": "true", "securityConfig": str(directory / "security.ini"),
              "groupSecretFile": str(directory / "group.secret")}
    return system, Credentials("bench", "bench-password")


async def hold_connections(port: int, count: int, credentials: Credentials) -> list[BrokerConnection]:
    held: list[BrokerConnection] = []
    for start in range(0, count, 100):
        held += await asyncio.gather(*(credentials.open("127.0.0.1", port, timeout=60) for _ in range(start, min(count, start + 100))))
    return held


def connections_rows(work: Path, sizes: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    system, credentials = secured_system(work / "security")
    most = max(sizes)
    system.update({"unflushThreshold": 0, "maxConnections": most + 100, "maxConnectionsPerAddress": most + 100})
    broker = BrokerProcess(work, "127.0.0.1:1", 0, topics={TOPIC: 4}, system=system, zookeeper=NO_ZK, name="conns")
    rows = []
    try:
        broker.start(wait_zk=False)

        async def measure(count: int) -> dict[str, Any]:
            base = await produce(broker.port, [0], args.produce_seconds, count=1, in_flight=1, credentials=credentials)
            rss_before = rss_mib(broker.pid)  # type: ignore[arg-type]
            held = await hold_connections(broker.port, count, credentials)
            try:
                await asyncio.sleep(2)
                rss_after = rss_mib(broker.pid)  # type: ignore[arg-type]
                beside = await produce(broker.port, [0], args.produce_seconds, count=1, in_flight=1, credentials=credentials)
                cpu = await asyncio.to_thread(idle_cpu, {"broker": broker.pid}, min(10.0, args.idle_seconds))  # type: ignore[dict-item]
                return {"connections": count, "rss_mib": round(rss_after, 1),
                        "kib_per_connection": round((rss_after - rss_before) * 1024 / count, 1),
                        "fds": open_fds(broker.pid),  # type: ignore[arg-type]
                        "idle_cpu_pct": cpu["broker"],
                        "put_p50_ms_alone": base["p50_ms"], "put_p99_ms_alone": base["p99_ms"],
                        "put_p50_ms": beside["p50_ms"], "put_p99_ms": beside["p99_ms"],
                        "p99_ratio": round(beside["p99_ms"] / base["p99_ms"], 2)}
            finally:
                for conn in held:
                    conn.close()
                await asyncio.sleep(1)

        for count in sizes:
            rows.append(asyncio.run(measure(count)))
    finally:
        broker.stop()
    return rows


# --- dimension: message size ------------------------------------------------------------


def dd_write_mb_s(where: Path, mib: int = 1024) -> float:
    target = where / "dd.bin"
    started = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    took = time.monotonic() - started
    target.unlink()
    return round(mib * 1024 * 1024 / took / 1e6)


def msgsize_rows(work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    zk.start()
    factory = BrokerFactory(work, zk.connect_string, "/msgsize")
    rows = []
    try:
        system = {**SYNC_PAIR, "maxMessageSize": 1024 * 1024 + 1024}
        master = factory(0, {TOPIC: 1}, system, name="A", zookeeper=ZK_SETTINGS)
        factory(0, {TOPIC: 1}, system, {"slaveId": 1}, name="B", zookeeper=ZK_SETTINGS)
        wait_until(lambda: in_sync_set(zk.connect_string, "/msgsize", 1), 60, message="the slave in the sync set")
        disk = dd_write_mb_s(work)
        for size, count, in_flight in ((100, 100, 32), (10 * 1024, 100, 8), (1024 * 1024, 4, 4)):
            result = asyncio.run(produce(master.port, [0], args.produce_seconds, count=count, size=size, in_flight=in_flight))
            rows.append({"message_bytes": size, "per_put": count, "mb_s": result["mb_s"], "p99_ms": result["p99_ms"],
                         "dd_write_mb_s": disk, "share_of_disk": round(result["mb_s"] / disk, 2)})
    finally:
        factory.stop_all()
        zk.stop()
    return rows


# --- dimension: idle cost outside replication, this code against a baseline ---------------------


def idle_rows(work: Path, partitions: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    codes = {"this": None}
    if args.baseline:
        codes["baseline"] = str(Path(args.baseline).resolve())
    brokers = {}
    for name, code in codes.items():
        broker = BrokerProcess(work, "127.0.0.1:1", 0, topics={TOPIC: partitions}, zookeeper=NO_ZK, name=f"idle-{name}")
        if code is not None:  # that checkout's package first on the broker's path
            broker.command_prefix = ["env", f"PYTHONPATH={code}"]
        brokers[name] = broker
    samples: dict[str, list[float]] = {name: [] for name in codes}
    try:
        for name, broker in brokers.items():
            broker.start(wait_zk=False, timeout=120)
            asyncio.run(put_everywhere(broker.port, partitions, PHASE_LIMIT_S))
        time.sleep(5)
        for _round in range(2):  # interleaved: A B A B
            for name, broker in brokers.items():
                samples[name].append(idle_cpu({name: broker.pid}, args.idle_seconds)[name])  # type: ignore[dict-item]
        # A put to every partition again (2,000 dirty logs, 2,000 changed transaction states),
        # then SIGTERM: how long the stop takes.
        stops: dict[str, float] = {}
        for name, broker in brokers.items():
            asyncio.run(put_everywhere(broker.port, partitions, PHASE_LIMIT_S))
            started = time.monotonic()
            broker.stop(timeout=300)
            stops[name] = round(time.monotonic() - started, 1)
    finally:
        for broker in brokers.values():
            broker.stop()
    return [{"code": name, "partitions": partitions, "idle_cpu_pct_runs": runs,
             "idle_cpu_pct_median": round(statistics.median(runs), 1), "stop_after_writes_s": stops.get(name)}
            for name, runs in samples.items()]


# --- tables -------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.2f}".rstrip("0").rstrip(".")
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    head = "| " + " | ".join(title for _key, title in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(cell(row.get(key)) for key, _title in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body])


TABLES: dict[str, list[tuple[str, str]]] = {
    "partitions": [
        ("partitions", "partitions"), ("create_s", "create (s)"), ("slave_all_replicas_s", "slave: all replicas (s)"),
        ("slave_replicas_following", "replicas following at the limit"), ("first_put_all", "partitions a first put reached"),
        ("zk_nodes", "ZK nodes"), ("zk_bytes", "ZK bytes"), ("zk_biggest_node_bytes", "biggest node (B)"),
        ("master_rss_mib", "RSS master (MiB)"), ("slave_rss_mib", "RSS slave (MiB)"), ("master_fds", "fds master"),
        ("slave_fds", "fds slave"), ("master_idle_cpu_pct", "idle CPU master (%)"), ("slave_idle_cpu_pct", "idle CPU slave (%)"),
        ("produce_one_mb_s", "produce one (MB/s)"), ("produce_all_mb_s", "produce spread (MB/s)"),
        ("produce_all_p99_ms", "spread p99 (ms)"), ("produce_failed_puts", "failed puts"),
        ("slave_restart_in_sync_set_s", "slave restart -> sync set (s)"), ("failover_took_over_s", "kill -9: slave took over (s)"), ("failover_first_ack_s", "kill -9: first ack (s)"),
        ("failover_all_served_s", "kill -9: all served (s)"), ("failover_partitions_served", "served after kill -9"),
        ("failover_flush_s", "take-over: logs flushed (s)"), ("failover_epochs_s", "take-over: epochs durable (s)"),
        ("slave_sigterm_s", "SIGTERM slave (s)"), ("master_sigterm_s", "SIGTERM master after a put to each (s)"),
    ],
    "log": [
        ("log_gib", "GiB"), ("partitions", "partitions"), ("first_start_s", "start (s)"),
        ("restart_after_clean_stop_s", "restart, clean stop (s)"), ("restart_after_kill9_s", "restart, kill -9 (s)"),
        ("restart_after_kill9_rss_mib", "RSS (MiB)"), ("fds", "fds"),
    ],
    "catchup": [("catchup_gib", "GiB"), ("catchup_mb_s", "slave catch-up (MB/s)"), ("cat_mb_s", "cat (MB/s)"),
                ("loopback_sendfile_mb_s", "loopback sendfile (MB/s)")],
    "connections": [
        ("connections", "idle connections"), ("rss_mib", "RSS (MiB)"), ("kib_per_connection", "KiB each"), ("fds", "fds"),
        ("idle_cpu_pct", "idle CPU (%)"), ("put_p50_ms_alone", "put p50 alone (ms)"), ("put_p99_ms_alone", "put p99 alone (ms)"),
        ("put_p50_ms", "put p50 beside (ms)"), ("put_p99_ms", "put p99 beside (ms)"), ("p99_ratio", "p99 ratio"),
    ],
    "msgsize": [("message_bytes", "message (B)"), ("per_put", "per put"), ("mb_s", "sync pair (MB/s)"),
                ("p99_ms", "put p99 (ms)"), ("dd_write_mb_s", "dd write (MB/s)"), ("share_of_disk", "share of disk")],
    "idle": [("code", "code"), ("partitions", "partitions"), ("idle_cpu_pct_runs", "idle CPU runs (%)"),
             ("idle_cpu_pct_median", "median (%)"), ("stop_after_writes_s", "SIGTERM after a put to each (s)")],
}


def render(results: dict[str, Any]) -> str:
    parts = [f"{results['machine']}; {results['when']}"]
    for dim, columns in TABLES.items():
        if results.get(dim):
            parts += ["", f"**{dim}**", "", table(results[dim], columns)]
    return "\n".join(parts)


def machine() -> str:
    cpus = os.cpu_count()
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // (1024 * 1024)
    load = os.getloadavg()[0]
    return f"{cpus} cores, {mem} GiB RAM, load average {load:.1f} at the start"


def sizes(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="partitions,log,catchup,connections,msgsize,idle",
                        help="which dimensions, comma-separated (default: all)")
    parser.add_argument("--partitions", type=sizes, default=[10, 100, 1000, 10000])
    parser.add_argument("--log-gib", type=sizes, default=[1, 10], help="log sizes in GiB (50 needs ~55 GB of free disk)")
    parser.add_argument("--log-spread", type=int, default=100, help="partitions the spread log case uses")
    parser.add_argument("--catchup-gib", type=int, default=2)
    parser.add_argument("--connections", type=sizes, default=[100, 1000, 10000])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--produce-seconds", type=float, default=5.0)
    parser.add_argument("--idle-partitions", type=int, default=1000, help="partitions of the idle dimension's broker")
    parser.add_argument("--baseline", help="a checkout of another version: the idle dimension runs it beside this code")
    parser.add_argument("--json", help="write the results here (JSON)")
    parser.add_argument("--dir", help="work here instead of a temporary directory (emptied at the end)")
    parser.add_argument("--table", metavar="JSON", help="only print the markdown tables of a saved run")
    args = parser.parse_args()
    if args.table:
        print(render(json.loads(Path(args.table).read_text())))
        return 0
    dims = [d.strip() for d in args.dims.split(",") if d.strip()]
    unknown = sorted(set(dims) - set(TABLES))
    if unknown:
        parser.error(f"--dims: unknown {', '.join(unknown)} (one of {', '.join(TABLES)})")
    results: dict[str, Any] = {"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "command": " ".join(sys.argv)}

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="metaq-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        for dim in dims:
            work = base / dim
            work.mkdir(parents=True, exist_ok=True)
            if dim == "partitions":
                results[dim] = []
                for count in args.partitions:
                    try:
                        results[dim].append(partitions_row(work / str(count), count, args))
                    except Exception as exc:  # recorded, and the run goes on with the next size
                        results[dim].append({"partitions": count, "error": repr(exc)})
                    print(json.dumps(results[dim][-1]), flush=True)
                    save()
                    shutil.rmtree(work / str(count), ignore_errors=True)
            elif dim == "log":
                results[dim] = []
                for gib in args.log_gib:
                    for spread in (1, args.log_spread):
                        results[dim].append(log_row(work, gib, spread))
                        print(json.dumps(results[dim][-1]), flush=True)
                        save()
            elif dim == "catchup":
                results[dim] = [catchup_row(work, args.catchup_gib)]
            elif dim == "connections":
                results[dim] = connections_rows(work, args.connections, args)
            elif dim == "msgsize":
                results[dim] = msgsize_rows(work, args)
            elif dim == "idle":
                results[dim] = idle_rows(work, args.idle_partitions, args)
            print(json.dumps({dim: results[dim]}), flush=True)
            save()
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
