"""The brokers' CPU per put under blocking sends, from /proc, on the pairs of bench/vs_redis.py.

    python bench/put_cpu.py                     # 6,000 blocking send_message per pair
    python bench/put_cpu.py --batch 100         # send_batch of 100 instead
    python bench/put_cpu.py --py-spy OUT        # also py-spy (raw text) of each broker and this client, OUT-<pair>-<process>.txt

Starts what ``vs_redis.py`` starts of metaq (an embedded ZooKeeper, an async pair and a sync
pair, default flush policy), warms each pair up with 500 sends, then times ``--n`` blocking
sends one at a time and reads each broker's ``utime + stime`` from ``/proc/PID/stat`` before
and after: the CPU each broker (and this client process) spent per put (the user part in
brackets), the rate and the median send. The machine's other load counts in neither broker's CPU, but it does in the
rate; compare CPU per put across changes, interleaving runs. Also the master's replica fetches
answered with data per put (its ``replica_get_requests`` stat): 1 on a sync pair, a fraction on
an async pair, whose slave waits a moment after a small reply (docs/replication.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_redis import TOPIC, MetaqPairs, with_selector  # noqa: E402

from metaq.client import Message, MessageSessionFactory  # noqa: E402
from metaq.client.connection import BrokerConnection  # noqa: E402
from metaq.protocol.replies import fetch_stats  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def replica_fetches(address: tuple[str, int]) -> int:
    """A master's replica fetches answered with data so far."""

    async def ask() -> int:
        conn = await BrokerConnection.open(*address)
        try:
            return int((await fetch_stats(conn)).get("replica_get_requests", 0))
        finally:
            conn.close()

    return asyncio.run(ask())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000, help="timed sends per pair")
    parser.add_argument("--batch", type=int, default=1, help="messages per send (1: send_message)")
    parser.add_argument("--py-spy", metavar="OUT", help="record each broker and this client with py-spy into OUT-<pair>-<process>.txt")
    parser.add_argument("--replication-stream", action="store_true",
                        help="the sync master pushes puts to its slave (replicationStream=true)")
    args = parser.parse_args(argv)
    pairs = MetaqPairs(Path(tempfile.mkdtemp(prefix="put-cpu-")), replication_stream=args.replication_stream).start()
    payload = b"x" * 100
    try:
        with MessageSessionFactory(pairs.config()) as factory:
            for group, mode in ((0, "async"), (1, "sync")):
                master, slave = pairs.processes[2 * group], pairs.processes[2 * group + 1]
                with factory.create_producer(with_selector(group)) as producer:
                    producer.publish(TOPIC)

                    def send() -> None:
                        if args.batch == 1:
                            result = producer.send_message(Message(TOPIC, payload))
                        else:
                            result = producer.send_batch([Message(TOPIC, payload) for _ in range(args.batch)])[-1]
                        assert result.success, result

                    for _ in range(500):
                        send()
                    spies = []
                    if args.py_spy:
                        for name, pid in (("master", master.pid), ("slave", slave.pid), ("client", os.getpid())):
                            spies.append(subprocess.Popen(
                                ["py-spy", "record", "--nonblocking", "-r", "500", "--format", "raw",
                                 "-o", f"{args.py_spy}-{mode}-{name}.txt", "--pid", str(pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                        time.sleep(1.5)  # attached before the clock starts
                    fetched = replica_fetches(master.address)
                    before = cpu_seconds(master.pid), cpu_seconds(slave.pid), cpu_seconds(os.getpid())
                    sends: list[float] = []
                    started = time.perf_counter()
                    for _ in range(args.n):
                        sent = time.perf_counter()
                        send()
                        sends.append(time.perf_counter() - sent)
                    elapsed = time.perf_counter() - started
                    after = cpu_seconds(master.pid), cpu_seconds(slave.pid), cpu_seconds(os.getpid())
                    for spy in spies:
                        spy.send_signal(2)  # py-spy writes its file on SIGINT
                        spy.wait(30)
                    fetches = (replica_fetches(master.address) - fetched) / args.n
                    per_put = [(1e6 * (sum(a) - sum(b)) / args.n, 1e6 * (a[0] - b[0]) / args.n) for a, b in zip(after, before)]
                    sends.sort()
                    print(f"{mode} pair: {args.n * args.batch / elapsed:,.0f} msgs/s, send p50 {sends[len(sends) // 2] * 1e3:.3f} ms;"
                          f" CPU per put: master {per_put[0][0]:.0f} us (user {per_put[0][1]:.0f}),"
                          f" slave {per_put[1][0]:.0f} us (user {per_put[1][1]:.0f}),"
                          f" client {per_put[2][0]:.0f} us (user {per_put[2][1]:.0f});"
                          f" replica fetches per put {fetches:.3f}", flush=True)
    finally:
        pairs.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
