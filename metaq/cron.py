"""Quartz cron expressions, MetaQ's ``deleteWhen``: when retention looks at the logs.

``sec min hour day-of-month month day-of-week [year]``, e.g. the default
``0 0 6,18 * * ?`` (06:00 and 18:00 every day). Supported: ``*``, ``?``, lists,
ranges, ``/`` steps and month/weekday names; ``L``, ``W`` and ``#`` are refused
with a clear error rather than misread.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

_MONTHS = {name: i for i, name in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), 1)}
_WEEKDAYS = {name: i for i, name in enumerate("SUN MON TUE WED THU FRI SAT".split(), 1)}  # Quartz: 1 = Sunday


class _Field(NamedTuple):
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = [
    _Field("second", 0, 59, {}),
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, _MONTHS),
    _Field("day-of-week", 1, 7, _WEEKDAYS),
    _Field("year", 1970, 2199, {}),
]


def _parse_field(text: str, field: _Field, expr: str) -> frozenset[int] | None:
    """The values a field allows; None for ``*`` / ``?`` (anything)."""

    def value(token: str) -> int:
        token = token.strip().upper()
        number = field.names[token] if token in field.names else int(token) if token.isdigit() else None
        if number is None or not field.low <= number <= field.high:
            raise ValueError(f"cron {expr!r}: bad {field.name} value {token!r} (allowed {field.low}-{field.high})")
        return number

    if text in ("*", "?"):
        return None
    allowed: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        if not step_text.isdigit() and step_text:
            raise ValueError(f"cron {expr!r}: bad step in {field.name} {part!r} (L, W and # are not supported)")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"cron {expr!r}: step must be >= 1 in {field.name} {part!r}")
        if base in ("*", "?"):
            low, high = field.low, field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low, high = value(first), value(last)
            if low > high:
                raise ValueError(f"cron {expr!r}: empty range {base!r} in {field.name}")
        else:
            low = value(base)
            high = field.high if step_text else low  # "5/15" means 5, 20, 35, ...
        allowed.update(range(low, high + 1, step))
    return frozenset(allowed)


def _next_at_least(allowed: frozenset[int] | None, current: int, high: int) -> int | None:
    if allowed is None:
        return current if current <= high else None
    candidates = [v for v in allowed if v >= current]
    return min(candidates) if candidates else None


class QuartzCron:
    """A Quartz cron expression: ``sec min hour dom month dow [year]``.

    Supports ``*``, ``?``, lists, ranges, ``/`` steps and month/weekday names. Quartz
    wants ``?`` in one of day-of-month/day-of-week; if both are given, a day must match
    both (classic cron would OR them; Quartz refuses the expression).
    """

    def __init__(self, expr: str) -> None:
        fields = expr.split()
        if len(fields) not in (6, 7):
            raise ValueError(f"cron {expr!r}: expected 6 or 7 fields (sec min hour day month weekday [year])")
        self.expr = expr
        parsed = [_parse_field(text, spec, expr) for text, spec in zip(fields, _FIELDS)]
        self.seconds, self.minutes, self.hours, self.days, self.months, self.weekdays = parsed[:6]
        self.years = parsed[6] if len(parsed) == 7 else None

    def _day_matches(self, day: datetime) -> bool:
        if self.days is not None and day.day not in self.days:
            return False
        quartz_weekday = (day.weekday() + 1) % 7 + 1  # Monday=0 -> 2, Sunday=6 -> 1
        return self.weekdays is None or quartz_weekday in self.weekdays

    def next_fire_after(self, after: datetime) -> datetime:
        """The first time strictly after ``after`` that the expression matches (same tzinfo)."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        horizon = t.year + 400  # every calendar repeats within 400 years
        while t.year <= horizon:
            if self.years is not None and t.year not in self.years:
                year = _next_at_least(self.years, t.year + 1, 9999)
                if year is None:
                    break
                t = t.replace(year=year, month=1, day=1, hour=0, minute=0, second=0)
                continue
            if self.months is not None and t.month not in self.months:
                month = _next_at_least(self.months, t.month, 12)
                t = (
                    t.replace(month=month, day=1, hour=0, minute=0, second=0)
                    if month is not None
                    else t.replace(year=t.year + 1, month=1, day=1, hour=0, minute=0, second=0)
                )
                continue
            if not self._day_matches(t):
                t = t.replace(hour=0, minute=0, second=0) + timedelta(days=1)
                continue
            hour = _next_at_least(self.hours, t.hour, 23)
            if hour is None:
                t = t.replace(hour=0, minute=0, second=0) + timedelta(days=1)
                continue
            if hour != t.hour:
                t = t.replace(hour=hour, minute=0, second=0)
            minute = _next_at_least(self.minutes, t.minute, 59)
            if minute is None:
                t = t.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if minute != t.minute:
                t = t.replace(minute=minute, second=0)
            second = _next_at_least(self.seconds, t.second, 59)
            if second is None:
                t = t.replace(second=0) + timedelta(minutes=1)
                continue
            return t.replace(second=second)
        raise ValueError(f"cron {self.expr!r} never fires after {after}")

    def __repr__(self) -> str:
        return f"QuartzCron({self.expr!r})"
