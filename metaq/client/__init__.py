"""The metaq client: MetaQ's session-factory model, asyncio at the core, blocking on top.

Layers, bottom up (as in aiokafka): ``connection`` (one pipelined socket) and ``pool``;
``cluster`` (ZooKeeper metadata) and ``routing`` (which replica to read);
``producer`` / ``consumer`` with ``selector``, ``rebalance``, ``offsets``, ``recover``;
``session`` (the asyncio factory) and ``blocking`` (the blocking facade). See docs/client.md.
"""

from ..errors import MetaqError
from .config import ConsumerConfig, MetaClientConfig
from .consumer import AsyncMessageConsumer, ConsumerStats
from .filters import AttributeFilter, ConsumerMessageFilter
from .message import Message, Partition, SendResult
from .offsets import LocalOffsetStore, OffsetStore, Position, ZkOffsetStore
from .producer import AsyncMessageProducer
from .rebalance import assign_range
from .recover import RecoverStore
from .retry_topics import FailureInfo, failure_info, failure_topic_names
from .routing import choose_replica
from .times import OffsetForTimeError, TimeOffset
from .selector import KeyHashPartitionSelector, NoPartitionAvailable, PartitionSelector, RoundRobinPartitionSelector
from .session import AsyncMessageSessionFactory
from .transactional import AsyncTransactionalProducer, ProducerFenced, TransactionError, TransactionRolledBack
from .xa import AsyncXAProducer, AsyncXAResource, XAError, Xid
from .blocking import MessageConsumer, MessageProducer, MessageSessionFactory, TransactionalProducer, XAProducer

__all__ = [
    "AsyncTransactionalProducer",
    "AsyncXAProducer",
    "AsyncXAResource",
    "TransactionError",
    "TransactionRolledBack",
    "ProducerFenced",
    "TransactionalProducer",
    "XAError",
    "XAProducer",
    "Xid",
    "AsyncMessageConsumer",
    "AsyncMessageProducer",
    "AsyncMessageSessionFactory",
    "AttributeFilter",
    "ConsumerConfig",
    "ConsumerMessageFilter",
    "ConsumerStats",
    "KeyHashPartitionSelector",
    "LocalOffsetStore",
    "Message",
    "MessageConsumer",
    "MessageProducer",
    "MessageSessionFactory",
    "MetaClientConfig",
    "MetaqError",
    "NoPartitionAvailable",
    "OffsetForTimeError",
    "OffsetStore",
    "Partition",
    "PartitionSelector",
    "Position",
    "RecoverStore",
    "FailureInfo",
    "failure_info",
    "failure_topic_names",
    "RoundRobinPartitionSelector",
    "SendResult",
    "TimeOffset",
    "ZkOffsetStore",
    "assign_range",
    "choose_replica",
]
