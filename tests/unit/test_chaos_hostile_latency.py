"""chaos/hostile.py's put-latency verdict of a ``--rogue`` run (pure logic; the runs themselves:
tests/chaos/test_chaos_short.py's two ``--rogue`` tests)."""

from __future__ import annotations

from chaos.hostile import MIN_SAMPLES, latency_verdict


def window(n: int, median_ms: float, p99_ms: float) -> list[float]:
    """``n`` put latencies (seconds) whose median and p99 (nearest rank) are the given ones."""
    tail = n // 100 + 1  # nearest rank: the p99 is the (ceil(0.99 n))th smallest
    return [median_ms / 1000] * (n - tail) + [p99_ms / 1000] * tail


def test_a_busy_machine_passes_where_only_the_tail_moved() -> None:
    # (median, p99) of runs with no broker at fault on the shared machine (load 5-20): the
    # old p99-only check (3x the quiet p99) failed these.
    for quiet, attacked in [((2.3, 8.1), (3.9, 119.5)), ((3.3, 35.8), (3.3, 149.1)), ((1.9, 7.7), (2.6, 33.9)),
                            ((4.3, 40.0), (11.3, 283.0))]:
        verdict = latency_verdict(window(400, *quiet), window(200, *attacked))
        assert verdict["ok"], verdict


def test_a_starved_broker_fails_on_its_median() -> None:
    # Brokers spending 20 ms, and 10 ms, of their loop on each forged request (scratch runs).
    for quiet, attacked in [((2.7, 48.4), (60.8, 231.5)), ((4.5, 65.5), (28.3, 335.5))]:
        verdict = latency_verdict(window(400, *quiet), window(100, *attacked))
        assert not verdict["ok"] and verdict["attacked_p50_ms"] > verdict["bound_p50_ms"], verdict


def test_stalls_fail_on_the_p99_even_with_a_quick_median() -> None:
    verdict = latency_verdict(window(400, 2.5, 10.0), window(400, 2.5, 400.0))
    assert not verdict["ok"] and verdict["attacked_p99_ms"] > verdict["bound_p99_ms"], verdict


def test_too_few_acked_puts_fail() -> None:
    assert not latency_verdict(window(400, 2.5, 10.0), window(MIN_SAMPLES - 1, 2.5, 10.0))["ok"]
    assert not latency_verdict(window(MIN_SAMPLES - 1, 2.5, 10.0), window(400, 2.5, 10.0))["ok"]
    assert latency_verdict(window(MIN_SAMPLES, 2.5, 10.0), window(MIN_SAMPLES, 2.5, 10.0))["ok"]
