"""MetaQ's transaction settings in server.ini ``[system]``, parsed with clear errors.

MetaQ's keys and defaults, with their meaning:

| key | default | meaning |
|---|---|---|
| ``maxCheckpoints`` | 3 | transaction-log checkpoints kept; a new one evicts the oldest |
| ``checkpointInterval`` | 3600000 | ms between automatic checkpoints (1 hour) |
| ``maxTxTimeoutInSeconds`` | 60 | the largest timeout a transaction may ask for; larger ones are capped |
| ``maxTxTimeoutTimerCapacity`` | 30000 | transactions with a pending timeout at once; a begin past it is refused |
| ``flushTxLogAtCommit`` | 1 | 0: the OS flushes the tx log; 1: fsync at every prepare/commit/rollback; 2: fsync once a second |
| ``dataLogPath`` | dataPath | directory of the transaction log |

Added here (no MetaQ equivalent; MetaQ had no idempotent producer):

| key | default | meaning |
|---|---|---|
| ``producerStateMaxBatches`` | 5 | batches remembered per producer and partition for dedup (>= the client's in-flight limit) |
| ``producerExpiryMs`` | 86400000 | a producer idle this long (by the log's timestamps) is forgotten |
| ``maxTransactionalIdsPerUser`` | 1000 | transactional ids one user may own in a broker group; an init of a new name past it is refused |
| ``maxOpenTransactionsPerUser`` | 1000 | live transaction branches one user may hold on a master (security on); a start past it is refused |

``KEYS`` has the shape of metaq/config.py's key tables (``key -> (field, parse)``),
so that module can accept these keys with one lookup; ``parse_settings`` parses a
plain mapping (and is what the tests use).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping


class TxnConfigError(ValueError):
    """A transaction setting with a bad value; the message names the key."""


class FlushTxLog(enum.IntEnum):
    """``flushTxLogAtCommit``, as MetaQ defines it (after InnoDB's flush_log_at_trx_commit)."""

    OS = 0  # write only; the operating system flushes when it likes
    AT_COMMIT = 1  # fsync before a prepare, commit or rollback is acknowledged
    EVERY_SECOND = 2  # write at commit, fsync at most one second later


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def _flush_mode(text: str) -> FlushTxLog:
    try:
        return FlushTxLog(int(text.strip()))
    except ValueError:
        raise ValueError(f"expected 0 (OS flush), 1 (fsync at commit) or 2 (fsync every second), got {text!r}") from None


def _path(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


_DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TxnSettings:
    max_checkpoints: int = 3
    checkpoint_interval_ms: int = 3600 * 1000
    max_tx_timeout_s: int = 60
    max_tx_timeout_timer_capacity: int = 30000
    flush_tx_log_at_commit: FlushTxLog = FlushTxLog.AT_COMMIT
    data_log_path: str | None = None  # None: the broker's dataPath
    producer_state_max_batches: int = 5
    producer_expiry_ms: int = _DAY_MS
    max_transactional_ids_per_user: int = 1000
    max_open_transactions_per_user: int = 1000

    def cap_timeout(self, requested_s: int) -> int:
        """The timeout a transaction gets: what it asked for (0 = the maximum), at most the maximum."""
        return self.max_tx_timeout_s if requested_s <= 0 else min(requested_s, self.max_tx_timeout_s)


KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "maxCheckpoints": ("max_checkpoints", _bounded_int(1, 1000)),
    "checkpointInterval": ("checkpoint_interval_ms", _bounded_int(1000, 30 * _DAY_MS)),
    "maxTxTimeoutInSeconds": ("max_tx_timeout_s", _bounded_int(1, 7 * 24 * 3600)),
    "maxTxTimeoutTimerCapacity": ("max_tx_timeout_timer_capacity", _bounded_int(1, 10_000_000)),
    "flushTxLogAtCommit": ("flush_tx_log_at_commit", _flush_mode),
    "dataLogPath": ("data_log_path", _path),
    "producerStateMaxBatches": ("producer_state_max_batches", _bounded_int(1, 1000)),
    "producerExpiryMs": ("producer_expiry_ms", _bounded_int(1000, 365 * _DAY_MS)),
    "maxTransactionalIdsPerUser": ("max_transactional_ids_per_user", _bounded_int(1, 1_000_000)),
    "maxOpenTransactionsPerUser": ("max_open_transactions_per_user", _bounded_int(1, 10_000_000)),
}
assert {name for name, _ in KEYS.values()} == {f.name for f in fields(TxnSettings)}


def parse_settings(raw: Mapping[str, str], where: str = "[system]") -> TxnSettings:
    """The transaction settings among ``raw`` (other keys are left to the caller)."""
    values: dict[str, Any] = {}
    for key, text in raw.items():
        if key in KEYS:
            name, parse = KEYS[key]
            try:
                values[name] = parse(text)
            except ValueError as exc:
                raise TxnConfigError(f"{where} {key}: {exc}") from None
    return TxnSettings(**values)
