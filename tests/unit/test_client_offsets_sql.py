"""The SQL offset store on SQLite (the MariaDB run is tests/integration/test_offsets_sql_mariadb.py)."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import pytest
from sqlalchemy import inspect

from metaq.client import ConsumerConfig, MetaClientConfig
from metaq.client.cluster import Cluster
from metaq.client.consumer import AsyncMessageConsumer
from metaq.client.message import Partition
from metaq.client.offsets import Position
from metaq.client.offsets_sql import DEFAULT_TABLE_NAME, SqlOffsetStore
from metaq.client.pool import ConnectionPool

P0, P1 = Partition(0, 0), Partition(0, 1)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'sub' / 'offsets.db'}"


def rows(url: str) -> list[tuple]:
    with sqlite3.connect(url[len("sqlite:///"):]) as db:
        return db.execute(f"SELECT topic, partition, group_id, offset, msg_id FROM {DEFAULT_TABLE_NAME} ORDER BY partition").fetchall()


def test_creates_metaq_table_and_round_trips(url) -> None:
    store = SqlOffsetStore(url)
    assert run(store.load("g", "t", P0)) is None
    columns = {c["name"] for c in inspect(store.engine).get_columns(DEFAULT_TABLE_NAME)}
    assert columns == {"id", "topic", "partition", "group_id", "offset", "msg_id", "incarnation"}
    run(store.commit("g", "t", {P0: Position(7, 120), P1: Position(-1, 0)}))
    run(store.commit("g", "t", {P0: Position(9, 3 * 2**31)}))  # past int32: BIGINT columns
    assert run(store.load("g", "t", P0)) == Position(9, 3 * 2**31)
    assert run(store.load("g", "t", P1)) == Position(-1, 0)
    assert run(store.load("other-group", "t", P0)) is None
    assert run(store.load("g", "other-topic", P0)) is None
    assert rows(url) == [("t", "0-0", "g", 3 * 2**31, 9), ("t", "0-1", "g", 0, -1)], "one row per place"


@pytest.mark.parametrize("bad", ["bogus://", "bogus", "mysql+nosuchdriver://h/db"])
def test_a_bad_url_is_a_value_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=rf"^offset store url '{re.escape(bad)}': "):
        SqlOffsetStore(bad)


def test_a_second_store_on_the_same_database_sees_the_commits(url) -> None:
    run(SqlOffsetStore(url).commit("g", "t", {P0: Position(1, 40)}))
    assert run(SqlOffsetStore(url).load("g", "t", P0)) == Position(1, 40)


def test_a_commit_is_one_transaction(url) -> None:
    store = SqlOffsetStore(url)
    run(store.commit("g", "t", {P0: Position(1, 100)}))
    # P0 sorts first and is updated; the insert for P1 then violates NOT NULL: all rolled back.
    with pytest.raises(Exception):
        run(store.commit("g", "t", {P0: Position(2, 200), P1: Position(3, None)}))  # type: ignore[arg-type]
    assert run(store.load("g", "t", P0)) == Position(1, 100)
    assert run(store.load("g", "t", P1)) is None


def test_works_on_a_table_metaq_created(url, tmp_path) -> None:
    path = url[len("sqlite:///"):]
    (tmp_path / "sub").mkdir()
    with sqlite3.connect(path) as db:
        # MetaQ's DDL (int columns, a plain index), in SQLite's dialect.
        db.execute(f"CREATE TABLE {DEFAULT_TABLE_NAME} (id INTEGER PRIMARY KEY AUTOINCREMENT, topic VARCHAR(255) NOT NULL, "
                   "partition VARCHAR(255) NOT NULL, group_id VARCHAR(255) NOT NULL, offset INT NOT NULL, msg_id INT NOT NULL)")
        db.execute(f"CREATE INDEX TOPIC_PART_GRP_IDX ON {DEFAULT_TABLE_NAME} (topic, partition, group_id)")
        db.execute(f"INSERT INTO {DEFAULT_TABLE_NAME} (topic, partition, group_id, offset, msg_id) VALUES ('t', '0-0', 'g', 55, 4)")
    store = SqlOffsetStore(url)
    assert run(store.load("g", "t", P0)) == Position(4, 55)
    run(store.commit("g", "t", {P0: Position(5, 80)}))
    assert rows(url) == [("t", "0-0", "g", 80, 5)]


def test_table_name_is_configurable(url) -> None:
    store = SqlOffsetStore(url, table="my_offsets")
    run(store.commit("g", "t", {P0: Position(1, 2)}))
    assert inspect(store.engine).has_table("my_offsets")
    assert not inspect(store.engine).has_table(DEFAULT_TABLE_NAME)


def test_consumer_config_offset_store_url_selects_the_sql_store(url) -> None:
    async def build() -> AsyncMessageConsumer:
        client_config = MetaClientConfig()
        return AsyncMessageConsumer(Cluster(client_config), ConnectionPool(), client_config,
                                    ConsumerConfig(group="g", offset_store_url=url))

    consumer = run(build())
    assert isinstance(consumer.offset_store, SqlOffsetStore)
    assert consumer.offset_store.url == url


def test_bad_url_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="Could not parse"):
        SqlOffsetStore("not a url")


def test_an_offset_of_another_incarnation_of_the_topic_is_not_loaded(url) -> None:
    """offsets.applies on the SQL store: committed in incarnation "a", loaded for "b" (the topic
    was deleted and re-created): not applied. Rows of a MetaQ-made table (no column) are kept."""
    store = SqlOffsetStore(url)
    run(store.commit("g", "t", {P0: Position(7, 120)}, incarnations={P0: "a"}))
    run(store.commit("g", "t", {P1: Position(8, 130)}, incarnations={P1: ""}))  # the topic had no id yet
    assert run(store.load("g", "t", P0, incarnation="a")) == Position(7, 120)
    assert run(store.load("g", "t", P0, incarnation="b")) is None
    assert run(store.load("g", "t", P0)) == Position(7, 120)  # incarnation unknown: kept
    assert run(store.load("g", "t", P1, incarnation="b")) is None  # only a create gives a topic an id
    assert run(store.load("g", "t", P1, incarnation="")) == Position(8, 130)
    # The next commit of the new incarnation replaces the row and its incarnation.
    run(store.commit("g", "t", {P0: Position(-1, 40)}, incarnations={P0: "b"}))
    assert run(store.load("g", "t", P0, incarnation="b")) == Position(-1, 40)
