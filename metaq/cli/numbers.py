"""Argument types of the numeric options: a value that means nothing for the option (a
negative count, a zero timeout, a port past 65535) is a usage error naming the option
(argparse: ``metaq http: error: argument --max-message-size: must be >= 1, got 0``, exit 2),
never a silent default and never a failure found later, after something was started."""

from __future__ import annotations

import argparse
import math
from typing import Callable

from ..store.msgid import MAX_BROKER_ID


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An integer option's type, within [minimum, maximum] (None: unbounded on that side)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return parse


def real(zero_allowed: bool) -> Callable[[str], float]:
    """A finite number option's type (seconds, rates): above 0, or from 0 with ``zero_allowed``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < 0 or (value == 0 and not zero_allowed):
            raise argparse.ArgumentTypeError(f"must be {'>=' if zero_allowed else '>'} 0, got {value:g}")
        return value

    return parse


#: Counts and sizes (messages, bytes, batches, partitions).
positive_int = integer(1)
#: Byte offsets.
offset = integer(0)
#: A port to listen on; 0 picks a free one.
port = integer(0, 65535)
#: A broker group's id (``brokerId``: 0 to 1023, the bits a msg id has for it).
broker_id = integer(0, MAX_BROKER_ID)
#: A slave's id (``slaveId``).
slave_id = integer(0)


def partition(text: str) -> str:
    """A partition named ``BROKER-N`` (``0-1``): a broker id 0..1023 and a partition number >= 0;
    returned as the tables and ZooKeeper spell it (``00-1`` is ``0-1``)."""
    broker, dash, number = text.strip().partition("-")
    if not (dash and broker.isdigit() and number.isdigit()):
        raise argparse.ArgumentTypeError(f"expected BROKER-N (e.g. 0-1), got {text!r}")
    try:
        return f"{broker_id(broker)}-{int(number)}"
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"the broker id {exc}") from None


#: Timeouts, intervals and rates.
positive = real(zero_allowed=False)
#: A wait that 0 turns off.
non_negative = real(zero_allowed=True)
