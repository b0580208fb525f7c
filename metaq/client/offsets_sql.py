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
      UNIQUE KEY TOPIC_PART_GRP_IDX (topic, partition, group_id)
    )

A table created by MetaQ itself works too once its ``offset`` and ``msg_id`` columns are
widened to BIGINT (msg ids here are 64-bit); its rows are read and updated in place.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, UniqueConstraint, and_, create_engine, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from .config import DEFAULT_CLIENT_DIR
from .message import Partition
from .offsets import Position

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

    def __init__(self, url: str | None = None, table: str = DEFAULT_TABLE_NAME, engine: Engine | None = None) -> None:
        self.url = url or default_url()
        if engine is None:
            _make_sqlite_dir(self.url)
        # pool_pre_ping: a MariaDB that restarted between two commits must not fail the next one.
        self.engine = engine or create_engine(self.url, pool_pre_ping=True)
        self.table = offsets_table(table)
        self._created = False
        self._create_lock = threading.Lock()

    # --- OffsetStore -------------------------------------------------------------------

    async def load(self, group: str, topic: str, partition: Partition) -> Position | None:
        return await asyncio.to_thread(self.load_now, group, topic, partition)

    async def commit(self, group: str, topic: str, positions: dict[Partition, Position]) -> None:
        if positions:
            await asyncio.to_thread(self.commit_now, group, topic, dict(positions))

    # --- blocking versions (run in a worker thread) ----------------------------------------

    def load_now(self, group: str, topic: str, partition: Partition) -> Position | None:
        self.create_table()
        t = self.table
        query = (
            select(t.c.msg_id, t.c.offset)
            .where(self._row(group, topic, partition))
            # A MetaQ-made table has no unique key: the newest row wins.
            .order_by(t.c.id.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return Position(int(row.msg_id), int(row.offset)) if row is not None else None

    def commit_now(self, group: str, topic: str, positions: dict[Partition, Position]) -> None:
        self.create_table()
        try:
            with self.engine.begin() as conn:
                self._upsert_all(conn, group, topic, positions)
        except IntegrityError:
            # Two writers inserted the same new row at once (a rebalance handing a partition
            # over): the other one's row now exists, so the update path takes it.
            with self.engine.begin() as conn:
                self._upsert_all(conn, group, topic, positions)

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
                self._created = True

    def close(self) -> None:
        self.engine.dispose()

    # --- internals ---------------------------------------------------------------------

    def _row(self, group: str, topic: str, partition: Partition):
        t = self.table
        return and_(t.c.topic == topic, t.c.partition == str(partition), t.c.group_id == group)

    def _upsert_all(self, conn: Connection, group: str, topic: str, positions: dict[Partition, Position]) -> None:
        # UPDATE, then INSERT where no row matched: portable across databases, and it works
        # on a MetaQ-made table without a unique key. (MySQL reports matched rows here, not
        # changed rows: SQLAlchemy's MySQL drivers connect with CLIENT_FOUND_ROWS.)
        t = self.table
        for partition, position in sorted(positions.items()):
            values = {"offset": position.offset, "msg_id": position.msg_id}
            updated = conn.execute(t.update().where(self._row(group, topic, partition)).values(**values))
            if updated.rowcount == 0:
                conn.execute(t.insert().values(topic=topic, partition=str(partition), group_id=group, **values))
