"""What the HA layer needs from the broker it runs in, and nothing more.

The HA layer (coordinator, follower, sync set) never imports the server: it sees
the broker through these protocols, so the dependency points one way
(``server`` -> ``ha``) and each side can be read, and tested, alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from kazoo.client import KazooClient

from ..config import BrokerConfig, TopicConfig
from ..security.settings import BrokerSecurity
from ..zk.acl import ZkSecurity
from .epochs import EpochCache
from .record import ReplicationRecord


class LogStore(Protocol):
    """The broker's partition logs (metaq.store.manager.MessageStoreManager)."""

    def get_log(self, topic: str, partition: int) -> Any: ...

    def has_log(self, topic: str, partition: int) -> bool: ...

    def get_or_create_log(self, topic: str, partition: int, start_offset: int = 0) -> Any: ...

    def logs(self) -> dict[tuple[str, int], Any]: ...

    def flusher(self, topic: str, partition: int) -> Any: ...


class LogReader(Protocol):
    """A partition log as its readers see it (metaq.store.log.PartitionLog, read-only): no
    ``append``, ``truncate_to`` or ``repair_corrupt`` here. Those are called only by the
    partition's owner (metaq.server.partitions.Partition); tests/unit/test_log_writers.py
    fails if any other module calls them."""

    @property
    def log_end(self) -> int: ...

    @property
    def min_offset(self) -> int: ...

    @property
    def flushed_end(self) -> int: ...

    @property
    def max_message_size(self) -> int: ...

    @property
    def directory(self) -> Path: ...

    def read(self, offset: int, max_bytes: int, upto: int | None = None) -> bytes: ...

    def crc32(self, start: int, end: int) -> int: ...


class PartitionOwner(Protocol):
    """One partition's log, epoch history and transaction state, written only through it
    (metaq.server.partitions.Partition)."""

    @property
    def key(self) -> tuple[str, int]:
        """``(topic, partition)``."""

    @property
    def dropped(self) -> bool:
        """Whether the partition was dropped (its topic deleted or re-created): nothing more is
        appended to it, and a truncation started before leaves it alone."""

    @property
    def log(self) -> LogReader:
        """The log, to read: every append and truncation goes through the methods below."""

    @property
    def epochs(self) -> EpochCache: ...

    async def adopt_epochs(self, entries: list[tuple[int, int]]) -> bool:
        """Copy the master's epoch history of this partition (saved off the event loop)."""

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> int: ...

    def truncate_to(self, offset: int) -> Path | None: ...

    def restart_at(self, offset: int) -> Path | None: ...

    def truncate_corrupt(self) -> tuple[int, int, Path | None] | None: ...

    def repair_corrupt(self, start: int, data: bytes) -> bool: ...

    def cut_incomplete_tail(self, when: str) -> int | None: ...


class PartitionOwners(Protocol):
    """Every served partition's owner (metaq.server.partitions.Partitions)."""

    def get(self, topic: str, partition: int) -> PartitionOwner: ...

    def owners(self) -> list[PartitionOwner]:
        """The owner of every open log, in key order (the one registry a truncation walks)."""

    def batch_boundary(self, topic: str, partition: int, offset: int, committed: int) -> int: ...

    def replication(self, topic: str, partition: int) -> ReplicationRecord | None:
        """The partition's replication record (None if not served): see ``ReplicationRecords``."""

    def replications(self) -> Iterator[tuple[tuple[str, int], ReplicationRecord]]: ...

    async def assign_epoch(self, topics: dict[str, TopicConfig], epoch: int) -> int:
        """A new master's epoch in every served partition's history, durably (one batch)."""

    async def adopt_epochs(self, topic: str, partition: int, entries: list[tuple[int, int]]) -> bool:
        """A slave copies its master's epoch history of a partition (saved off the event loop)."""


class Registry(Protocol):
    """The broker's ZooKeeper presence (metaq.server.registry.BrokerRegistry).

    It registers whatever role the coordinator gives it (``set_role``); it is not
    a source of truth about the role.
    """

    on_session_lost: Callable[[], Any] | None
    on_session_suspended: Callable[[], Any] | None
    on_connected: Callable[[bool], Any] | None

    @property
    def client(self) -> KazooClient: ...

    @property
    def url(self) -> str: ...

    @property
    def slave_id(self) -> int | None: ...

    @property
    def security(self) -> ZkSecurity | None:
        """The group's ZooKeeper login and ACLs (security on), for nodes HA writes."""

    async def set_role(self, role: str | int | None) -> None: ...


class PeerCredentials(Protocol):
    """What talking to the group's other brokers needs (metaq/ha/peers.py): a ``BrokerHost`` is one."""

    @property
    def security(self) -> BrokerSecurity:
        """Credentials and TLS for talking to the group's other brokers."""


class BrokerHost(Protocol):
    """The broker as HA sees it: config, logs, ZooKeeper registry, and two actions."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> LogStore: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def security(self) -> BrokerSecurity:
        """Credentials and TLS for talking to the group's other brokers (metaq/ha/peers.py)."""

    @property
    def partitions(self) -> PartitionOwners:
        """Each partition's one owner: replica appends, truncations, epoch histories."""

    def on_leading(self, epoch: int) -> None:
        """This broker now leads ``epoch`` (its logs are cut to whole batches, its lease and
        sync set are up): the transaction service reconciles for it."""

    def on_resigned(self) -> None:
        """This broker stopped leading: the transaction service serves nothing more."""

    def notify(self, topic: str, partition: int) -> None:
        """Wake fetches parked on a partition (its log end or committed offset moved)."""

    def notify_committed(self, topic: str, partition: int) -> None:
        """Wake the fetches that wait for a partition's committed offset (it moved, not the log end)."""

    def watch(self, topic: str, partition: int, woken: Callable[[], None]) -> Callable[[], None]:
        """Call ``woken()`` once at the partition's next notify (either kind); returns what withdraws it."""

    async def restore_after_zookeeper_loss(self) -> None:
        """This broker re-seeded its group after ZooKeeper lost its data: restore what the
        group's nodes held that the broker's logs know (the producer id counter)."""

    async def update_topics(self, topics: dict[str, TopicConfig]) -> None:
        """Serve (and register) this topic map: a slave adopting its master's topics."""
