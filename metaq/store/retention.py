"""Retention: MetaQ's ``deletePolicy`` (what to remove) and ``deleteWhen`` (when to look).

``deletePolicy``: ``delete,N`` or ``archive,N[,true]`` where N takes an optional unit
``s``, ``m`` or ``h`` (hours if none). Archive renames the segment to ``.arc``, or zips
it to ``.zip`` with the third field ``true``. Only read-only (closed) segments whose
mtime is older than N are touched, oldest first, so the log stays contiguous.

``deleteWhen``: a Quartz cron expression, ``sec min hour day-of-month month
day-of-week [year]``, default ``0 0 6,18 * * ?``.
"""

from __future__ import annotations

import os
import re
import zipfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from metaq.store.log import PartitionLog, delete_segment_file
from metaq.store.segment import LogSegment, fsync_directory

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "": 3600}
_POLICY = re.compile(r"^\s*(delete|archive)\s*,\s*(\d+)\s*([smh]?)\s*(?:,\s*(true|false)\s*)?$", re.IGNORECASE)


class DeletePolicy(NamedTuple):
    kind: str  # "delete" | "archive"
    seconds: int
    zip: bool


def parse_delete_policy(text: str) -> DeletePolicy:
    match = _POLICY.match(text)
    if not match:
        raise ValueError(f"bad deletePolicy {text!r}: expected 'delete,N[s|m|h]' or 'archive,N[s|m|h][,true]'")
    kind, amount, unit, compress = match.groups()
    kind = kind.lower()
    if compress is not None and kind != "archive":
        raise ValueError(f"bad deletePolicy {text!r}: only 'archive' takes a third field")
    return DeletePolicy(kind, int(amount) * _UNIT_SECONDS[unit.lower()], (compress or "").lower() == "true")


# --- disposing of detached segments ----------------------------------------------------


def archive_segment_file(segment: LogSegment, compress: bool) -> Path:
    """Rename ``{start}.meta`` to ``{start}.arc``, or zip it into ``{start}.zip``.

    The new name no longer matches ``*.meta``, so the log ignores it from then on.
    """
    segment.close()
    source = segment.path
    if not compress:
        target = source.with_suffix(".arc")
        os.replace(source, target)
    else:
        target = source.with_suffix(".zip")
        partial = target.with_name(target.name + ".partial")
        # Write under a temporary name and rename, so a crash never leaves a
        # half-written zip that looks complete, and the .meta goes only afterwards.
        # strict_timestamps=False: a file with an mtime before 1980 (bad clock) still archives.
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED, strict_timestamps=False) as archive:
            archive.write(source, arcname=source.name)
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(partial, target)
        source.unlink()
    fsync_directory(source.parent)
    return target


def dispose_segment(segment: LogSegment, policy: DeletePolicy) -> Path:
    if policy.kind == "delete":
        return delete_segment_file(segment)
    return archive_segment_file(segment, policy.zip)


def _as_timestamp(now: float | datetime) -> float:
    return now.timestamp() if isinstance(now, datetime) else float(now)


def apply_policy(log: PartitionLog, policy: str | DeletePolicy, now: float | datetime) -> list[Path]:
    """Delete or archive the closed segments older than the policy allows; return the new/removed paths."""
    if isinstance(policy, str):
        policy = parse_delete_policy(policy)
    cutoff = _as_timestamp(now) - policy.seconds
    return log.remove_old_segments(cutoff, lambda segment: dispose_segment(segment, policy))


# --- Quartz cron -----------------------------------------------------------------------

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
