"""A broker's data is readable by its own OS user only.

Segments, checkpoints, the transaction journal and every other file a broker writes under
its data directories are created 0600, in 0700 directories; a data directory the
operator made 0755 is tightened at start. Before, they were 0644 in 0755 directories, so
any local user could read every message. A real broker process: plain puts, a committed
transaction and a prepared XA branch, a restart (which writes the checkpoints), then
every path under the data directory is checked.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from metaq.client import Message, MetaClientConfig, Xid
from metaq.client.session import AsyncMessageSessionFactory

from .replication_support import put

TOPIC = "t"


def exposed(root: Path) -> list[str]:
    """Every path under ``root`` (itself included) that its group or other users may use, with its mode."""
    paths = [root, *root.rglob("*")]
    return [f"{p} {stat.S_IMODE(p.stat().st_mode):04o}" for p in paths if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO)]


def test_data_files_are_owner_only(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(0, {TOPIC: 2}, {"unflushThreshold": 0}, start=False)
    data = broker.dir / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)  # as an operator's mkdir under umask 022 leaves it
    broker.start()
    put(broker, TOPIC, 0, 20)
    put(broker, TOPIC, 1, 20)

    async def transactions() -> None:
        config = MetaClientConfig(zk_connect=broker_factory.zk_connect, zk_root=broker_factory.zk_root, send_timeout_s=30)
        async with AsyncMessageSessionFactory(config) as factory:
            producer = factory.create_transactional_producer()
            await producer.begin_transaction()
            await producer.send_message(Message(TOPIC, b"in a transaction"))
            await producer.commit()
            xa = factory.create_xa_producer()
            resource = xa.xa_resource()
            xid = Xid(1, b"file-modes")
            await resource.start(xid)
            await xa.send_message(Message(TOPIC, b"in a prepared branch"))
            await resource.end(xid)
            assert await resource.prepare(xid) == resource.XA_OK

    asyncio.run(transactions())
    broker.stop()
    broker.start()  # a restart reads and rewrites checkpoints and the journal
    put(broker, TOPIC, 0, 5)
    broker.stop()
    names = {p.name for p in data.rglob("*")}
    assert any(name.endswith(".meta") for name in names) and len(names) > 8, sorted(names)  # segments and more were written
    assert exposed(data) == [], "\n".join(exposed(data))
