"""The asyncio session factory: one ZooKeeper client and one connection pool for all its clients."""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import MetaqError
from .cluster import Cluster
from .config import ConsumerConfig, MetaClientConfig
from .consumer import AsyncMessageConsumer
from .offsets import OffsetStore
from .pool import ConnectionPool
from .producer import AsyncMessageProducer
from .selector import PartitionSelector
from .transactional import AsyncTransactionalProducer, TransactionalSender
from .xa import AsyncXAProducer


class AsyncMessageSessionFactory:
    """MetaQ's MessageSessionFactory for asyncio code::

        async with AsyncMessageSessionFactory(MetaClientConfig(zk_connect="127.0.0.1:2181")) as factory:
            producer = factory.create_producer()
            result = await producer.send_message(Message("t", b"hello"))
    """

    def __init__(self, config: MetaClientConfig | None = None, **overrides: Any) -> None:
        self.config = config or MetaClientConfig(**overrides)
        self.cluster = Cluster(self.config)
        self.pool = ConnectionPool(self.config.connect_timeout_s, self.config.address_map, self.config.credentials)
        self.cluster.add_departure_listener(self.pool.abandon)
        self._producers: list[AsyncMessageProducer] = []
        self._consumers: list[AsyncMessageConsumer] = []
        self._transactional: list[AsyncTransactionalProducer] = []
        self._started = False
        self._shut_down = False

    def _check_open(self) -> None:
        # Its ZooKeeper session and connections are gone: what it would create could never send.
        if self._shut_down:
            raise MetaqError("this session factory is shut down: create a new one")

    async def start(self) -> "AsyncMessageSessionFactory":
        """Connect to ZooKeeper (raises MetaqError if it cannot)."""
        if not self._started:
            await self.cluster.start()
            self._started = True
        return self

    def create_producer(self, selector: PartitionSelector | None = None) -> AsyncMessageProducer:
        self._check_open()
        producer = AsyncMessageProducer(self.cluster, self.pool, self.config, selector)
        self._producers.append(producer)
        return producer

    def create_transactional_producer(self, selector: PartitionSelector | None = None, *,
                                      transactional_id: str | None = None,
                                      broker_id: int | None = None) -> AsyncTransactionalProducer:
        """MetaQ's TransactionalProducer: local transactions over one broker group (transactional.py);
        with ``transactional_id`` a new instance fences the older ones of the same name."""
        self._check_open()
        producer = AsyncTransactionalProducer(TransactionalSender(self.cluster, self.pool, self.config, selector,
                                                                  broker_id, transactional_id))
        self._transactional.append(producer)
        return producer

    def create_xa_producer(self, broker_id: int | None = None, selector: PartitionSelector | None = None, *,
                           transactional_id: str | None = None) -> AsyncXAProducer:
        """An XA producer and its resource (xa.py); ``broker_id`` names the group (else: the first send's)."""
        self._check_open()
        return AsyncXAProducer(TransactionalSender(self.cluster, self.pool, self.config, selector, broker_id,
                                                   transactional_id))

    def create_consumer(self, config: ConsumerConfig, offset_store: OffsetStore | None = None) -> AsyncMessageConsumer:
        self._check_open()
        consumer = AsyncMessageConsumer(self.cluster, self.pool, self.config, config, offset_store)
        self._consumers.append(consumer)
        return consumer

    async def shutdown(self) -> None:
        """Finish sends in flight, stop consumers (committing their offsets), close everything."""
        self._shut_down = True
        await asyncio.gather(*(p.close() for p in self._producers), return_exceptions=True)
        # A local transaction left open is rolled back; an XA branch is the transaction manager's.
        await asyncio.gather(*(p.close() for p in self._transactional), return_exceptions=True)
        for consumer in self._consumers:
            await consumer.shutdown()
        self.pool.close_all()
        if self._started:
            self._started = False
            await self.cluster.stop()

    async def __aenter__(self) -> "AsyncMessageSessionFactory":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
