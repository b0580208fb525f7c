"""The broker's configuration has one owner (metaq/server/live_config.py): a reload and a topic
change swap it whole, subscribers hear of it, and readers never hold a stale copy."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from metaq.config import BrokerConfig, TopicConfig, parse_server_ini
from metaq.ha.coordinator import HaCoordinator
from metaq.ha.progress import ReplicationProgress
from metaq.server.broker import Broker
from metaq.server.live_config import LiveConfig
from metaq.server.registry import BrokerRegistry
from metaq.server.transactions import TransactionService
from metaq.topic_change import TopicChange

BEFORE = b"[system]\nbrokerId=3\nserverPort=8123\ndataPath=/data/a\nunflushThreshold=10\n[topic=t]\n"
AFTER = (b"[system]\nbrokerId=3\nserverPort=9000\ndataPath=/data/b\nunflushThreshold=99\nlogLevel=WARNING\n"
         b"maxOpenTransactionsPerUser=7\n[topic=t]\n[topic=u]\n")


class Host:
    """A broker as HA and the transaction service see it: ``config`` read from the owner."""

    def __init__(self, live: LiveConfig, base: Path) -> None:
        self.live = live
        self.registry = SimpleNamespace(client=object(), url="meta://127.0.0.1:8123")
        self.base = base

    @property
    def config(self) -> BrokerConfig:
        return self.live.current


def test_a_reload_takes_the_live_keys_only_and_leaves_topics_to_set_topics() -> None:
    live = LiveConfig(parse_server_ini(BEFORE, "/etc/server.ini"))
    heard: list[tuple[BrokerConfig, BrokerConfig]] = []
    live.subscribe(lambda old, new: heard.append((old, new)))
    old = live.current
    running = live.reload(parse_server_ini(AFTER, "/etc/server.ini"))
    assert live.current is running and heard == [(old, running)]
    assert running.topic_defaults.unflush_threshold == 99 and running.log_level is not None  # live keys
    assert running.server_port == 8123 and running.topic_defaults.data_path == old.topic_defaults.data_path  # restart
    assert running.txn == old.txn  # the transaction keys need a restart too
    assert set(running.topics) == {"t"}  # the group's configuration has its say first (Broker.update_topics)
    topics = parse_server_ini(AFTER, "/etc/server.ini").topics
    assert set(live.set_topics(topics).after) == {"t", "u"} and len(heard) == 2


def test_server_ini_topics_have_one_writer() -> None:
    """Regression: the broker set its own ``local_topics`` and the reload wrote them again. Now the
    owner keeps them (at construction and by ``reload``); the topics served are another thing."""
    live = LiveConfig(parse_server_ini(BEFORE, "/etc/server.ini"))
    assert set(live.local_topics) == {"t"}
    live.set_topics({})  # the group's configuration or a master's topics: not server.ini's
    assert set(live.local_topics) == {"t"}
    live.reload(parse_server_ini(AFTER, "/etc/server.ini"))
    assert set(live.local_topics) == {"t", "u"}
    live.local_topics.clear()  # a copy: a reader cannot write them
    assert set(live.local_topics) == {"t", "u"}
    broker = Broker.__new__(Broker)
    broker.live_config = live
    assert broker.local_topics == live.local_topics
    with pytest.raises(AttributeError):
        broker.local_topics = {}  # type: ignore[misc]  # no second writer


def test_readers_follow_the_owner_instead_of_keeping_a_copy(tmp_path: Path) -> None:
    """Regression: the coordinator and the transaction service copied the config at construction
    and read the copy next to the broker's fresh one (a re-seed after a reload mixed both)."""
    live = LiveConfig(parse_server_ini(BEFORE, "/etc/server.ini"))
    host = Host(live, tmp_path)
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    service = TransactionService(host)
    live.reload(parse_server_ini(AFTER, "/etc/server.ini"))
    assert coordinator.config is live.current
    assert coordinator.config.topic_defaults.unflush_threshold == 99
    # A swap with other transaction settings (what a restart-free change would bring) is seen at once.
    live._swap(parse_server_ini(AFTER, "/etc/server.ini"))
    assert service.settings is live.current.txn
    assert service.settings.max_open_transactions_per_user == 7


def test_a_topic_change_names_what_was_added_altered_and_removed() -> None:
    t, u, v = TopicConfig("t"), TopicConfig("u"), TopicConfig("v")
    change = TopicChange({"t": t, "u": u}, {"t": replace(t, num_partitions=3), "v": v})
    assert change.added == {"v": v}
    assert change.altered == {"t": (t, replace(t, num_partitions=3))}
    assert change.removed == {"u": u}
    assert change and not TopicChange({"t": t}, {"t": t})


def test_set_topics_publishes_one_change_after_the_swap_in_subscription_order() -> None:
    live = LiveConfig(parse_server_ini(BEFORE, "/etc/server.ini"))
    heard: list[tuple[str, TopicChange, BrokerConfig]] = []
    live.on_topic_change(lambda change: heard.append(("first", change, live.current)))
    live.on_topic_change(lambda change: heard.append(("second", change, live.current)))
    before = live.current.topics
    topics = parse_server_ini(AFTER, "/etc/server.ini").topics
    change = live.set_topics(topics)
    assert [name for name, _, _ in heard] == ["first", "second"]
    assert all(seen is change and current is live.current for _, seen, current in heard)  # applied on the new map
    assert change.before == before and set(change.added) == {"u"} and not change.removed
    live.set_topics(topics)  # the same map again: nothing to apply
    assert len(heard) == 2


def test_the_store_and_the_registry_read_the_owners_topic_map(tmp_path: Path) -> None:
    """Regression: the store and the registry each kept a copy of the topic map, kept in step by
    ``Broker.update_topics``; now both read ``LiveConfig`` and the store applies its changes."""
    config = parse_server_ini(BEFORE.replace(b"/data/a", str(tmp_path).encode()), "/etc/server.ini")
    broker = Broker(config, register_in_zk=False)
    assert set(broker.store.topics) == {"t"}
    change = broker.live_config.set_topics({**config.topics, "u": replace(config.topics["t"], name="u")})
    assert set(change.added) == {"u"} and set(broker.store.topics) == {"t", "u"}
    assert broker.store.topic_config("u") is broker.config.topics["u"]
    with pytest.raises(RuntimeError, match="LiveConfig"):
        broker.store.update_topics({})  # a second writer of the broker's map is refused
    registry = BrokerRegistry(config.zk, 3, "127.0.0.1", 8123, broker._served_topics, 0)
    assert {path.rsplit("/", 2)[-2] for path in registry._desired_nodes() if "/topics-sub/" in path} == {"t", "u"}


def test_the_registry_publishes_a_topic_change_only_after_every_owner_applied_it(tmp_path: Path) -> None:
    """The order ``Broker._apply_topic_change`` writes down: when ZooKeeper hears of the new map,
    the store serves the added topic and no longer holds the dropped partition's log."""
    ini = BEFORE.replace(b"/data/a", str(tmp_path).encode()).replace(b"[topic=t]\n", b"[topic=t]\nnumPartitions=2\n")
    config = parse_server_ini(ini, "/etc/server.ini")
    broker = Broker(config, register_in_zk=False)
    seen: list[tuple[set[str], bool]] = []

    class Registry:
        async def publish_topics(self) -> None:
            seen.append((set(broker.store.topics), broker.store.open_log("t", 1) is None))

    async def scenario() -> None:
        broker.store.get_log("t", 1)
        broker.registry = Registry()  # type: ignore[assignment]
        await broker.update_topics({"t": replace(config.topics["t"], num_partitions=1), "u": TopicConfig("u", data_path=str(tmp_path))})
        broker.store.close()

    asyncio.run(scenario())
    assert seen == [({"t", "u"}, True)]
