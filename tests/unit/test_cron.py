"""Quartz cron expressions (deleteWhen): next fire times and clear refusals."""

from __future__ import annotations

from datetime import datetime

import pytest

from metaq.cron import QuartzCron


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        ("0 0 6,18 * * ?", "2024-03-10 05:59:59", "2024-03-10 06:00:00"),
        ("0 0 6,18 * * ?", "2024-03-10 06:00:00", "2024-03-10 18:00:00"),
        ("0 0 6,18 * * ?", "2024-12-31 18:00:00", "2025-01-01 06:00:00"),
        ("*/15 * * * * ?", "2024-03-10 10:00:14", "2024-03-10 10:00:15"),
        ("0 30 2 ? * MON-FRI", "2024-03-08 03:00:00", "2024-03-11 02:30:00"),  # Fri -> Mon
        ("0 0 12 ? * 1", "2024-03-10 12:00:00", "2024-03-17 12:00:00"),  # 1 = Sunday
        ("0 0 0 29 2 ?", "2024-03-01 00:00:00", "2028-02-29 00:00:00"),
        ("0 0/20 8-9 * * ?", "2024-03-10 09:40:00", "2024-03-11 08:00:00"),
        ("0 0 0 1 JAN ? 2030", "2024-01-01 00:00:00", "2030-01-01 00:00:00"),
        ("5,10 59 23 31 12 ?", "2024-12-31 23:59:05", "2024-12-31 23:59:10"),
    ],
)
def test_quartz_next_fire(expr, after, expected):
    parse = datetime.fromisoformat
    assert QuartzCron(expr).next_fire_after(parse(after)) == parse(expected)


@pytest.mark.parametrize("expr", ["0 0 6 * *", "0 0 25 * * ?", "0 0 6 L * ?", "0 0 6 * * 2#1", "a b c d e f"])
def test_quartz_rejects(expr):
    with pytest.raises(ValueError, match="cron"):
        QuartzCron(expr)


def test_quartz_that_never_fires_again():
    with pytest.raises(ValueError, match="never fires"):
        QuartzCron("0 0 0 1 1 ? 2020").next_fire_after(datetime(2024, 1, 1))
