"""Files a command writes where the user said: the directory must already exist.

A typo'd directory (``-f /etc/metaq/secuirty/users.ini``) is an error naming it, as for
``cp`` or ``kafka-configs``; a command never creates directories on a guess, where the
file would then sit unread by the broker that was meant to read it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MetaqError


def check_parent_directory(path: str | Path, option: str) -> None:
    """MetaqError naming ``path``'s directory unless it exists (``option`` names the file's option)."""
    parent = Path(path).parent
    if parent.is_dir():
        return
    if parent.exists():
        raise MetaqError(f"{option} {path}: {parent} is not a directory")
    raise MetaqError(f"{option} {path}: directory {parent} does not exist (create it first, or fix the path)")
