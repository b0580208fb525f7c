"""MetaQ's transaction settings (metaq/txn/config.py)."""

from __future__ import annotations

import pytest

from metaq.txn.config import KEYS, FlushTxLog, TxnConfigError, TxnSettings, parse_settings


def test_the_defaults_are_metaqs() -> None:
    settings = parse_settings({})
    assert settings == TxnSettings()
    assert (settings.max_checkpoints, settings.checkpoint_interval_ms, settings.max_tx_timeout_s,
            settings.max_tx_timeout_timer_capacity, settings.flush_tx_log_at_commit) == (
        3, 3_600_000, 60, 30_000, FlushTxLog.AT_COMMIT)


def test_every_key_is_read_and_others_are_left_alone() -> None:
    settings = parse_settings({
        "maxCheckpoints": "5", "checkpointInterval": "60000", "maxTxTimeoutInSeconds": "30",
        "maxTxTimeoutTimerCapacity": "100", "flushTxLogAtCommit": "2", "dataLogPath": "/var/txlog",
        "producerStateMaxBatches": "8", "producerExpiryMs": "3600000", "brokerId": "not ours",
    })
    assert settings == TxnSettings(5, 60_000, 30, 100, FlushTxLog.EVERY_SECOND, "/var/txlog", 8, 3_600_000)


@pytest.mark.parametrize("key, value, message", [
    ("flushTxLogAtCommit", "3", r"\[system\] flushTxLogAtCommit: expected 0 \(OS flush\), 1 .* got '3'"),
    ("maxCheckpoints", "0", r"\[system\] maxCheckpoints: must be between 1 and 1000, got 0"),
    ("maxTxTimeoutInSeconds", "soon", r"maxTxTimeoutInSeconds: expected an integer, got 'soon'"),
    ("checkpointInterval", "10", r"checkpointInterval: must be between 1000"),
    ("dataLogPath", "  ", r"dataLogPath: must not be empty"),
])
def test_bad_values_name_the_key(key: str, value: str, message: str) -> None:
    with pytest.raises(TxnConfigError, match=message):
        parse_settings({key: value})


def test_timeouts_are_capped_by_the_maximum() -> None:
    settings = TxnSettings(max_tx_timeout_s=60)
    assert [settings.cap_timeout(t) for t in (0, -1, 10, 60, 600)] == [60, 60, 10, 60, 60]


def test_keys_have_metaq_config_shape() -> None:
    assert all(isinstance(name, str) and callable(parse) for name, parse in KEYS.values())
