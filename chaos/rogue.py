"""A hostile peer: forges what used to break a group, in a loop, and counts what got through.

Used by ``python -m chaos run --rogue`` (against every broker, for the whole run) and by
tests/integration/test_trust_hostile_peer.py (against one master during a failover).

* ``RoguePeer`` (one broker, over TCP, and UDP heartbeats): ``position`` reports and
  replica ``get``s as phantom slaves (joins, uncommitted reads), replica fetches as a
  real slave claiming an ever higher epoch (what used to fence a master), and UDP
  heartbeats with made-up partitions (what used to grow a master's memory without end).
  Optionally logged in as a client (``credentials``): an authenticated user is not a broker
  and may replicate no more than an anonymous peer.
* ``RogueZk``: a ZooKeeper client without the groups' credentials writing their nodes:
  a sync set naming a phantom, a bumped epoch, a deleted master node, a phantom slave.
  Only meaningful against brokers with security on: without it ZooKeeper is open by
  design (docs/security.md) and these writes succeed.

The pre-login attacks, each counting what it sent, what was refused and what got through:

* ``BigBodyFlood`` (one broker): connections that never log in, each declaring a 16 MiB
  put and sending 4 KiB of it. Refused: closed before login (security on), or answered 503
  past ``maxBufferedRequestBytes`` (off), within ``REFUSAL_BOUND_S``; accepted: more held
  than the budget allows past that bound. A refusal that came after ``hold_s`` is counted
  as late, with how late (a figure, not a failure: see ``REFUSAL_BOUND_S``).
* ``SlotFlood`` (one broker): more connections than ``maxConnectionsPerAddress`` from one
  address, each sending only ``version``. Refused: at connect past the cap, or closed at
  the login deadline (security on); accepted: more open than the cap, or (security on) one
  still open past ``loginTimeoutMs``.
* ``TxnStartFlood`` (the masters, security on): pipelined ``transaction start`` calls as a
  user with no produce permission. Refused: any answer but XA_OK; accepted: a start that
  got XA_OK. (With security off every client is trusted to start transactions: no flood.)
* ``HeartbeatReplay`` (the masters, security on): heartbeats signed with the group's key,
  as an eavesdropper records them, replayed an hour and a minute after they were sent.
  Accepted: any answer (the master answers only heartbeats it counts).
* ``FakeRegistration`` (security on): a ZooKeeper client without credentials registers a
  made-up group (``/brokers/ids/777/master`` and a topic partition) pointing at a listener
  of its own, for a few seconds at a time. ZooKeeper lets it (world CREATE on the shared
  directories): the clients must ignore it. Refused: a round in which no client called
  the listener; accepted: any connection to it (a client trusted the forgery).
* ``PutLatencyProbe``: a logged-in producer's puts, one every 5 ms, timed (recorded in the
  history like the workload's, so the checker checks them too).

Every forgery a broker (or ZooKeeper) accepts is kept in ``accepted``; a run is clean
only if that stays empty.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from metaq.client.connection import BrokerConnection, Credentials
from metaq.ha.heartbeat import encode, encode_signed
from metaq.protocol.frames import encode_frame, encode_frame_head
from metaq.protocol.messages import PutRequest, TransactionRequest
from metaq.record import encode_batch
from metaq.security.group import GroupSecret
from metaq.zk.paths import ZkPaths, topic_node_data
from metaq.zk.tls import make_kazoo_client

#: Phantom slave ids cycle through this range (never a real member's id).
PHANTOMS = range(50, 90)


class _Looper:
    """A daemon thread running ``_run`` until ``stop()``; ``sent`` and ``accepted`` counted."""

    def __init__(self, name: str) -> None:
        self.accepted: list[Any] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=name)

    def start(self) -> "_Looper":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "accepted": len(self.accepted), "first_accepted": self.accepted[:3]}

    def _main(self) -> None:
        raise NotImplementedError


class RoguePeer(_Looper):
    """Forges against one broker until stopped; counts what it accepted."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        topic: str,
        impersonate: int,
        broker_id: int = 0,
        heartbeat_address: tuple[str, int] | None = None,
        credentials: Credentials | None = None,
        epoch: Callable[[], int] = lambda: 1,
        pause_s: float = 0.002,
    ) -> None:
        super().__init__(f"rogue-peer-{address[1]}")
        self.address = address
        self.topic = topic
        self.impersonate = impersonate  # a real slave's id: its epoch claims are the forgery
        self.broker_id = broker_id
        self.heartbeat_address = heartbeat_address or address
        self.credentials = credentials or Credentials()
        self.epoch = epoch
        self.pause_s = pause_s

    def _main(self) -> None:
        asyncio.run(self._run())

    def forgeries(self, n: int, epoch: int) -> list[dict[str, Any]]:
        phantom = PHANTOMS[n % len(PHANTOMS)]
        return [
            {"op": "position", "topic": self.topic, "partition": 0,
             "replica": {"slave_id": phantom, "epoch": epoch, "log_end": 10**9}},
            {"op": "get", "topic": self.topic, "partition": 0, "offset": 0,
             "replica": {"slave_id": phantom, "epoch": epoch, "log_end": 0}},
            {"op": "get", "topic": self.topic, "partition": 0, "offset": 0,
             "replica": {"slave_id": self.impersonate, "epoch": 10_000 + n, "log_end": 0}},
        ]

    def junk_heartbeat(self, n: int) -> bytes:
        junk = {f"junk{n}-{k}/0": k for k in range(200)}
        return encode({"kind": "hb", "role": "slave", "broker_id": self.broker_id, "slave_id": PHANTOMS[n % len(PHANTOMS)],
                       "epoch": 1, "log_ends": junk, "sent_at": 0.0})

    async def _run(self) -> None:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        n = 0
        try:
            while not self._stop.is_set():
                try:
                    conn = await self.credentials.open(*self.address, timeout=1)
                except Exception:
                    await asyncio.sleep(0.05)  # down, paused or refusing: try again
                    continue
                try:
                    epoch = self.epoch()
                    while not self._stop.is_set():
                        n += 1
                        for header in self.forgeries(n, epoch):
                            reply = await conn.request(header, timeout=5)
                            self.sent += 1
                            if reply.code == 200:
                                self.accepted.append(header)
                        udp.sendto(self.junk_heartbeat(n), self.heartbeat_address)
                        await asyncio.sleep(self.pause_s)
                except Exception:
                    pass  # the broker died or the link was cut: reconnect until stopped
                finally:
                    conn.close()
        finally:
            udp.close()


def _anonymous_zk(zk_connect: str) -> KazooClient | None:
    """A started ZooKeeper client without credentials, or None if ZooKeeper is out of reach."""
    zk = make_kazoo_client(zk_connect, timeout=10)
    try:
        zk.start(timeout=30)
    except Exception:
        zk.close()
        return None
    return zk


class RogueZk(_Looper):
    """Writes the groups' ZooKeeper nodes without their credentials until stopped."""

    def __init__(self, zk_connect: str, zk_root: str, groups: int, pause_s: float = 0.05) -> None:
        super().__init__("rogue-zk")
        self.zk_connect = zk_connect
        self.paths = ZkPaths(zk_root)
        self.groups = groups
        self.pause_s = pause_s
        self.refused = 0

    def forgeries(self, group: int, n: int) -> list[tuple[str, Callable[[KazooClient], Any]]]:
        paths, phantom = self.paths, PHANTOMS[n % len(PHANTOMS)]
        sync_set = f'{{"slaves": [{phantom}], "epoch": 1, "min": 1}}'.encode()
        return [
            (f"set {paths.sync_set(group)}", lambda zk: zk.set(paths.sync_set(group), sync_set)),
            (f"set {paths.epoch(group)}", lambda zk: zk.set(paths.epoch(group), b"99")),
            (f"delete {paths.master(group)}", lambda zk: zk.delete(paths.master(group))),
            (f"create {paths.slave(group, phantom)}",
             lambda zk: zk.create(paths.slave(group, phantom), b"meta://127.0.0.1:1", ephemeral=True)),
        ]

    def _main(self) -> None:
        zk = _anonymous_zk(self.zk_connect)
        if zk is None:
            return
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                for group in range(self.groups):
                    for what, write in self.forgeries(group, n):
                        try:
                            write(zk)
                        except NoAuthError:
                            self.refused += 1
                        except Exception:
                            continue  # no node, no quorum right now: neither accepted nor refused
                        else:
                            self.accepted.append(what)
                        self.sent += 1
                self._stop.wait(self.pause_s)
        finally:
            zk.stop()
            zk.close()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused}


# --- the pre-login attacks ---------------------------------------------------------------------

#: The brokers' defaults these attacks meet (docs/security.md, "Limits"); the chaos cluster keeps them.
MAX_BUFFERED_REQUEST_BYTES = 64 * 1024 * 1024
MAX_CONNECTIONS_PER_ADDRESS = 256
LOGIN_TIMEOUT_S = 10.0
#: How long a slot round waits for the broker to close the connections past the cap. The
#: broker closes each as it accepts it, but until it accepts it the kernel has completed the
#: connect: on a loaded machine the backlog took over 1 s (the old wait) to drain. Well under
#: the login deadline, which closes them all.
OVER_CAP_CLOSE_S = 5.0
BIG_BODY = 16 * 1024 * 1024
#: How long a big-body round waits for the broker's refusals (a close, or a reply: 403 before
#: login, 503 past the budget). A broker that holds a body keeps the connection open until a
#: deadline closes it: the login deadline (LOGIN_TIMEOUT_S, security on) or the body timeout
#: (requestBodyTimeoutMs, 30 s), never sooner; so a close or a reply within this bound is a
#: refusal, however late it came. Late ones happen on a loaded machine: the round's
#: connections queue in the kernel's accept queue behind a slot flood's 286 (the broker takes
#: them in order) while the broker, and the runner watching, get a sliver of a CPU each; the
#: broker then refuses them at their first read, having buffered nothing. ``hold_s`` stays the
#: bound of a refusal in time: one later than it is counted (``late``, ``latest_s``).
REFUSAL_BOUND_S = LOGIN_TIMEOUT_S / 2


def _connect_from(source: str, address: tuple[str, int], timeout: float = 2.0) -> socket.socket | None:
    """A TCP connection to ``address`` from another loopback address (another "host"), or None if refused."""
    try:
        return socket.create_connection(address, timeout=timeout, source_address=(source, 0))
    except OSError:
        return None


#: ``running()`` of a broker: a token (its pid) while it runs, None while it is stopped (SIGSTOP) or dead.
Running = Callable[[], Any]


def _closed_by_broker(sockets: list[socket.socket], seconds: float, *, replies_close: bool,
                      running: Running, stop: threading.Event | None = None,
                      enough: int | None = None, token: int | None | object = ...) -> dict[socket.socket, float] | None:
    """The sockets the broker closed within ``seconds`` (EOF or reset), each with the seconds
    it took from the call; with ``replies_close`` a reply counts too. With ``enough``, returns
    as soon as that many are closed.

    None when the broker did not run all along (paused or restarted by a fault): it could
    refuse nothing then, and the round proves nothing either way. "All along" starts at
    ``token``, what ``running()`` said before the round's sockets were opened (default: now):
    a round whose connections queued in the kernel while the broker was stopped meets a broker
    just resumed with seconds of backlog, which proves nothing about how fast it refuses.
    None too as soon as ``stop`` is set: for a caller that judges no round the run's end cuts short.
    """
    closed: dict[socket.socket, float] = {}
    if token is ...:
        token = running()
    if token is None:
        return None
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        started = time.monotonic()
        deadline = started + seconds
        wanted = len(sockets) if enough is None else enough
        while len(closed) < wanted and (left := deadline - time.monotonic()) > 0:
            if running() != token or (stop is not None and stop.is_set()):
                return None
            for key, _ in selector.select(min(left, 0.2)):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data or replies_close:
                    closed[sock] = time.monotonic() - started  # type: ignore[index]
                    selector.unregister(sock)
    return closed if running() == token else None


def wall_clock(at: float) -> str:
    """``at`` (``time.time()``) as the broker logs write times: local, to the millisecond."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f",{int(at * 1000) % 1000:03d}"


class BigBodyFlood(_Looper):
    """Rounds of ``per_round`` connections that each declare a 16 MiB put and send 4 KiB of it.

    A round got through when, ``refusal_bound_s`` after its bodies were sent, the broker still
    held more of them than ``may_hold`` (neither closed nor answered). A round whose refusals
    all came, but after ``hold_s``, is late: counted (``late``), with the latest (``latest_s``,
    seconds from the sends to the last refusal the round needed) and the first few rounds by
    when they opened (``late_rounds``), to be found in the broker's log.
    """

    def __init__(self, address: tuple[str, int], topic: str, *, secure: bool, running: Running, source: str = "127.0.0.2",
                 per_round: int = 6, hold_s: float = 1.5, refusal_bound_s: float = REFUSAL_BOUND_S,
                 pause_s: float = 1.0) -> None:
        super().__init__(f"big-body-flood-{address[1]}")
        self.address, self.topic, self.secure, self.source, self.running = address, topic, secure, source, running
        self.per_round, self.hold_s, self.refusal_bound_s, self.pause_s = per_round, hold_s, refusal_bound_s, pause_s
        self.refused = 0
        self.late = 0
        self.latest_s = 0.0
        self.late_rounds: list[str] = []
        #: Security off: what the budget lets the broker hold at once (the rest must be refused).
        self.may_hold = 0 if secure else MAX_BUFFERED_REQUEST_BYTES // BIG_BODY

    def _main(self) -> None:
        while not self._stop.is_set():
            self.play_round()
            self._stop.wait(self.pause_s)

    def play_round(self) -> None:
        """One round: connect, send each declared body's first 4 KiB, judge what the broker did."""
        head = encode_frame_head(PutRequest(topic=self.topic, partition=0, count=1).to_header(), BIG_BODY)
        token = self.running()  # before connecting: see _closed_by_broker
        opened_at = time.time()  # said with a round that got through or was late, to find it in the broker's log
        sockets = [s for s in (_connect_from(self.source, self.address) for _ in range(self.per_round)) if s]
        try:
            for sock in sockets:
                try:
                    sock.sendall(head + bytes(4096))
                except OSError:
                    pass
            self._judge(sockets, token, opened_at)
        finally:
            for sock in sockets:
                sock.close()

    def _judge(self, sockets: list[socket.socket], token: Any, opened_at: float) -> None:
        # Security on: closed at the first frame that is not a small login frame. Off: a 503
        # for each past the budget (they stay open); the ones within it are held until we close
        # them. The wait ends as soon as every refusal the budget calls for has come.
        must_refuse = max(0, len(sockets) - self.may_hold)
        refused = _closed_by_broker(sockets, self.refusal_bound_s, replies_close=True, running=self.running,
                                    token=token, enough=must_refuse, stop=self._stop)
        if refused is None or self._stop.is_set():
            return  # the broker was paused or restarted, or the run's end cut the round short
        self.sent += len(sockets)
        self.refused += len(refused)
        held = len(sockets) - len(refused)
        if held > self.may_hold:
            self.accepted.append(f"{held} of {len(sockets)} big bodies held (at most {self.may_hold}) "
                                 f"{self.refusal_bound_s:g} s after they were sent, round opened at {wall_clock(opened_at)}")
            return
        took = sorted(refused.values())[must_refuse - 1] if must_refuse else 0.0
        if took > self.hold_s:
            self.late += 1
            self.latest_s = max(self.latest_s, took)
            if len(self.late_rounds) < 3:
                self.late_rounds.append(f"round opened at {wall_clock(opened_at)}: refused after {took:.2f} s")

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused, "late": self.late, "late_after_s": self.hold_s,
                "latest_s": round(self.latest_s, 2), "late_rounds": self.late_rounds}


class SlotFlood(_Looper):
    """Rounds of more connections than one address may hold, each sending ``version`` and never logging in."""

    def __init__(self, address: tuple[str, int], *, secure: bool, running: Running, source: str = "127.0.0.3",
                 connections: int = MAX_CONNECTIONS_PER_ADDRESS + 30, hold_s: float = 4.0, pause_s: float = 1.0) -> None:
        super().__init__(f"slot-flood-{address[1]}")
        self.address, self.secure, self.source, self.running = address, secure, source, running
        self.connections, self.pause_s = connections, pause_s
        # Security on: held until the broker closes them at its login deadline (plus a margin).
        self.hold_s = LOGIN_TIMEOUT_S + 3.0 if secure else hold_s
        self.refused = 0

    def _main(self) -> None:
        version = encode_frame({"op": "version", "opaque": 1})
        while not self._stop.is_set():
            token = self.running()  # before connecting: see _closed_by_broker
            sockets, at_connect = [], 0
            for _ in range(self.connections):
                sock = _connect_from(self.source, self.address)
                if sock is None:
                    at_connect += 1
                    continue
                try:
                    sock.sendall(version)
                    sockets.append(sock)
                except OSError:
                    at_connect += 1
                    sock.close()
            self._judge(sockets, at_connect, token)
            for sock in sockets:
                sock.close()
            self._stop.wait(self.pause_s)

    def _judge(self, sockets: list[socket.socket], at_connect: int, token: int | None) -> None:
        # Refused at connect past the cap: the broker closes those as it accepts them.
        started = time.monotonic()
        early = _closed_by_broker(sockets, OVER_CAP_CLOSE_S, replies_close=False, running=self.running,
                                  enough=len(sockets) - MAX_CONNECTIONS_PER_ADDRESS, token=token)
        if early is None:
            return  # the broker was paused or restarted: nothing to judge
        held = [s for s in sockets if s not in early]
        if len(held) > MAX_CONNECTIONS_PER_ADDRESS:
            self.accepted.append(f"{len(held)} connections from one address held (cap {MAX_CONNECTIONS_PER_ADDRESS})")
        # A round the run's end cuts short is not judged (its connections are closed by us, not
        # the broker), so the wait ends at the stop: a secured round would hold the run's end
        # up to the login deadline and its margin (13 s) for nothing.
        late = _closed_by_broker(held, max(0.0, self.hold_s - (time.monotonic() - started)), replies_close=False,
                                 running=self.running, stop=self._stop)
        if late is None or self._stop.is_set():
            return
        if self.secure and len(late) < len(held):
            self.accepted.append(f"{len(held) - len(late)} connections never logged in and still open after "
                                 f"{self.hold_s:.0f} s (login deadline {LOGIN_TIMEOUT_S:.0f} s)")
        self.sent += self.connections
        self.refused += at_connect + len(early) + len(late)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused}


class TxnStartFlood(_Looper):
    """Rounds of ``per_round`` pipelined ``transaction start`` calls at the current master of each group."""

    def __init__(self, masters: Callable[[], list[tuple[str, int]]], credentials: Credentials, *, secure: bool,
                 per_round: int = 32, pause_s: float = 0.2) -> None:
        super().__init__("txn-start-flood")
        self.masters, self.credentials, self.secure = masters, credentials, secure
        self.per_round, self.pause_s = per_round, pause_s
        self.refused = 0
        self.started = 0

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conns: dict[tuple[str, int], BrokerConnection] = {}
        n = 0
        try:
            while not self._stop.is_set():
                for address in self.masters():
                    conn = conns.get(address)
                    if conn is None or not conn.is_open:
                        try:
                            conn = conns[address] = await self.credentials.open(*address, timeout=2)
                        except Exception:
                            continue  # down, paused or refusing
                    # Short branches: with security off they are granted, and must not outlive the run.
                    headers = [TransactionRequest(action="start", xid=f"rogue-{n + i}", timeout_s=1).to_header()
                               for i in range(self.per_round)]
                    n += self.per_round
                    try:
                        replies = await asyncio.gather(*(conn.request(h, timeout=5) for h in headers))
                    except Exception:
                        conn.close()
                        conns.pop(address, None)
                        continue
                    self.sent += len(replies)
                    granted = sum(1 for r in replies if r.ok and r.get("xa_code") == 0)
                    self.started += granted
                    self.refused += len(replies) - granted
                    if self.secure and granted:
                        self.accepted.append(f"{granted} transactions started at {address} by a user without produce rights")
                await asyncio.sleep(self.pause_s)
        finally:
            for conn in conns.values():
                conn.close()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused, "started": self.started}


class HeartbeatReplay(_Looper):
    """Replays of signed heartbeats (a real slave's id, the group's key) recorded long enough ago."""

    def __init__(self, masters: Callable[[], list[tuple[int, tuple[str, int]]]], secret_file: Callable[[int], Path],
                 slave_id: int, topic: str, *, per_round: int = 50, pause_s: float = 1.0) -> None:
        super().__init__("heartbeat-replay")
        self.masters, self.secret_file, self.slave_id, self.topic = masters, secret_file, slave_id, topic
        self.per_round, self.pause_s = per_round, pause_s
        self.refused = 0
        self.answered = 0

    def _main(self) -> None:
        keys: dict[int, bytes] = {}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))  # the slaves' registered host: where answers may go
            while not self._stop.is_set():
                for group, address in self.masters():
                    key = keys.get(group) or keys.setdefault(group, GroupSecret.load(self.secret_file(group), group).heartbeat_key())
                    message = {"kind": "hb", "role": "slave", "broker_id": group, "slave_id": self.slave_id, "epoch": 1,
                               "log_ends": {f"{self.topic}/0": 1}}
                    # An hour old, and a minute old (past the 10 s window): neither may count. (One
                    # recorded within the window counts if newer than the slave's last, e.g. at a
                    # master that took over since: the window is what bounds that.)
                    for age_s in (3600.0, 60.0):
                        recorded = encode_signed({**message, "sent_at": time.time() - age_s}, key)
                        for _ in range(self.per_round // 2):
                            udp.sendto(recorded, address)
                            self.sent += 1
                answered = self._answers(udp, 0.5)
                self.answered += answered
                self.refused = self.sent - self.answered
                if answered:
                    self.accepted.append(f"{answered} replayed heartbeats answered")
                self._stop.wait(self.pause_s)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused}

    @staticmethod
    def _answers(udp: socket.socket, seconds: float) -> int:
        udp.settimeout(seconds)
        count = 0
        try:
            while True:
                udp.recvfrom(65536)
                count += 1
        except (socket.timeout, OSError):
            return count


class FakeRegistration(_Looper):
    """A made-up group registered in ZooKeeper without credentials, pointing at a listener that counts who calls."""

    FAKE_GROUP = 777

    def __init__(self, zk_connect: str, zk_root: str, topic: str, *, hold_s: float = 3.0, pause_s: float = 1.0) -> None:
        super().__init__("fake-registration")
        self.zk_connect, self.paths, self.topic = zk_connect, ZkPaths(zk_root), topic
        self.hold_s, self.pause_s = hold_s, pause_s
        self.refused = 0
        self.registered = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)

    def _nodes(self) -> list[tuple[str, bytes]]:
        group, port = self.FAKE_GROUP, self._listener.getsockname()[1]
        # numParts within the clients' cap: a registration that looks like any small group's.
        return [(self.paths.master(group), f"meta://127.0.0.1:{port}".encode()),
                (self.paths.topic_pub_node(self.topic, group), topic_node_data(4, group))]

    def _main(self) -> None:
        zk = _anonymous_zk(self.zk_connect)
        if zk is None:
            return
        try:
            while not self._stop.is_set():
                self.sent += 1
                for path, data in self._nodes():
                    try:
                        zk.create(path, data, makepath=True)
                        self.registered += 1
                    except Exception:
                        pass  # NoAuth (refused by ZooKeeper: fine too), or no quorum right now
                deadline = time.monotonic() + self.hold_s
                called = 0
                while time.monotonic() < deadline and not self._stop.is_set():
                    try:
                        caller, where = self._listener.accept()
                    except (socket.timeout, OSError):
                        continue
                    caller.close()
                    called += 1
                    self.accepted.append(f"a client connected to the fake group {self.FAKE_GROUP} from {where}")
                if not called and time.monotonic() >= deadline:
                    self.refused += 1  # held a whole round, and nobody followed it
                self._withdraw(zk)
                self._stop.wait(self.pause_s)
        finally:
            self._withdraw(zk)
            zk.stop()
            zk.close()
            self._listener.close()

    def _withdraw(self, zk: KazooClient) -> None:
        for path in (self.paths.topic_pub_node(self.topic, self.FAKE_GROUP), self.paths.master(self.FAKE_GROUP),
                     self.paths.broker(self.FAKE_GROUP)):
            try:
                zk.delete(path, recursive=True)
            except Exception:
                pass

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "refused": self.refused, "registered": self.registered}


def percentile(samples: list[float], fraction: float) -> float:
    """The ``fraction`` percentile (nearest rank) of ``samples`` (0.0 when empty)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


class PutLatencyProbe:
    """A logged-in producer's put latency: one put every ``interval_s`` for a while, each recorded in ``history``.

    ``master()`` gives the current master's (url, client address) of ``group``; the puts go to
    partition 0 of ``topic`` there, one message each, over one connection. They are sent
    from a process of their own: in the runner's process every attack thread would hold the
    GIL against the probe, and the client's delay would be counted as the broker's. Each
    put's invoke is recorded before it is sent and its ack after it came back (the child
    asks and waits), so the history stays true for the checker.
    """

    def __init__(self, master: Callable[[], tuple[str, tuple[str, int]] | None], credentials: Credentials, topic: str,
                 group: int, history: Any, interval_s: float = 0.005) -> None:
        self.master, self.credentials, self.topic, self.group = master, credentials, topic, group
        self.history, self.interval_s = history, interval_s

    def measure(self, seconds: float, phase: str, min_acked: int = 0, max_seconds: float | None = None) -> list[float]:
        """Seconds each acked put took, over ``seconds`` (blocking), and on past them until
        ``min_acked`` puts were acked or ``max_seconds`` passed."""
        found = self.master()
        if found is None:
            return []
        url, (host, port) = found
        partition = f"{self.topic}/{self.group}-0"
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        child = context.Process(target=_timed_puts, daemon=True, name=f"latency-{phase}", args=(
            theirs, host, port, self.credentials.user, self.credentials.password, self.topic, seconds,
            max(seconds, max_seconds or seconds), min_acked, self.interval_s, f"latency-{phase}"))
        child.start()
        theirs.close()
        latencies: list[float] = []
        open_ops: dict[str, int] = {}
        try:
            while True:
                try:
                    event = ours.recv()
                except EOFError:
                    break
                kind, value = event[0], event[1] if len(event) > 1 else None
                if kind == "invoke":
                    open_ops[value] = self.history.invoke("latency", "put", value, partition)
                    ours.send(True)  # recorded: the child may send it now
                elif kind == "ok":
                    _, _, offset, epoch, took = event
                    self.history.ok(open_ops.pop(value), offset, epoch, url)
                    latencies.append(took)
                elif kind == "info":
                    self.history.info(open_ops.pop(value), event[2])
                else:
                    break
        finally:
            for op in open_ops.values():
                self.history.info(op, "unknown: the probe ended before its reply")
            ours.close()
            child.join(10)
        return latencies


def _timed_puts(pipe: Any, host: str, port: int, user: str | None, password: str | None, topic: str,
                seconds: float, max_seconds: float, min_acked: int, interval_s: float, prefix: str) -> None:
    """The probe's process: puts for ``seconds`` (up to ``max_seconds`` until ``min_acked`` were acked),
    each announced on ``pipe`` before it is sent and reported after."""

    async def run() -> None:
        try:
            conn = await Credentials(user, password).open(host, port, timeout=5)
        except Exception:
            return
        try:
            started_at = time.monotonic()
            deadline, last_deadline = started_at + seconds, started_at + max_seconds
            seq = acked = 0
            while (now := time.monotonic()) < deadline or (acked < min_acked and now < last_deadline):
                value = f"{prefix}-{seq}"
                seq += 1
                pipe.send(("invoke", value))
                pipe.recv()
                started = time.perf_counter()
                try:
                    reply = await conn.request(PutRequest(topic=topic, partition=0, count=1).to_header(),
                                               encode_batch([(value.encode(), None)]), timeout=3)
                except Exception as exc:
                    pipe.send(("info", value, f"unknown: {exc}"))
                    return
                took = time.perf_counter() - started
                if reply.ok:
                    acked += 1
                    pipe.send(("ok", value, int(reply["offset"]), reply.get("epoch"), took))
                else:  # not stored for a 503, but a 5xx may be: unknown either way for the checker
                    pipe.send(("info", value, f"{reply.code} {reply.message}"))
                await asyncio.sleep(max(0.0, interval_s - took))
        finally:
            conn.close()

    try:
        asyncio.run(run())
    finally:
        pipe.send(("done",))
        pipe.close()
