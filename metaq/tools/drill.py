"""Failover drills: fault the master of a running group under load, measure, check.

A drill, against a group that is already running (it never starts one):

1. find the master in ZooKeeper and its pid (its ``stats``), and the command
   line, working directory and log files it was started with (``/proc``), so a
   killed master can be restarted the same way afterwards;
2. produce a steady load through the ordinary client (which re-routes and
   retries by itself), recording every ack;
3. inject the fault: ``kill`` (SIGKILL, then restart it), ``stop`` (SIGSTOP
   past the ZooKeeper session timeout, then SIGCONT), ``partition`` (the
   master's ZooKeeper link through a Toxiproxy proxy is cut, then restored), or
   ``promote`` (a planned hand-over, as ``metaq promote`` asks it, to the lowest
   slave id the sync set names, any slave in async mode);
4. measure: detection (the master znode changed), first acked write after the
   fault (necessarily on the new master), first read of a post-fault message;
5. check: every message acked before the fault is in the new master's log at
   its acked offset (lost = those that are not; must be 0 in sync mode),
   duplicates (a payload stored twice: a resent put the broker stored again;
   0 with the idempotent producer, which the drill's load uses unless told
   otherwise, whose resends are answered as duplicates: a duplicate then fails
   the drill); wait for the old master to rejoin as a slave, and compare logs
   (``verify``).

The drill process must run on the master's machine (it signals a pid).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from ..addresses import parse_broker_url, parse_host_port
from ..client import AsyncMessageSessionFactory, Message, MetaClientConfig
from ..client.connection import Credentials
from ..errors import MetaqError
from ..protocol.codes import FORBIDDEN
from ..protocol.messages import ConfigRequest, EpochsRequest, GetRequest, OffsetRequest, PutRequest, Request, StatsRequest, TopicsRequest
from ..protocol.replies import ConfigReply, EpochsReply, FetchReply, ReplyError, StatsReply, TopicsReply
from ..record import iter_records
from ..ha.election import Handover, clear_handover, write_handover
from ..zk.acl import ZkSecurity
from ..zk.group import GroupMembers, GroupState, read_group_state, read_members
from ..zk.paths import ZkPaths
from ..zk.session import zk_session
from .verify import VerifyError, verify_group


@dataclass
class DrillReport:
    fault: str
    broker_id: int
    old_master: str
    new_master: str | None = None
    mode: str = "async"
    epoch_before: int = 0
    epoch_after: int = 0
    detection_s: float | None = None
    first_ack_s: float | None = None
    first_read_s: float | None = None
    acked_before_fault: int = 0
    #: Acks of the load that went to other groups serving the topic: not checked here.
    acked_other_groups: int = 0
    found_after: int = 0
    lost: int = 0
    acked_total: int = 0
    failed_sends: int = 0
    unknown_outcome_sends: int = 0
    duplicates: int = 0
    #: The load's producer was idempotent (resends never stored twice).
    idempotent: bool = True
    #: The old master's role once it is back in the group (``slave{k}``, ``master``); None: not (yet).
    rejoined_as: str | None = None
    #: Where it registered then: its old address, or, after a restart with ``serverPort=0``
    #: (a new port at every start), the new one.
    rejoined_at: str | None = None
    restarted_pid: int | None = None
    logs_identical: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        lost_ok = self.lost == 0 or self.mode == "async"
        # An idempotent producer's resends are answered as duplicates, never stored again:
        # a payload stored twice is then a broker bug; a plain producer's are expected.
        duplicates_ok = self.duplicates == 0 or not self.idempotent
        return self.new_master is not None and lost_ok and duplicates_ok and self.logs_identical is not False


@dataclass
class _Ack:
    topic: str
    partition: str
    offset: int
    payload: bytes
    at: float
    #: when the put was handed to the producer: ``at - sent_at`` is the put's latency, retries included
    sent_at: float = 0.0


class _Load:
    """A steady stream of small messages through the real client, every ack recorded."""

    def __init__(self, factory: AsyncMessageSessionFactory, topic: str, rate: float, tag: str) -> None:
        self.producer = factory.create_producer()
        self.topic = topic
        self.rate = rate
        self.tag = tag
        self.acks: list[_Ack] = []
        self.failed = 0
        self.unknown = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _send(self, seq: int) -> None:
        payload = f"{self.tag}-{seq}".encode()
        sent_at = time.monotonic()
        result = await self.producer.send_message(Message(self.topic, payload))
        if result.success:
            self.acks.append(_Ack(self.topic, str(result.partition), result.offset, payload, time.monotonic(), sent_at))
        elif result.outcome_unknown:
            self.unknown += 1
        else:
            self.failed += 1

    async def _run(self) -> None:
        interval = 1 / self.rate
        pending: set[asyncio.Task[None]] = set()
        for seq in itertools.count():
            if self._stop.is_set():
                break
            task = asyncio.ensure_future(self._send(seq))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(interval)
        if pending:
            await asyncio.gather(*pending)


@dataclass
class _Process:
    pid: int
    argv: list[str]
    cwd: str
    stdout: str | None
    env: dict[str, str]

    @classmethod
    def inspect(cls, pid: int) -> "_Process":
        proc = Path(f"/proc/{pid}")
        try:
            argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            cwd = os.readlink(proc / "cwd")
            env_items = [e.decode(errors="replace").split("=", 1) for e in (proc / "environ").read_bytes().split(b"\0") if b"=" in e]
        except OSError as exc:
            raise MetaqError(f"cannot inspect broker pid {pid} (the drill must run on the broker's machine): {exc}") from None
        try:
            stdout: str | None = os.readlink(proc / "fd" / "1")
            if not stdout.startswith("/") or stdout.startswith("/dev/"):
                stdout = None
        except OSError:
            stdout = None
        return cls(pid, argv, cwd, stdout, dict(e for e in env_items if len(e) == 2))

    def restart(self) -> int:
        out = open(self.stdout, "ab") if self.stdout else subprocess.DEVNULL
        process = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return process.pid


async def _request(url: str, request: Request, creds: Credentials, timeout: float = 5.0) -> Any:
    """One request over a connection of its own, logged in as ``creds``."""
    host, port = parse_broker_url(url)
    conn = await creds.open(host, port, timeout)
    try:
        return await conn.request(request.to_header(), timeout=timeout)
    finally:
        conn.close()


async def _pid(url: str, creds: Credentials) -> int:
    """The broker's process id, from its stats."""
    return int(StatsReply.of(await _request(url, StatsRequest(format="map"), creds)).get("pid", 0))


async def _read_partition(url: str, topic: str, partition: int, start: int, end: int, creds: Credentials) -> dict[int, bytes]:
    """offset -> payload of every record in [start, end) on the broker at ``url``."""
    host, port = parse_broker_url(url)
    conn = await creds.open(host, port)
    found: dict[int, bytes] = {}
    try:
        offset = start
        while offset < end:
            reply = await conn.request(GetRequest(topic=topic, partition=partition, offset=offset, max_size=4 * 1024 * 1024).to_header())
            if reply.code == 301:
                offset = int(reply["offset"])
                continue
            if not reply.ok:
                break
            records = list(iter_records(FetchReply.of(reply).body, offset))
            if not records:
                break
            for record in records:
                found[record.offset] = record.data
            offset = records[-1].offset + records[-1].size
    finally:
        conn.close()
    return found


class Drill:
    def __init__(
        self,
        zk_connect: str,
        broker_id: int,
        fault: str,
        *,
        zk_root: str = "/meta",
        topic: str | None = None,
        rate: float = 200.0,
        proxy: tuple[str, str] | None = None,
        settle_s: float = 2.0,
        rejoin_timeout_s: float = 60.0,
        creds: Credentials | None = None,
        idempotence: bool = True,
        zk_security: ZkSecurity | None = None,
    ) -> None:
        if fault not in FAULTS:
            raise MetaqError(f"unknown fault {fault!r} ({', '.join(FAULTS[:-1])} or {FAULTS[-1]})")
        if not rate > 0:
            # Checked before any fault: the load paces its sends at 1/rate s, and a load that
            # dies after the kill would leave the old master down and nothing measured.
            raise MetaqError(f"--rate must be > 0 messages per second, got {rate:g}")
        if fault == "partition" and proxy is None:
            raise MetaqError(
                "--fault partition needs the master's ZooKeeper link to run through a Toxiproxy proxy:"
                " give --proxy-url and --proxy-name (see docs/chaos.md)"
            )
        self.zk_connect = zk_connect
        self.creds = creds or Credentials()
        self.broker_id = broker_id
        self.fault = fault
        self.paths = ZkPaths(zk_root)
        self.zk_root = zk_root
        self.topic = topic
        self.rate = rate
        self.proxy = proxy
        self.settle_s = settle_s
        self.rejoin_timeout_s = rejoin_timeout_s
        self.idempotence = idempotence
        #: the group's ZooKeeper login (ZooKeeper ACLs on): a ``promote`` writes the hand-over node
        self.zk_security = zk_security
        # What a live view reads while the drill runs (the web console's timeline): the load
        # (its acks grow as they come), the report (its figures are filled in as measured)
        # and the moment of the fault (time.monotonic()); None until each exists.
        self.load: _Load | None = None
        self.report: DrillReport | None = None
        self.fault_at: float | None = None

    async def run(self) -> DrillReport:
        session = zk_session(self.zk_connect, security=self.zk_security)
        zk = await asyncio.to_thread(session.__enter__)
        try:
            return await self._run(zk)
        finally:
            await asyncio.to_thread(session.__exit__, None, None, None)

    async def _group(self, zk: KazooClient) -> GroupState:
        return await asyncio.to_thread(read_group_state, zk, self.paths, self.broker_id)

    async def _run(self, zk: KazooClient) -> DrillReport:
        state = await self._group(zk)
        if state.master_url is None:
            raise MetaqError(f"broker group {self.broker_id} has no master registered under {self.zk_root}")
        old_url = state.master_url
        try:
            topics_reply = TopicsReply.of(await _request(old_url, TopicsRequest(), self.creds))
        except ReplyError as exc:
            raise MetaqError(f"not starting the drill: the master {old_url} answered {exc}; nothing was injected") from None
        topics = topics_reply.topics
        topic = self.topic or (sorted(topics)[0] if topics else None)
        if topic is None or topic not in topics:
            raise MetaqError(f"topic {self.topic!r} is not served by broker group {self.broker_id}")
        mode = topics_reply.replication_mode
        await self._check_permissions(old_url, topic)
        pid = await _pid(old_url, self.creds)
        # A hand-over signals nothing: only the other faults need the master's process here.
        process = _Process.inspect(pid) if self.fault != "promote" else None
        handover = await self._handover_target(zk, state) if self.fault == "promote" else None
        session_ms = await self._session_timeout_ms(old_url)
        report = self.report = DrillReport(self.fault, self.broker_id, old_url, mode=mode, epoch_before=state.epoch)

        config = load_client_config(self.zk_connect, self.zk_root, session_ms, self.creds, self.idempotence)
        report.idempotent = self.idempotence
        async with AsyncMessageSessionFactory(config) as factory:
            load = self.load = _Load(factory, topic, self.rate, f"drill-{uuid.uuid4().hex[:8]}")
            load.start()
            await asyncio.sleep(1.0)
            fault_at = self.fault_at = time.monotonic()
            acked_before = list(load.acks)
            if handover is not None:
                await asyncio.to_thread(write_handover, zk, self.paths, self.broker_id, handover)
                restore = None
            else:
                assert process is not None
                restore = await self._inject(process, session_ms)
            report.detection_s = await self._wait_master_change(zk, old_url, fault_at, timeout=session_ms / 1000 * 6 + 10)
            if handover is not None:
                # As metaq promote does once the master changed: no later election is bound to it.
                await asyncio.to_thread(clear_handover, zk, self.paths, self.broker_id)
            new_state = await self._group(zk)
            report.new_master = new_state.master_url
            report.epoch_after = new_state.epoch
            epoch_starts = await self._epoch_starts(new_state.master_url, topic, topics[topic], new_state.epoch)
            first_ack = await self._first_ack_after(load, fault_at, epoch_starts, timeout=failover_budget_s(session_ms))
            if first_ack is not None:
                report.first_ack_s = first_ack.at - fault_at
                report.first_read_s = await self._first_read(new_state.master_url, first_ack, fault_at)
            await asyncio.sleep(self.settle_s)
            await load.stop()
            if restore is not None:
                await restore()
        # The client spreads the load over every group serving the topic; only the
        # drilled group's partitions can be checked against its new master.
        acks, acked_before = self._drilled(load.acks), self._drilled(acked_before)
        report.acked_before_fault = len(acked_before)
        report.acked_other_groups = len(load.acks) - len(acks)
        report.acked_total = len(acks)
        report.failed_sends = load.failed
        report.unknown_outcome_sends = load.unknown
        if report.new_master is None or report.new_master == old_url:
            report.notes.append("no other broker took over (no eligible slave?)")
            target = report.new_master or old_url
        else:
            target = report.new_master
        await self._check(report, target, topic, acked_before, acks)
        if self.fault == "kill":
            assert process is not None
            report.restarted_pid = process.restart()
            report.notes.append(f"restarted the old master as pid {report.restarted_pid}")
        rejoined = await self._wait_rejoin(zk, old_url, report.restarted_pid)
        if rejoined is not None:
            report.rejoined_as, report.rejoined_at = rejoined
            if report.rejoined_at != old_url:
                report.notes.append(f"the old master came back at {report.rejoined_at}, not {old_url} "
                                    "(serverPort=0 binds a new port at every start)")
        if report.rejoined_as is not None and report.new_master and report.new_master != old_url:
            report.logs_identical = await self._verify()
        return report

    async def _check_permissions(self, url: str, topic: str) -> None:
        """Every permission the drill needs, asked of the master before any fault, writing nothing.

        With security on the drill's user produces and reads ``topic`` (the load, the check)
        and reads the brokers' config and epochs (admin); a drill that lacks one would fault
        the master and then measure nothing.
        """
        probes = (
            ("read the brokers' config and epochs (admin)", ConfigRequest()),
            (f"consume topic {topic!r}", OffsetRequest(topic=topic, partition=0, offset=0)),
            # A put without messages passes the permission check, then is refused (400): nothing is stored.
            (f"produce to topic {topic!r}", PutRequest(topic=topic, partition=0)),
        )
        for what, request in probes:
            reply = await _request(url, request, self.creds)
            if reply.code == FORBIDDEN:
                who = f"user {self.creds.user!r}" if self.creds.user else "a drill without --user"
                raise MetaqError(f"not starting the drill: {who} may not {what} on the master {url} ({reply.message}); nothing was injected")

    def _drilled(self, acks: list[_Ack]) -> list[_Ack]:
        """The acks stored in the drilled group (partition names are ``{brokerId}-{n}``)."""
        return [a for a in acks if a.partition.split("-")[0] == str(self.broker_id)]

    async def _session_timeout_ms(self, url: str) -> int:
        reply = ConfigReply.of(await _request(url, ConfigRequest(), self.creds))
        from ..config import parse_server_ini

        return parse_server_ini(reply.raw, "master server.ini").zk.session_timeout_ms

    async def _handover_target(self, zk: KazooClient, state: GroupState) -> Handover:
        """The hand-over a ``promote`` drill asks: to the lowest slave id the sync set names (sync
        mode), any registered slave's otherwise; MetaqError before any fault if there is none."""
        members = await asyncio.to_thread(read_members, zk, self.paths, self.broker_id)
        in_sync = state.sync_set if state.sync_set is not None and state.sync_set_epoch == state.epoch else None
        eligible = sorted(k for k in members.slaves if in_sync is None or k in in_sync)
        if not eligible:
            raise MetaqError(f"not starting the drill: broker group {self.broker_id} has no slave to hand over to"
                             f" (registered: {sorted(members.slaves)}, sync set: {sorted(in_sync or [])}); nothing was injected")
        return Handover(eligible[0], state.epoch)

    async def _inject(self, process: _Process, session_ms: int) -> Any:
        if self.fault == "kill":
            os.kill(process.pid, signal.SIGKILL)
            return None
        if self.fault == "stop":
            os.kill(process.pid, signal.SIGSTOP)

            async def resume() -> None:
                os.kill(process.pid, signal.SIGCONT)

            async def resume_later() -> None:
                await asyncio.sleep(session_ms / 1000 * 2 + 1)
                await resume()

            task = asyncio.ensure_future(resume_later())

            async def restore() -> None:
                await task

            return restore
        from toxiproxy import Toxiproxy  # the partition fault drives a Toxiproxy-API server

        assert self.proxy is not None
        url, name = self.proxy
        server = Toxiproxy()
        server.update_api_consumer(*_host_port(url))
        proxy = server.get_proxy(name)
        proxy.disable()

        async def heal() -> None:
            await asyncio.sleep(session_ms / 1000 * 2 + 1)
            proxy.enable()

        task = asyncio.ensure_future(heal())

        async def restore_link() -> None:
            await task

        return restore_link

    async def _wait_master_change(self, zk: KazooClient, old_url: str, since: float, timeout: float) -> float | None:
        deadline = since + timeout
        gone_at = None
        while time.monotonic() < deadline:
            state = await self._group(zk)
            if state.master_url != old_url and gone_at is None:
                gone_at = time.monotonic() - since
            if state.master_url is not None and state.master_url != old_url:
                return gone_at
            await asyncio.sleep(0.01)
        return gone_at

    async def _epoch_starts(self, url: str | None, topic: str, partitions: int, epoch: int) -> dict[str, int]:
        """Where the new master's epoch starts in each partition: acks at or past it are its own."""
        starts: dict[str, int] = {}
        if url is None:
            return starts
        for partition in range(partitions):
            try:
                entries = EpochsReply.of(await _request(url, EpochsRequest(topic=topic, partition=partition), self.creds)).entries
            except ReplyError:
                continue  # no epochs known there (yet): no start to tell acks apart by
            for entry_epoch, start in entries:
                if entry_epoch == epoch:
                    starts[f"{self.broker_id}-{partition}"] = start
        return starts

    async def _first_ack_after(self, load: _Load, since: float, starts: dict[str, int], timeout: float) -> _Ack | None:
        """The first ack of a write stored by the new master (replies of the old one may still
        be arriving after the fault: those are told apart by their offsets)."""
        deadline = since + timeout
        while time.monotonic() < deadline:
            for ack in load.acks:
                start = starts.get(ack.partition)
                if ack.at > since and start is not None and ack.offset >= start:
                    return ack
            await asyncio.sleep(0.005)
        return None

    async def _first_read(self, url: str | None, ack: _Ack, since: float) -> float | None:
        if url is None:
            return None
        partition = int(ack.partition.split("-")[1])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                found = await _read_partition(url, ack.topic, partition, ack.offset, ack.offset + 1, self.creds)
                if found.get(ack.offset) == ack.payload:
                    return time.monotonic() - since
            except (OSError, ConnectionError):
                pass
            await asyncio.sleep(0.01)
        return None

    async def _check(self, report: DrillReport, url: str, topic: str, before: list[_Ack], acks: list[_Ack]) -> None:
        by_partition: dict[str, list[_Ack]] = {}
        for ack in acks:
            by_partition.setdefault(ack.partition, []).append(ack)
        stored: dict[str, dict[int, bytes]] = {}
        for name, items in by_partition.items():
            number = int(name.split("-")[1])
            start = min(a.offset for a in items)
            end = max(a.offset for a in items) + 1
            # Read a little past the last ack to see duplicates written by retries.
            stored[name] = await _read_partition(url, topic, number, start, end + 1024 * 1024, self.creds)
        report.found_after = sum(1 for a in before if stored.get(a.partition, {}).get(a.offset) == a.payload)
        report.lost = sum(1 for a in acks if stored.get(a.partition, {}).get(a.offset) != a.payload)
        tag_prefix = acks[0].payload.rsplit(b"-", 1)[0] if acks else b""
        seen: dict[bytes, int] = {}
        for records in stored.values():
            for payload in records.values():
                if payload.startswith(tag_prefix + b"-"):
                    seen[payload] = seen.get(payload, 0) + 1
        report.duplicates = sum(n - 1 for n in seen.values() if n > 1)

    async def _wait_rejoin(self, zk: KazooClient, old_url: str, restarted_pid: int | None) -> tuple[str, str] | None:
        """``(role, url)`` of the old master once it is registered in the group again, or None.

        It is known by its address; a master restarted by the drill is also known by a port
        its new process listens on (read from the kernel, not from what a broker says),
        since with ``serverPort=0`` it binds, and registers, a new one.
        """
        deadline = time.monotonic() + self.rejoin_timeout_s
        while time.monotonic() < deadline:
            try:
                group = await asyncio.to_thread(read_members, zk, self.paths, self.broker_id)
            except Exception:  # ZooKeeper busy or the group's node not there yet
                group = GroupMembers(None)
            ours = listening_ports(restarted_pid) if restarted_pid is not None else set()
            members = ([("master", group.master_url)] if group.master_url else []) + [(f"slave{k}", url) for k, url in group.slaves.items()]
            for role, url in members:
                if url == old_url or parse_broker_url(url)[1] in ours:
                    return role, url
            await asyncio.sleep(0.1)
        return None

    async def _verify(self) -> bool:
        """Once the rejoined broker has caught up, its log must be a prefix of the master's."""
        deadline = time.monotonic() + 30
        while True:
            try:
                report = await verify_group(self.zk_connect, self.broker_id, zk_root=self.zk_root, creds=self.creds)
                if report.ok or time.monotonic() > deadline:
                    return report.ok
            except VerifyError:
                if time.monotonic() > deadline:
                    return False
            await asyncio.sleep(0.5)


#: What a drill can do to the master.
FAULTS = ("kill", "stop", "partition", "promote")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on, as the kernel says (psutil); empty if gone."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return set()
    return {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}


def _host_port(url: str) -> tuple[str, int]:
    """``http://host:port`` (a Toxiproxy API url) -> ``(host, port)``."""
    return parse_host_port(url.split("://", 1)[-1].rstrip("/"))


def summarize(reports: list[DrillReport]) -> dict[str, Any]:
    def pct(values: list[float], q: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    acks = [r.first_ack_s for r in reports if r.first_ack_s is not None]
    detections = [r.detection_s for r in reports if r.detection_s is not None]
    reads = [r.first_read_s for r in reports if r.first_read_s is not None]
    return {
        "drills": len(reports),
        "failovers": sum(1 for r in reports if r.new_master and r.new_master != r.old_master),
        "first_ack_p50_s": statistics.median(acks) if acks else None,
        "first_ack_p99_s": pct(acks, 0.99),
        "first_ack_max_s": max(acks) if acks else None,
        "detection_p50_s": statistics.median(detections) if detections else None,
        "first_read_p50_s": statistics.median(reads) if reads else None,
        "lost_total": sum(r.lost for r in reports),
        "duplicates_total": sum(r.duplicates for r in reports),
        "all_ok": all(r.ok for r in reports),
    }


def to_json(reports: list[DrillReport]) -> str:
    return json.dumps({"runs": [asdict(r) for r in reports], "summary": summarize(reports)}, indent=2)


#: The pause between a drill load's retries of one send.
LOAD_RETRY_WAIT_S = 0.2


def failover_budget_s(session_ms: int) -> float:
    """How long a failover may take before the drill gives up on it: two session timeouts
    (the old master's session expiring, then perhaps a candidate's), plus 10 s for the
    election, truncation and the first put; never under 30 s."""
    return max(30.0, session_ms / 1000 * 2 + 10)


def load_client_config(zk_connect: str, zk_root: str, session_ms: int, creds: Credentials | None = None,
                       idempotence: bool = True) -> MetaClientConfig:
    """The drill load's client: its sends keep retrying for longer than a failover may take,
    so an acked-or-failed verdict is never cut short by the client's own retry budget."""
    budget = failover_budget_s(session_ms)
    return MetaClientConfig(
        zk_connect=zk_connect, zk_root=zk_root, retry_unknown_outcome=True, credentials=creds or Credentials(),
        send_timeout_s=max(budget, session_ms / 1000 * 4),
        send_max_attempts=max(100, int(budget / LOAD_RETRY_WAIT_S)),
        send_retry_max_wait_s=LOAD_RETRY_WAIT_S, idempotence=idempotence,
    )
