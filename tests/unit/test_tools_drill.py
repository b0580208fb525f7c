"""The drill's retry budget (a load send must outlast the failover it measures) and its
verdict on duplicates."""

from __future__ import annotations

import pytest

from metaq.tools.drill import DrillReport, failover_budget_s, load_client_config


@pytest.mark.parametrize("session_ms", [400, 1500, 6000, 30000, 120000])
def test_the_load_keeps_retrying_for_longer_than_a_failover_may_take(session_ms: int) -> None:
    budget = failover_budget_s(session_ms)
    # Two session timeouts (the old master's lock expiring, then a candidate's) and room for the election.
    assert budget >= 2 * session_ms / 1000 + 10
    config = load_client_config("127.0.0.1:2181", "/meta", session_ms)
    assert config.send_timeout_s >= budget
    assert config.send_max_attempts * config.send_retry_max_wait_s >= budget
    assert config.retry_unknown_outcome, "an unknown outcome is resent, and counted as a duplicate if it was stored"


def test_a_duplicate_fails_a_drill_only_with_the_idempotent_producer() -> None:
    def report(idempotent: bool, duplicates: int) -> DrillReport:
        return DrillReport("kill", 0, "meta://a:1", new_master="meta://b:1", mode="sync",
                           duplicates=duplicates, idempotent=idempotent, logs_identical=True)

    assert report(True, 0).ok and report(False, 3).ok
    assert not report(True, 1).ok  # a resend stored twice although numbered: a broker bug
