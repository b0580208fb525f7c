"""A logged-in producer's put latency while another user floods the broker with transaction starts.

    python bench/txn_start_flood.py [--starts N]

One secured master (``securityEnabled=true``, an embedded ZooKeeper, the users of
tests/integration/trust_support.py). ``app`` sends 300 puts of 100 B one at a time, first
on a quiet broker, then while a user pipelines N (default 20,000) ``transaction start``
requests on one connection: ``reader`` (consume rights only) and ``rival`` (produce
rights, so its starts count against ``maxOpenTransactionsPerUser``). Prints the put
latencies of each phase and how the starts were answered (code, xa_code: count).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.client import Message  # noqa: E402
from metaq.client.codec import encode_messages  # noqa: E402
from metaq.protocol.messages import PutRequest, TransactionRequest  # noqa: E402
from metaq.tools.launcher import BrokerFactory, BrokerProcess  # noqa: E402
from metaq.zk.embedded import EmbeddedZooKeeper  # noqa: E402
from tests.integration.trust_support import SecuredGroup, open_as  # noqa: E402

TOPIC = "t"
PUTS = 300


async def put_latencies(broker: BrokerProcess) -> tuple[list[float], Counter[int]]:
    """Milliseconds per put of ``app``, and the reply codes."""
    conn = await open_as(broker, "app")
    body, _ = encode_messages([Message(TOPIC, b"x" * 100)])
    header = PutRequest(topic=TOPIC, partition=0, count=1).to_header()
    latencies, codes = [], Counter[int]()
    try:
        for _ in range(PUTS):
            started = time.perf_counter()
            reply = await conn.request(header, body, timeout=60)
            latencies.append((time.perf_counter() - started) * 1000)
            codes[reply.code] += 1
    finally:
        conn.close()
    return latencies, codes


async def flood(broker: BrokerProcess, user: str, starts: int) -> tuple[float, Counter[tuple[int, int | None]]]:
    """``starts`` pipelined starts by ``user``: seconds until all were answered, and their answers."""
    conn = await open_as(broker, user)
    started = time.perf_counter()
    try:
        replies = await asyncio.gather(*(
            conn.request(TransactionRequest(action="start", xid=f"TX:{user}:{n}").to_header(), timeout=600)
            for n in range(starts)))
    finally:
        conn.close()
    return time.perf_counter() - started, Counter((r.code, r.header.get("xa_code")) for r in replies)


async def under_flood(broker: BrokerProcess, user: str, starts: int) -> str:
    flooding = asyncio.ensure_future(flood(broker, user, starts))
    await asyncio.sleep(0.05)  # the flood's first requests are in
    latencies, codes = await put_latencies(broker)
    took, answers = await flooding
    return f"{starts} starts by {user}, answered in {took:.1f} s {dict(answers)}: puts {summary(latencies, codes)}"


def summary(latencies: list[float], codes: Counter[int]) -> str:
    ordered = sorted(latencies)
    return (f"median {statistics.median(ordered):.2f} ms, p99 {ordered[int(len(ordered) * 0.99) - 1]:.2f} ms, "
            f"max {ordered[-1]:.1f} ms, codes {dict(codes)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="txn-start-flood-"))
    zk = EmbeddedZooKeeper(data_dir=work / "zookeeper", tick_ms=200)
    zk.start()
    factory = BrokerFactory(work, zk.connect_string, f"/meta-{uuid.uuid4().hex[:8]}")
    try:
        broker = factory(0, {TOPIC: 1}, SecuredGroup(work / "security").system)
        print("quiet:", summary(*asyncio.run(put_latencies(broker))))
        for user in ("reader", "rival"):
            print(asyncio.run(under_flood(broker, user, args.starts)))
    finally:
        factory.stop_all()
        zk.stop()


if __name__ == "__main__":
    main()
