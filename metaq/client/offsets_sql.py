"""Consumer offsets in a SQL database (MetaQ's MysqlOffsetStorage), through SQLAlchemy Core.

Any SQLAlchemy URL works; tested are MariaDB/MySQL (``mysql+pymysql://user:pw@host:3306/db``)
and SQLite, the embedded default for a single machine (``sqlite:////path/offsets.db``).

The table is MetaQ's layout, created if missing, with two changes: ``offset`` and
``msg_id`` are BIGINT (MetaQ's ``int(11)`` overflows past 2 GiB of log and cannot hold a
64-bit msg id), and ``(topic, partition, group_id)`` is a UNIQUE key (MetaQ's is a
plain index), so a row per place is enforced by the database and not only by the
consumer group's ownership of partitions::

    CREATE TABLE meta_topic_partition_group_offset (
      id        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
      topic     VARCHAR(255) NOT NULL,
      partition VARCHAR(255) NOT NULL,   -- "{brokerId}-{n}"
      group_id  VARCHAR(255) NOT NULL,
      offset    BIGINT NOT NULL,         -- the byte offset to fetch next
      msg_id    BIGINT NOT NULL,         -- the id of the last message consumed, -1 if unknown
      incarnation VARCHAR(64) NULL,      -- the topic incarnation the offset belongs to (NULL: unknown)
      UNIQUE KEY TOPIC_PART_GRP_IDX (topic, partition, group_id)
    )

A table created by MetaQ itself works too once its ``offset`` and ``msg_id`` columns are
widened to BIGINT (msg ids here are 64-bit); its rows are read and updated in place. A
table without the ``incarnation`` column (MetaQ's, or one made by an earlier version) gets
it added (``ALTER TABLE ... ADD COLUMN``, nullable: its rows keep NULL, "unknown").

``incarnation``: a topic deleted and re-created is a new incarnation (metaq/zk/topic_config.py);
an offset committed in one is never loaded for another (``offsets.applies``): the consumer
starts from its start position, as for a group that never committed.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, UniqueConstraint, and_, create_engine, inspect, select, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError

from .config import DEFAULT_CLIENT_DIR
from .message import Partition
from .offsets import Position, stored_applies

#: MetaQ's table name (MysqlOffsetStorage.DEFAULT_TABLE_NAME).
DEFAULT_TABLE_NAME = "meta_topic_partition_group_offset"
#: Where offsets go when no URL is given: one SQLite file per user and machine.
DEFAULT_SQLITE_PATH = DEFAULT_CLIENT_DIR / "offsets.db"


def default_url() -> str:
    return f"sqlite:///{DEFAULT_SQLITE_PATH}"


def offsets_table(name: str = DEFAULT_TABLE_NAME) -> Table:
    return Table(
        name,
        MetaData(),
        # SQLite only auto-increments an INTEGER PRIMARY KEY.
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
        Column("topic", String(255), nullable=False),
        Column("partition", String(255), nullable=False),
        Column("group_id", String(255), nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("msg_id", BigInteger, nullable=False),
        Column("incarnation", String(64), nullable=True),
        UniqueConstraint("topic", "partition", "group_id", name="TOPIC_PART_GRP_IDX"),
    )


def _make_sqlite_dir(url: str) -> None:
    parsed = make_url(url)  # raises ArgumentError for a malformed URL
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


class SqlOffsetStore:
    """An OffsetStore (see offsets.py) keeping a group's places in one SQL table.

    ``commit`` writes all the positions it is given (the consumer gives one topic's owned
    partitions at a time) in **one transaction**, so a commit, periodic or before a
    rebalance, is stored whole or not at all; a consumer killed mid-commit leaves the
    previous commit. The database's own durability (InnoDB's
    redo log, SQLite's journal) makes a committed transaction survive ``kill -9``.
    Offsets are the same on a master and its slaves, so they survive broker failover
    unchanged, as with the ZooKeeper store.
    """

    #: Loads and commits take the topic's incarnation (``offsets.applies`` decides on load).
    keeps_incarnations = True

    def __init__(self, url: str | None = None, table: str = DEFAULT_TABLE_NAME, engine: Engine | None = None) -> None:
        self.url = url or default_url()
        if engine is None:
            try:
                _make_sqlite_dir(self.url)
                # pool_pre_ping: a MariaDB that restarted between two commits must not fail the next one.
                engine = create_engine(self.url, pool_pre_ping=True)
            except (ArgumentError, ImportError) as exc:
                # A malformed URL, an unknown dialect or a driver not installed: one line naming the URL.
                raise ValueError(f"offset store url {self.url!r}: {exc}") from None
        self.engine = engine
        self.table = offsets_table(table)
        self._created = False
        self._create_lock = threading.Lock()

    # --- OffsetStore -------------------------------------------------------------------

    async def load(self, group: str, topic: str, partition: Partition, incarnation: str | None = None) -> Position | None:
        return await asyncio.to_thread(self.load_now, group, topic, partition, incarnation)

    async def commit(self, group: str, topic: str, positions: dict[Partition, Position],
                     incarnations: dict[Partition, str | None] | None = None) -> None:
        if positions:
            await asyncio.to_thread(self.commit_now, group, topic, dict(positions), incarnations)

    # --- blocking versions (run in a worker thread) ----------------------------------------

    def load_now(self, group: str, topic: str, partition: Partition, incarnation: str | None = None) -> Position | None:
        """The stored position, or None: never committed, or committed in another incarnation than ``incarnation``."""
        self.create_table()
        t = self.table
        query = (
            select(t.c.msg_id, t.c.offset, t.c.incarnation)
            .where(self._row(group, topic, partition))
            # A MetaQ-made table has no unique key: the newest row wins.
            .order_by(t.c.id.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None or not stored_applies(f"{self.table.name}: group {group} {topic}-{partition}", row.incarnation, incarnation):
            return None
        return Position(int(row.msg_id), int(row.offset))

    def commit_now(self, group: str, topic: str, positions: dict[Partition, Position],
                   incarnations: dict[Partition, str | None] | None = None) -> None:
        self.create_table()
        incarnations = incarnations or {}
        try:
            with self.engine.begin() as conn:
                self._upsert_all(conn, group, topic, positions, incarnations)
        except IntegrityError:
            # Two writers inserted the same new row at once (a rebalance handing a partition
            # over): the other one's row now exists, so the update path takes it.
            with self.engine.begin() as conn:
                self._upsert_all(conn, group, topic, positions, incarnations)

    def create_table(self) -> None:
        if self._created:
            return
        with self._create_lock:
            if not self._created:
                try:
                    self.table.metadata.create_all(self.engine, checkfirst=True)
                except (OperationalError, ProgrammingError):
                    # Another consumer created it between our check and our CREATE.
                    with self.engine.connect() as conn:
                        if not self.engine.dialect.has_table(conn, self.table.name):
                            raise
                self._add_incarnation_column()
                self._created = True

    def _add_incarnation_column(self) -> None:
        """A table made by MetaQ or an earlier version lacks ``incarnation``: add it (rows keep NULL)."""
        with self.engine.connect() as conn:
            if "incarnation" in {c["name"] for c in inspect(conn).get_columns(self.table.name)}:
                return
        column = self.table.c.incarnation
        ddl = f"ALTER TABLE {self.table.name} ADD COLUMN incarnation {column.type.compile(self.engine.dialect)} NULL"
        try:
            with self.engine.begin() as conn:
                conn.execute(text(ddl))
        except (OperationalError, ProgrammingError):
            # Another consumer added it between our look and our ALTER.
            with self.engine.connect() as conn:
                if "incarnation" not in {c["name"] for c in inspect(conn).get_columns(self.table.name)}:
                    raise

    def close(self) -> None:
        self.engine.dispose()

    # --- internals ---------------------------------------------------------------------

    def _row(self, group: str, topic: str, partition: Partition):
        t = self.table
        return and_(t.c.topic == topic, t.c.partition == str(partition), t.c.group_id == group)

    def _upsert_all(self, conn: Connection, group: str, topic: str, positions: dict[Partition, Position],
                    incarnations: dict[Partition, str | None]) -> None:
        # UPDATE, then INSERT where no row matched: portable across databases, and it works
        # on a MetaQ-made table without a unique key. (MySQL reports matched rows here, not
        # changed rows: SQLAlchemy's MySQL drivers connect with CLIENT_FOUND_ROWS.)
        t = self.table
        for partition, position in sorted(positions.items()):
            values = {"offset": position.offset, "msg_id": position.msg_id, "incarnation": incarnations.get(partition)}
            updated = conn.execute(t.update().where(self._row(group, topic, partition)).values(**values))
            if updated.rowcount == 0:
                conn.execute(t.insert().values(topic=topic, partition=str(partition), group_id=group, **values))
