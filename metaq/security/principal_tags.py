"""Principal tags: a user name as the group's brokers may record it where others can read it.

Who started a transaction branch travels in its PREPARE marker (a record any consumer of
the topic fetches) and who owns a transactional id sits in a world-readable ZooKeeper node.
Writing the user name there would tell anyone which user names exist, which the SCRAM
decoys otherwise hide (docs/security.md). So both hold the user's *tag* instead:
HMAC-SHA256(key, user) in hex, truncated to 128 bits, with a key derived from the group
secret under its own label (metaq/security/group.py). Every broker of the group computes
the same tag, so a promoted slave recognises the user; without the key a tag cannot be
matched to a name, not even by guessing names.
"""

from __future__ import annotations

import hashlib
import hmac

#: Hex characters kept of the SHA-256 MAC (128 bits: no collisions among users, short in a marker).
TAG_CHARS = 32


class PrincipalTags:
    """Tags user names with one group's key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def tag(self, user: str) -> str:
        return hmac.new(self._key, user.encode("utf-8"), hashlib.sha256).hexdigest()[:TAG_CHARS]
