"""A slave facing a master it cannot trust, or a config it cannot use.

A fake master (an asyncio server in this process that speaks the protocol) is
registered in ZooKeeper (security off: anyone may) and a real slave process follows it:

* a ``topics`` reply naming ``../../../../tmp/x`` creates nothing outside the data path;
* a ``config`` the slave cannot parse does not end config auto-sync: the slave logs it,
  shows ``config_sync_error`` in stats, retries, and adopts the config once it is fixed;
* with security on, a master ZooKeeper names but that cannot prove the group secret gets
  asked nothing but ``auth``.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from metaq.protocol import commands as c
from metaq.protocol.frames import Frame, FrameDecoder, encode_frame
from metaq.tools.launcher import wait_until
from metaq.zk.embedded import free_port
from metaq.zk.acl import ZkSecurity
from metaq.zk.paths import ZkPaths, encode_epoch
from metaq.zk.session import zk_session

from .replication_support import stats_lines
from .trust_support import SecuredGroup


class FakeMaster:
    """Answers topics, config, epochs, offset and replica gets; what it says is set by the test."""

    def __init__(self) -> None:
        self.port = free_port("127.0.0.1")
        self.url = f"meta://127.0.0.1:{self.port}"
        self.topics: dict[str, int] = {"t": 1}
        self.config = b"this is [not an ini file"
        self.asked: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "FakeMaster":
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()
        server.close()

    def answer(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        op, opaque = header.get("op"), header.get("opaque")
        self.asked.add(str(op))
        if op == "topics":
            return c.reply_header(opaque, c.OK, topics=self.topics, role="master", epoch=1, replication_mode="async"), b""
        if op == "config":
            return c.reply_header(opaque, c.OK, checksum=1), self.config
        if op == "epochs":
            return c.reply_header(opaque, c.OK, entries=[], role="master", serving_epoch=1), b""
        if op == "offset":
            return c.reply_header(opaque, c.OK, offset=0, min_offset=0, max_offset=0), b""
        return c.reply_header(opaque, c.NOT_FOUND, "no new messages", committed=0, log_end=0, epoch=1), b""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(allow_text=False)
        while data := await reader.read(65536):
            decoder.receive_data(data)
            while isinstance(event := decoder.next_event(), Frame):
                if event.header.get("op") == "get":
                    await asyncio.sleep(0.2)  # a long-poll with nothing new
                writer.write(encode_frame(*self.answer(event.header)))
        writer.close()


def register_fake(zk_client: Any, zk_root: str, fake: FakeMaster) -> None:
    paths = ZkPaths(zk_root)
    zk_client.create(paths.epoch(0), encode_epoch(1, fake.url), makepath=True)
    zk_client.create(paths.master(0), fake.url.encode(), ephemeral=True, makepath=True)


def test_an_unparseable_master_config_is_reported_and_retried_not_fatal(broker_factory, zk_client, zk_root) -> None:  # type: ignore[no-untyped-def]
    with FakeMaster() as fake:
        register_fake(zk_client, zk_root, fake)
        slave = broker_factory(0, {}, {}, {"slaveId": 0, "autoSyncMasterConfig": True})
        wait_until(lambda: any(l.startswith("config_sync_error") for l in stats_lines(slave)), 15, message="the error in stats")
        assert "cannot adopt the master's config" in slave.log_text()
        assert "Task exception was never retrieved" not in slave.log_text()
        fake.config = b"[system]\nbrokerId=0\n[topic=t]\nnumPartitions=1\n[topic=later]\nnumPartitions=2\n"
        fake.topics = {"t": 1, "later": 2}
        wait_until(lambda: not any(l.startswith("config_sync_error") for l in stats_lines(slave)), 20, message="a retry to succeed")
        assert (slave.dir / "data" / "later-1").is_dir()


def test_topic_names_from_a_master_never_leave_the_data_path(broker_factory, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    escape = tmp_path / "escaped"
    relative = "../../../../../../../../.." + str(escape)
    with FakeMaster() as fake:
        fake.topics = {"t": 1, relative: 1}
        register_fake(zk_client, zk_root, fake)
        slave = broker_factory(0, {}, {}, {"slaveId": 0, "autoSyncMasterConfig": False})
        wait_until(lambda: any(l.startswith("config_sync_error") for l in stats_lines(slave)), 15, message="the refusal in stats")
    assert not list(Path(tmp_path).glob("escaped*")), "a directory was created outside dataPath"
    assert "may only use letters" in slave.log_text()


def test_a_secured_slave_takes_nothing_from_a_master_without_the_group_secret(broker_factory, zk, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ZooKeeper names a master (written with the group's ZooKeeper login), but the broker there
    cannot prove the group secret in the SCRAM handshake: the slave never asks it for a byte."""
    group = SecuredGroup(tmp_path / "security")
    security = ZkSecurity(zk_root, 0, group.zk_password())
    with FakeMaster() as fake, zk_session(zk.connect_string, security=security) as client:
        security.ensure_tree(client)
        security.create(client, ZkPaths(zk_root).epoch(0), encode_epoch(1, fake.url))
        security.create(client, ZkPaths(zk_root).master(0), fake.url.encode(), ephemeral=True)
        fake.topics = {"t": 1, "planted": 1}
        slave = broker_factory(0, {}, group.system, {"slaveId": 0, "autoSyncMasterConfig": False})
        wait_until(lambda: slave.log_text().count("auth reply") >= 3, 20, message="the slave to refuse the master's handshake")
        assert fake.asked == {"auth"}, f"the slave asked an unauthenticated master for {fake.asked}"
    assert not (slave.dir / "data" / "planted-0").exists()
