"""The client side of bench/vs_redis.py's per-message ``send_message_async`` row, round by round.

    python bench/async_sends.py                   # 5 rounds of 200,000 sends, 1,000 outstanding
    python bench/async_sends.py --profile OUT     # also a cProfile of the last round into OUT

Starts what ``vs_redis.py`` starts of metaq (an embedded ZooKeeper, an async pair and a sync
pair, default flush policy) and runs its workload on the async pair: ``send_message_async``
per message with 1,000 outstanding, each result's callback sending the next. Per round: the
rate; the puts and how many messages each carried; the cyclic garbage collector's
collections (per generation) and the time they took in this process; and the CPU per
message (``utime + stime`` from ``/proc``, the user part in brackets) of this client, the
master and the slave. The machine's other load is in the rate, not in the CPU figures:
compare CPU per message across changes, interleaving runs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from put_cpu import cpu_seconds  # noqa: E402
from vs_redis import MetaqPairs, metaq_async_per_message  # noqa: E402

from metaq.client.producer import AsyncMessageProducer  # noqa: E402


class PutSizes:
    """Messages per put, counted around the producer's put (its retries included)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        original = AsyncMessageProducer._send_chunk

        async def counted(producer, topic, partition, messages, timeout=None):  # type: ignore[no-untyped-def]
            self.sizes.append(len(messages))
            return await original(producer, topic, partition, messages, timeout)

        AsyncMessageProducer._send_chunk = counted  # type: ignore[method-assign]


class Collections:
    """The cyclic GC's collections per generation, and their time, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._started

    def reset(self) -> None:
        self.count, self.seconds = [0, 0, 0], 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=200_000, help="sends per round")
    parser.add_argument("--outstanding", type=int, default=1000)
    parser.add_argument("--profile", metavar="OUT", help="cProfile the last round into OUT (pstats format)")
    args = parser.parse_args(argv)
    puts, collections = PutSizes(), Collections()
    work = Path(tempfile.mkdtemp(prefix="async-sends-"))
    pairs = MetaqPairs(work).start()
    processes = (("client", os.getpid()), ("master", pairs.processes[0].pid), ("slave", pairs.processes[1].pid))
    payload = b"x" * 100
    rates = []
    try:
        for round_no in range(args.rounds):
            puts.sizes.clear()
            collections.reset()
            profile = cProfile.Profile() if args.profile and round_no == args.rounds - 1 else None
            before = [cpu_seconds(pid) for _, pid in processes]
            if profile is not None:
                profile.enable()
            rate = asyncio.run(metaq_async_per_message(pairs.config(), 0, args.n, payload, args.outstanding))
            if profile is not None:
                profile.disable()
                profile.dump_stats(args.profile)
            after = [cpu_seconds(pid) for _, pid in processes]
            rates.append(rate)
            cpu = ", ".join(f"{name} {1e6 * (sum(a) - sum(b)) / args.n:.2f} ({1e6 * (a[0] - b[0]) / args.n:.2f})"
                            for (name, _), a, b in zip(processes, after, before))
            print(f"round {round_no}: {rate:,.0f} msgs/s; {len(puts.sizes)} puts of {statistics.mean(puts.sizes):,.0f}"
                  f" messages (median {statistics.median(puts.sizes):,.0f}); GC collections {collections.count}"
                  f" in {collections.seconds * 1000:.1f} ms; CPU us per message: {cpu}", flush=True)
    finally:
        pairs.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"median {statistics.median(rates):,.0f} msgs/s over {len(rates)} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
