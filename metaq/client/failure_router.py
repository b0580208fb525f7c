"""Where a failed message goes: the consumer's side of the group's retry and dead-letter topics.

The names, the envelope and the partition choice are in retry_topics.py (its docstring is
the theory of operation); this module sends (``FailureRouter.send_back``) and, when they are
missing, creates the topics in the broker group's topic configuration (``_ensure``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from .cluster import Cluster
from .config import ConsumerConfig, MetaClientConfig
from .message import Message, Partition
from .pool import ConnectionPool
from .producer import AsyncMessageProducer
from .retry_topics import FailurePolicy, RetryPartitionSelector

log = logging.getLogger(__name__)

Wait = Callable[[Awaitable[Any]], Awaitable[Any]]


class FailureTopicsMissing(Exception):
    """A retry or dead-letter topic is not there and this client may not (or cannot) create it."""


def _create_topics(client: Any, paths: Any, broker_id: int, wanted: dict[str, int], group: str) -> list[str]:
    """Add the missing ones of ``wanted`` (topic -> partitions) to a broker group's topic configuration."""
    from kazoo.exceptions import NoAuthError

    from ..zk.topic_config import update_group_topics

    created: list[str] = []

    def change(current: Any) -> Any:
        created.clear()
        if not current.exists:
            # A member serving server.ini topics would drop them for a configuration naming only ours.
            raise FailureTopicsMissing(f"broker group {broker_id} has no topic configuration in ZooKeeper "
                                       f"({paths.topic_config(broker_id)}): add {', '.join(wanted)} to its masters' server.ini")
        updated = current
        for topic, partitions in wanted.items():
            if topic not in current.topics:
                updated = updated.with_topic(topic, {"numPartitions": str(partitions)})
                created.append(topic)
        return updated if created else None

    try:
        update_group_topics(client, paths, broker_id, change)
    except NoAuthError:
        raise FailureTopicsMissing(
            f"group {group}: broker group {broker_id} lacks {' and '.join(wanted)} and this client may not create them "
            f"(ZooKeeper refused the write of {paths.topic_config(broker_id)}: a secured group's topic configuration "
            f"takes only its credentials); create them: metaq topics create --broker-id {broker_id} --topic T "
            f"--partitions N --group-secret FILE (see docs/client.md, 'Failed messages'), or use failure_store='local'"
        ) from None
    return created


class FailureRouter:
    """Sends failed messages back to the group's retry topic or on to its dead-letter topic.

    One per consumer. Its producer sends with the consumer's factory settings (credentials,
    idempotence); a send that fails is tried again, waiting on the fetcher's cancellable
    wait, until it is stored: the partition does not move past a message before that.
    """

    def __init__(self, cluster: Cluster, pool: ConnectionPool, client_config: MetaClientConfig,
                 config: ConsumerConfig, stats: Any) -> None:
        self.cluster = cluster
        self.config = config
        self.stats = stats
        self.policy = FailurePolicy.of(config)
        self.retry_topic, self.dlq_topic = self.policy.retry_topic, self.policy.dlq_topic
        self.producer: AsyncMessageProducer = AsyncMessageProducer(cluster, pool, client_config, RetryPartitionSelector())
        self._reported: str | None = None  # the last failure logged (once, not per try)

    async def send_back(self, message: Message, error: BaseException | str, attempts: int, wait: Wait) -> None:
        """Store delivery ``attempts``'s failure of ``message``; returns once a master acked it.

        ``wait(awaitable)`` is the fetcher's cancellable wait: a rebalance or shutdown stops
        here, and the partition's position stays at the message.
        """
        topic, wrapped = self.policy.envelope(message, error, attempts)
        backoff = self.config.fetch_retry_min_s
        while True:
            problem = await self._ensure(message.partition)
            if problem is None:
                result = await wait(self.producer.send_message(wrapped))
                if result.success:
                    break
                problem = f"cannot store it in {topic}: {result.error_message}"
            self.stats.failure_send_errors += 1
            line = (f"group {self.config.group}: the failed message {message.topic}-{message.partition}@{message.offset} "
                    f"waits (its partition does not move): {problem}")
            if line != self._reported:
                self._reported = line
                log.log(logging.INFO if problem.startswith("waiting") else logging.ERROR, "%s", line)
            await wait(asyncio.sleep(backoff))
            backoff = min(backoff * 2, self.config.fetch_retry_max_s)
        self._reported = None
        if topic == self.dlq_topic:
            self.stats.dead_lettered += 1
            log.error("group %s: %s-%s@%s failed %d deliveries; moved to the dead-letter topic %s (last error: %s)",
                      self.config.group, message.topic, message.partition, message.offset, attempts, topic, error)
        else:
            self.stats.retried += 1
            log.warning("group %s: %s-%s@%s failed delivery %d; retried through %s in %.3g s", self.config.group,
                        message.topic, message.partition, message.offset, attempts, topic, self.policy.delay_ms(attempts) / 1000)

    async def _ensure(self, partition: Partition | None) -> str | None:
        """None while both topics are served in the original partition's broker group; else why not.

        Asked before every send (a look at the cluster snapshot): a topic an operator deleted
        is created again at the next failure, as at the first.
        """
        broker_id = partition.broker_id if partition is not None else 0
        for topic in (self.retry_topic, self.dlq_topic):
            await self.cluster.watch_topic(topic, publish=True)  # a no-op once watched
        snapshot = self.cluster.snapshot
        have = {t: any(p.broker_id == broker_id for p in snapshot.writable_partitions(t)) for t in (self.retry_topic, self.dlq_topic)}
        if all(have.values()):
            return None
        missing = " and ".join(t for t, ok in have.items() if not ok)
        if not self.config.auto_create_failure_topics:
            return (f"broker group {broker_id} serves no {missing} (auto_create_failure_topics is off): create them with "
                    f"metaq topics create, see docs/client.md 'Failed messages'")
        wanted = {self.retry_topic: self.policy.retry_partitions, self.dlq_topic: 1}
        try:
            created = await self.cluster.call(_create_topics, self.cluster.zk, self.cluster.paths, broker_id, wanted, self.config.group)
        except FailureTopicsMissing as exc:
            return str(exc)
        except Exception as exc:  # ZooKeeper busy: tried again at the next try
            return f"cannot create {missing} in broker group {broker_id}: {exc!r}"
        if created:
            log.warning("group %s: created %s in broker group %d (partitions: %s)", self.config.group, ", ".join(created),
                        broker_id, ", ".join(str(wanted[t]) for t in created))
        await self.cluster.refresh()
        return f"waiting for broker group {broker_id}'s master to serve {missing}"

    async def close(self) -> None:
        await self.producer.close()
