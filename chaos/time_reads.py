"""The time-read prober (``python -m chaos run --time-reads``): ``offset_for_time`` under faults.

Every replica of a group (master and slaves, as the monitor knows them) is asked, for every
partition of the workload's topic, "the first offset whose record time is >= T" (the
``offset_for_time`` request, docs/storage.md "Time index"), about every 0.3 s. The times T
come from the run itself: the msg-id time of a put acked earlier in the history (exactly, and
one millisecond later: both edges of a record), and a random time between a little before
the first acked put and a little after now (before every record, between records, past the
end). Each answer is one ``time_read`` operation of the history (chaos/history.py); the
``time_reads`` check (chaos/checker.py) judges it against the final logs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Any

from metaq.client.connection import BrokerConnection, ConnectionClosed
from metaq.protocol.messages import OffsetForTimeRequest
from metaq.protocol.replies import OffsetForTimeReply
from metaq.store.msgid import msg_id_timestamp_ms

from .history import group_of

#: How long before the first acked put (and after now) a random time may fall, in ms.
RANDOM_MARGIN_MS = 2000


class TimeReadProber:
    """One group's prober; ``workload`` is the run's ``chaos.runner.Workload``."""

    def __init__(self, workload: Any, group: int, every: float = 0.3) -> None:
        self.workload = workload
        self.group = group
        self.every = every
        self.rng = random.Random(f"time-reads/{group}/{workload.seed}")
        self.acked_times: dict[str, list[int]] = defaultdict(list)  # partition -> msg-id times of acked puts
        self._seen = 0  # how many history ops were scanned for acked puts

    def _learn_acked_times(self) -> None:
        ops = self.workload.history.ops[self._seen:]  # a slice of a list: safe beside appending threads
        self._seen += len(ops)
        for op in ops:
            if (op.get("f") == "put" and op["type"] == "ok" and isinstance(op.get("msg_id"), int)
                    and group_of(op.get("partition")) == self.group):
                self.acked_times[op["partition"]].append(msg_id_timestamp_ms(op["msg_id"]))

    def times_to_ask(self, partition: str) -> list[int]:
        """An acked record's time, or one millisecond past it, and one random time."""
        known = self.acked_times.get(partition)
        now_ms = time.time_ns() // 1_000_000
        times = []
        if known:
            times.append(self.rng.choice(known) + self.rng.choice((0, 1)))
        low = (min(known[0], now_ms) if known else now_ms) - RANDOM_MARGIN_MS
        times.append(self.rng.randint(low, now_ms + RANDOM_MARGIN_MS))
        return times

    async def _ask(self, conns: dict[str, BrokerConnection], url: str, n: int, time_ms: int) -> bool:
        """One ``offset_for_time``, recorded; False when the connection is gone."""
        partition = f"{self.workload.cluster.topic}/{self.group}-{n}"
        history = self.workload.history
        op = history.invoke(f"time-g{self.group}", "time_read", None, partition, replica=url, time_ms=time_ms)
        try:
            conn = await self.workload._cached_conn(conns, url)
            request = OffsetForTimeRequest(topic=self.workload.cluster.topic, partition=n, time_ms=time_ms)
            reply = await conn.request(request.to_header(), timeout=1.0)
        except (ConnectionClosed, asyncio.TimeoutError, OSError) as exc:
            conns.pop(url, None)
            history.info(op, f"no answer: {exc!r}")
            return False
        if not reply.ok:
            history.fail(op, f"{reply.code} {reply.message}")
            return True
        try:
            answer = OffsetForTimeReply.of(reply)
        except Exception as exc:  # a malformed answer is recorded, never trusted
            history.info(op, f"malformed answer: {exc}")
            return True
        history.ok(op, answer.offset, partition=partition, latest=answer.latest,
                   min_offset=answer.min_offset, max_offset=answer.max_offset)
        return True

    async def run(self) -> None:
        w = self.workload
        conns: dict[str, BrokerConnection] = {}
        while not w.stopping.is_set():
            self._learn_acked_times()
            for url in list(w.monitor.replicas.get(self.group, [])):
                for n in range(w.cluster.partitions):
                    partition = f"{w.cluster.topic}/{self.group}-{n}"
                    for time_ms in self.times_to_ask(partition):
                        if w.stopping.is_set() or not await self._ask(conns, url, n, time_ms):
                            break
            await asyncio.sleep(self.every)
        for conn in conns.values():
            conn.close()
