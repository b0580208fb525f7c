"""The broker's configuration as it is now: one owner, replaced whole, read fresh.

A running broker's ``BrokerConfig`` changes in two ways: a SIGHUP reload takes over the
live keys of server.ini (metaq/server/reload.py decides what changed and says so), and
the topic map changes (``Broker.update_topics``: a reload, the group's topic
configuration, a slave adopting its master's topics). Both go through ``LiveConfig``,
which swaps in a new frozen ``BrokerConfig`` in one step and then tells its subscribers;
a new topic map is published as one ``TopicChange`` (metaq/topic_change.py) to the
topic appliers, in the order they subscribed (``Broker._apply_topic_change`` is the one
the broker subscribes, and writes down the order its owners apply it in).

Invariant: nobody keeps a copy of the config, or of a part of it that can change (topics,
topic defaults, logging); readers take ``current`` (``Broker.config``, ``BrokerHost.config``)
each time, so no stale copy is ever read next to a fresh one. Values fixed for the life of
the process (ids, ports, data paths, the transaction keys) may be read once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..config import BrokerConfig, TopicConfig
from ..topic_change import TopicChange

#: Called after each swap with (old, new).
Subscriber = Callable[[BrokerConfig, BrokerConfig], None]
#: Called after a swap that changed the topic map, with what changed.
TopicApplier = Callable[[TopicChange], None]


class LiveConfig:
    def __init__(self, config: BrokerConfig) -> None:
        self._current = config
        self._subscribers: list[Subscriber] = []
        self._topic_appliers: list[TopicApplier] = []
        #: The topic sections of server.ini as last loaded (the topics served may differ: the
        #: group's configuration wins, a slave adopts its master's). Written here alone: at
        #: construction and by ``reload``.
        self._local_topics = dict(config.topics)

    @property
    def local_topics(self) -> dict[str, TopicConfig]:
        """server.ini's topic sections as last loaded (a copy)."""
        return dict(self._local_topics)

    @property
    def current(self) -> BrokerConfig:
        return self._current

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def on_topic_change(self, applier: TopicApplier) -> None:
        """Have ``applier`` apply every change of the topic map (called in subscription order)."""
        self._topic_appliers.append(applier)

    def reload(self, new: BrokerConfig) -> BrokerConfig:
        """Take over what a running broker applies from a reloaded server.ini (``reload.LIVE_KEYS``):
        the topic defaults except ``dataPath``, the file's text and checksum, and logging. The topic
        map is not changed here (``set_topics`` does, after the group's configuration had its say);
        everything else keeps its value until a restart; the file's topic sections become
        ``local_topics``. Returns the config now running."""
        old = self._current
        self._local_topics = dict(new.topics)
        return self._swap(replace(
            old,
            topic_defaults=replace(new.topic_defaults, data_path=old.topic_defaults.data_path),
            raw=new.raw, checksum=new.checksum,
            log_file=new.log_file, log_format=new.log_format, log_level=new.log_level,
            log_max_bytes=new.log_max_bytes, log_backup_count=new.log_backup_count,
        ))

    def set_topics(self, topics: dict[str, TopicConfig]) -> TopicChange:
        """Serve this topic map from now on (``Broker.update_topics`` alone calls it); the topic
        appliers apply the change before this returns, with no ``await`` in between: nothing
        sees the new map next to an owner's state of the old one on the event loop."""
        before = self._current.topics
        after = self._swap(replace(self._current, topics=dict(topics))).topics
        change = TopicChange(before, after)
        if change:
            for applier in self._topic_appliers:
                applier(change)
        return change

    def _swap(self, new: BrokerConfig) -> BrokerConfig:
        # One assignment: a reader sees the old config or the new one, never a mix.
        old, self._current = self._current, new
        for subscriber in self._subscribers:
            subscriber(old, new)
        return new


#: The ``[system]`` logging keys, as BrokerConfig fields.
LOGGING_FIELDS = ("log_file", "log_format", "log_level", "log_max_bytes", "log_backup_count")


def logging_changed(old: BrokerConfig, new: BrokerConfig) -> bool:
    return any(getattr(old, name) != getattr(new, name) for name in LOGGING_FIELDS)
