"""Creating N partition logs and a takeover's epochs: one by one on the event loop vs batched.

    python bench/startup_batch.py --partitions 2000 10000 --rounds 3

In one process, on a fresh directory under the temporary directory's file system, per count:

* ``create``: every partition's empty log, one ``get_or_create_log`` after another on the event
  loop (how a slave created them before) vs ``MessageStoreManager.create_logs`` (one batch in a
  worker thread);
* ``epochs``: a new epoch saved for every partition, one ``EpochCache.save`` after another on
  the loop vs one batch in a worker thread with an fsync per file and per directory (how a
  takeover saved them before) vs ``Partitions.assign_epoch`` (the batch made durable by one
  ``syncfs`` per file system where that is trustworthy, metaq/store/batch_sync.py).

Each is shown as wall seconds and the longest the event loop went without running a 10 ms
ticker (what a ZooKeeper session or a client waits meanwhile), the median of ``--rounds``
rounds. Both ways run side by side in each round; the machine's other load counts in the times.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package

from metaq.config import TopicConfig  # noqa: E402
from metaq.ha.epochs import EpochCache  # noqa: E402
from metaq.private_files import write_private_temporary  # noqa: E402
from metaq.server.partitions import Partitions  # noqa: E402
from metaq.store.batch_sync import fsync_all  # noqa: E402
from metaq.store.manager import MessageStoreManager  # noqa: E402

TOPIC_PARTITIONS = 250


def _save_all_fsync_each(caches: list[EpochCache]) -> None:
    temporaries = {cache.path: write_private_temporary(cache.path, cache._text(), fsync=False) for cache in caches}
    fsync_all(temporaries.values())
    for path, tmp in temporaries.items():
        os.replace(tmp, path)
    fsync_all(path.parent for path in temporaries)


def store_of(root: Path, partitions: int) -> MessageStoreManager:
    topics = {f"scale{n}": TopicConfig(name=f"scale{n}", data_path=str(root), num_partitions=TOPIC_PARTITIONS,
                                       incarnation=f"life{n}") for n in range(max(1, partitions // TOPIC_PARTITIONS))}
    return MessageStoreManager(topics, max_message_size=1 << 20)


async def timed(work) -> tuple[float, float]:  # noqa: ANN001
    """(wall seconds, longest event-loop stall in seconds) of awaiting ``work()``."""
    longest = 0.0
    running = True

    async def ticker() -> None:
        nonlocal longest
        last = time.monotonic()
        while running:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            longest = max(longest, now - last - 0.01)
            last = now

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.05)  # the ticker is running before the work starts
    began = time.monotonic()
    await work()
    wall = time.monotonic() - began
    running = False
    await task
    return wall, longest


async def one_round(partitions: int, root: Path) -> dict[str, tuple[float, float]]:
    one_by_one, batched = store_of(root / "one", partitions), store_of(root / "batch", partitions)
    keys = [(name, p) for name, topic in one_by_one.topics.items() for p in range(topic.num_partitions)]

    async def create_one_by_one() -> None:
        for key in keys:
            one_by_one.get_or_create_log(*key)

    async def create_batched() -> None:
        await batched.create_logs([(*key, 0) for key in keys])

    owners, batch_owners = Partitions(one_by_one), Partitions(batched)

    async def epochs_one_by_one() -> None:
        for key in keys:
            owner = owners.get(*key)
            owner.epochs.assign(1, owner.log.log_end)
            owner.epochs.save()

    async def epochs_batched_fsync_each() -> None:
        """The batch as it was before ``FileSystemSync``: every file, then every directory, fsynced."""
        caches = []
        for key in keys:
            owner = owners.get(*key)
            if owner.epochs.assign(2, owner.log.log_end):
                caches.append(owner.epochs)
        await asyncio.to_thread(_save_all_fsync_each, caches)

    figures = {
        "create, one by one": await timed(create_one_by_one),
        "create, batched": await timed(create_batched),
        "epochs, one by one": await timed(epochs_one_by_one),
        "epochs, batched, fsync each": await timed(epochs_batched_fsync_each),
    }
    await batch_owners.assign_epoch(batched.topics, 1)  # untimed: files to rename over, as the other store has
    figures["epochs, batched, syncfs"] = await timed(lambda: batch_owners.assign_epoch(batched.topics, 2))
    one_by_one.close()
    batched.close()
    return figures


def measure(partitions: int, rounds: int) -> dict[str, str]:
    """Medians over ``rounds`` rounds, each on fresh directories."""
    runs = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as work:
            runs.append(asyncio.run(one_round(partitions, Path(work))))
    row = {"partitions": f"{partitions:,}"}
    for name in runs[0]:
        wall, stall = (statistics.median(run[name][i] for run in runs) for i in (0, 1))
        row[name] = f"{wall:.1f} s (loop stalled {stall:.2f} s)"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[2000])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per count; medians are shown (default 3)")
    args = parser.parse_args()
    rows = []
    for partitions in args.partitions:
        rows.append(measure(partitions, args.rounds))
        print(rows[-1], flush=True)
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(row.values()) + " |")


if __name__ == "__main__":
    main()
