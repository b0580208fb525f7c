"""MetaQ's ``deletePolicy``: ``delete,N`` or ``archive,N[,true]``, N with an optional unit ``s``,
``m`` or ``h`` (hours if none).

The one parser of it: the configuration's check (``metaq/config.py``, so a value retention
could not run is refused with the file, a reload or ``metaq topics alter``) and retention's
pass (``metaq/store/retention.py``) read it alike.
"""

from __future__ import annotations

import re
from typing import NamedTuple

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
