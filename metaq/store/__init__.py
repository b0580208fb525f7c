"""Storage: partition logs of segment files, flushing, message ids and retention."""

from metaq.store.flush import AppendTruncated, LogFlusher
from metaq.store.log import LogCorruptError, OffsetOutOfRange, PartitionLog
from metaq.store.manager import MessageStoreManager, UnknownPartition, UnknownTopic
from metaq.store.msgid import MsgIdGenerator, msg_id_timestamp_ms
from metaq.store.retention import DeletePolicy, parse_delete_policy
from metaq.store.segment import LogSegment

__all__ = [
    "AppendTruncated",
    "DeletePolicy",
    "LogCorruptError",
    "LogFlusher",
    "LogSegment",
    "MessageStoreManager",
    "MsgIdGenerator",
    "OffsetOutOfRange",
    "PartitionLog",
    "UnknownPartition",
    "UnknownTopic",
    "msg_id_timestamp_ms",
    "parse_delete_policy",
]
