"""Options of the ``metaq`` Spark sink (``df.write`` / ``df.writeStream``): parsing and checks.

Pure, like options.py for the source: errors are one line naming the option, raised on the
driver before any task runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..client.transactional import MAX_TIMEOUT_S
from ..record import DEFAULT_MAX_MESSAGE_SIZE
from .login import LOGIN_OPTIONS, SparkLogin
from .options import boolean, canonical_options, cluster_options, positive_int, topic_option
from .options_error import OptionError

#: Option names as documented (Spark may hand them lower-cased).
SINK_OPTIONS = (
    "zkConnect",
    "zkRoot",
    "topic",
    "exactlyOnce",
    "batchBytes",
    "transactionTimeoutS",
    "maxMessageSize",
    "checkpointLocation",  # Spark's own (writeStream); the sink keeps its decisions there
    *LOGIN_OPTIONS,
)

#: Columns the sink reads; ``value`` is the only required one.
SINK_COLUMNS = {"value": ("binary", "string"), "attribute": "string", "topic": "string", "key": ("string", "binary"), "partition": "string"}

DEFAULT_BATCH_BYTES = 256 * 1024  # the client's batch_size: one put per partition and chunk


@dataclass(frozen=True)
class SinkOptions:
    zk_connect: str
    topic: str | None = None
    zk_root: str = "/meta"
    exactly_once: bool = True
    batch_bytes: int = DEFAULT_BATCH_BYTES
    #: XA branch timeout asked of the broker (0: its maxTxTimeoutInSeconds).
    transaction_timeout_s: int = 0
    checkpoint_location: str | None = None
    #: The brokers' maxMessageSize: a row whose record payload is larger is refused, named.
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    login: SparkLogin = SparkLogin()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SinkOptions":
        opts = canonical_options(options, SINK_OPTIONS, "the metaq sink")
        zk_connect, zk_root = cluster_options(opts)
        timeout_s = positive_int(opts, "transactionTimeoutS", 0) or 0
        if timeout_s > MAX_TIMEOUT_S:
            raise OptionError(f"option transactionTimeoutS: at most {MAX_TIMEOUT_S} seconds, got {timeout_s}")
        return cls(
            zk_connect=zk_connect,
            topic=topic_option(opts),
            zk_root=zk_root,
            exactly_once=boolean(opts, "exactlyOnce", True),
            batch_bytes=positive_int(opts, "batchBytes", DEFAULT_BATCH_BYTES) or DEFAULT_BATCH_BYTES,
            transaction_timeout_s=timeout_s,
            checkpoint_location=str(opts.get("checkpointLocation") or "").strip() or None,
            max_message_size=positive_int(opts, "maxMessageSize", DEFAULT_MAX_MESSAGE_SIZE) or DEFAULT_MAX_MESSAGE_SIZE,
            login=SparkLogin.parse(opts),
        )

    def check_columns(self, columns: Mapping[str, str]) -> None:
        """The DataFrame's columns ({name: simple type string}) against what the sink reads."""
        if "value" not in columns:
            raise OptionError(f"the metaq sink needs a column 'value' (binary, or string sent as UTF-8) (columns: {', '.join(columns) or 'none'})")
        for name, kind in columns.items():
            wanted = SINK_COLUMNS.get(name)
            if wanted is None:
                continue  # other columns are ignored, like Kafka's sink does
            allowed = wanted if isinstance(wanted, tuple) else (wanted,)
            if kind not in allowed:
                raise OptionError(f"the metaq sink's column {name!r} must be {' or '.join(allowed)}, got {kind}")
        if self.topic is None and "topic" not in columns:
            raise OptionError("option topic is required unless the DataFrame has a 'topic' column")
        if "key" in columns and "partition" in columns:
            raise OptionError("the metaq sink places a row by its 'key' or by its 'partition' column, not both")
