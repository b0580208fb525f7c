"""The master's check that each registered slave replicates every partition it serves.

A slave copies each partition on its own (metaq/ha/follower.py): one that stopped a replica
(a diverged reply), never started one (a topic added while it crawled through its start, a
partition it does not know), or stopped fetching it, still heartbeats and still counts as a
slave for everything else. An async pair then replicates a subset and nothing says so; after a
failover the partitions it lacked come back empty or old. So the master, once per
``CHECK_INTERVAL_S`` (one timer per broker, not one per partition), compares what it serves
with what each slave registered in ZooKeeper has told it, through its fetches and heartbeats
(``ReplicationProgress``):

* a partition with no position from the slave at all, ``notReplicatingAfterMs`` after the
  slave registered and after the partition was first served: the slave has no replica of it;
* a partition the slave is behind on whose position has not moved for ``notReplicatingAfterMs``:
  its replica stopped.

What it finds is counted per slave (``ReplicaCoverage.missing``: stats ``not_replicated
slave{k}``, metric ``metaq_partitions_not_replicated``) and logged as a warning when it
changes. The master cannot see a stopped replica of a partition that takes no writes (its
position is the log end); the slave's own stats say that, and ``metaq cluster`` reads both
(metaq/cli/cluster.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 5.0
#: Partition names a log line lists before "and N more".
NAMES_IN_LOG = 10


class ReplicaCoverage:
    """Which served partitions each registered slave does not replicate (the master's view).

    Owned by the broker; ``check`` runs on the event loop. State is bounded by the group's
    slaves and the partitions served: entries of slaves that left and partitions no longer
    served are dropped at each check.
    """

    def __init__(self, broker: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker  # the Broker (broker.py imports this module)
        self._clock = clock
        #: slave id -> names (``{topic}-{brokerId}-{n}``) of the partitions it does not replicate.
        self.missing: dict[int, list[str]] = {}
        self._slave_seen: dict[int, float] = {}
        self._partition_seen: dict[tuple[str, int], float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="replica coverage")

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                self.check()
            except Exception:  # a health check must outlive one odd state
                log.exception("replica coverage check failed")

    def check(self) -> None:
        broker = self.broker
        registry = broker.registry
        now = self._clock()
        if registry is None or not broker.ha.acting_master:
            self._slave_seen.clear()
            self.missing = {}  # only a master judges; it starts again when it leads
            return
        after_s = broker.config.not_replicating_after_ms / 1000
        logs = broker.store.logs()
        self._partition_seen = {key: self._partition_seen.get(key, now) for key in logs}
        slaves = sorted(registry.slave_ids)
        self._slave_seen = {k: self._slave_seen.get(k, now) for k in slaves}
        positions = broker.ha.progress.positions
        found: dict[int, list[str]] = {}
        for slave_id in slaves:
            if now - self._slave_seen[slave_id] < after_s:
                continue
            lacking = []
            for (topic, partition), log_ in sorted(logs.items()):
                position = positions.get((slave_id, topic, partition))
                if position is None:
                    judged = now - self._partition_seen[(topic, partition)] >= after_s
                else:
                    judged = position.log_end < log_.log_end and now - position.updated_at >= after_s
                if judged:
                    lacking.append(f"{topic}-{broker.config.broker_id}-{partition}")
            if lacking:
                found[slave_id] = lacking
        self._report(found)

    def _report(self, found: dict[int, list[str]]) -> None:
        served = len(self._partition_seen)
        for slave_id in sorted(set(found) | set(self.missing)):
            now_lacking, before = found.get(slave_id, []), self.missing.get(slave_id, [])
            if now_lacking == before:
                continue
            if now_lacking:
                shown = ", ".join(now_lacking[:NAMES_IN_LOG])
                more = f" and {len(now_lacking) - NAMES_IN_LOG} more" if len(now_lacking) > NAMES_IN_LOG else ""
                log.warning(
                    "slave%d is not replicating %d of %d partition(s): %s%s (no position from it, or none moving while"
                    " it is behind, for %d ms: notReplicatingAfterMs); a failover to it would lose them"
                    " (metaq cluster shows why, from the slave's stats)",
                    slave_id, len(now_lacking), served, shown, more, self.broker.config.not_replicating_after_ms,
                )
            else:
                log.info("slave%d replicates every partition again", slave_id)
        self.missing = found

    def status_pairs(self) -> list[tuple[str, Any]]:
        return [(f"not_replicated slave{slave_id}", {"count": len(names), "partitions": ",".join(names)})
                for slave_id, names in sorted(self.missing.items())]
