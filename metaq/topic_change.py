"""One change of the topic map a broker serves, as its configuration's owner publishes it.

``LiveConfig.set_topics`` (metaq/server/live_config.py) swaps the topic map and hands each
subscriber one ``TopicChange``: the map before and after, and from them the topics added,
altered (with their config before and after) and removed. Whoever keeps per-topic or
per-partition state applies the change instead of keeping a copy of the map to compare
with: the map itself is read from the owner each time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .config import TopicConfig


@dataclass(frozen=True)
class TopicChange:
    before: Mapping[str, TopicConfig]
    after: Mapping[str, TopicConfig]

    @property
    def added(self) -> dict[str, TopicConfig]:
        return {name: topic for name, topic in self.after.items() if name not in self.before}

    @property
    def altered(self) -> dict[str, tuple[TopicConfig, TopicConfig]]:
        """Topics served before and after whose config differs: name -> (old, new)."""
        return {
            name: (old, self.after[name]) for name, old in self.before.items()
            if name in self.after and self.after[name] != old
        }

    @property
    def removed(self) -> dict[str, TopicConfig]:
        return {name: topic for name, topic in self.before.items() if name not in self.after}

    def __bool__(self) -> bool:
        return dict(self.before) != dict(self.after)
