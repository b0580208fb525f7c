"""Fast takeover: depose a master whose process died, without waiting out its ZooKeeper session.

Theory of operation
-------------------
A master noticed only when ZooKeeper expires its session costs a failover of about
``zk.zkSessionTimeoutMs``. When the master's *process* dies and its host stays up, the
host's kernel says so at once, in two ways nobody can fake from inside the process:

1. every TCP connection the process held is closed by the kernel (FIN or RST): our
   watch connection to the master drops, and so does its ZooKeeper connection;
2. nothing listens on its port any more: a new connection is refused (ECONNREFUSED).

Neither alone is proof of death. A fault proxy that stops listening (the chaos suite's
``cut_peers``: the proxy's listener closes, its connections are closed) gives exactly
(1) and (2) for the slave's side while the master lives and holds its ZooKeeper
session; an nftables ``reject with tcp reset`` rule would too. So a third piece of
evidence comes from ZooKeeper itself, about the session that holds the lock:

3. no ZooKeeper server of the ensemble has a connection for that session (``cons``,
   asked of every server in ``zk.zkConnect``; the session is the master node's
   ``ephemeralOwner`` as ZooKeeper reports it, never what the master says of itself).

A live master whose ZooKeeper connection is still up is listed there (a cut slave link
only, a paused process, a silent host); a server that does not answer, or refuses
``cons`` (not in its ``4lw.commands.whitelist``), leaves the question open, and an open
question is "alive". A connection can only vanish from the server if it was closed: by
the dying process's kernel, or by something that closed it on both sides (a proxy),
in which case the master's own ZooKeeper client saw the loss too and fenced itself
(SUSPENDED stops acks at once). What remains is a master that has not yet noticed: it
acks at most until its lease runs out, ``T/2`` after its last ZooKeeper round trip,
which started before evidence (3) was gathered. The coordinator covers that window:

* sync mode: nothing to wait for. The old master acks only what every member of the
  sync set reported; we are a member and stopped reporting, and it cannot drop us from
  the set without writing the set to ZooKeeper, which checks the epoch node's version:
  after our takeover that check fails. The takeover itself checks the sync set's version,
  so a set shrunk by a live master between our read and our transaction fails it too.
* async mode: the new master acks nothing until ``T/2`` after the evidence (its put
  replies say "taking over" meanwhile): the old master's lease has run out by then.

The takeover is then the ordinary election transaction (election.try_take_master) with
one more operation: ``check(epoch) ; delete(master) ; set(epoch) ; create(master)``.
The master node is deleted only if its ``ephemeralOwner`` is the session of the
evidence, read just before; any other master node (a new session of a restarted
broker, another slave's win) can only have been created together with a new epoch,
which fails the ``check``. Two slaves that race commit against the same epoch version:
one wins, the other follows it. Every election rule still applies (sync-set
membership, ``autoFailover``, the most caught-up async slave first): the evidence only
stands in for the session expiry.

When the fast path does not apply, today's path does, unchanged: the master node goes
when ZooKeeper expires the session. That is the case for a silent host or a cut link
(no drop, or a connect that times out), a paused process (the kernel still accepts
connections on its listening socket), a master restarted on the same port (it accepts
connections), a proxy in front of the master (it accepts, then closes), and any
ZooKeeper server that still lists the session or does not answer.

States and events
-----------------
One ``DeathWatch`` per broker, driven by the coordinator (``watch(url)`` when it starts
following, ``unwatch()`` when it stops) and by its own task, which watches the
connection and gathers evidence.

* IDLE: not following anyone.
* WATCHING: a connection to the master is open; waiting for it to drop.
* PROBING: the master's side closed it: is the port refusing connections?
* ASKING_ZK: refused: does any ZooKeeper server still hold the lock's session?
* DEAD: all three pieces of evidence hold; the coordinator may depose the session.
* STANDBY: evidence incomplete for this master: the session-timeout path applies.

Events: FOLLOW, DROPPED, REFUSED, ANSWERED (a connect was accepted), SILENT (a connect
timed out or failed otherwise), SESSION_GONE, SESSION_SEEN (a server lists the session,
or cannot tell, past ASK_ZK_FOR_S), UNFOLLOW.

    state      FOLLOW    DROPPED  REFUSED    ANSWERED  SILENT   SESSION_GONE  SESSION_SEEN  UNFOLLOW
    ---------  --------  -------  ---------  --------  -------  ------------  ------------  --------
    IDLE       WATCHING  .        .          .         .        .             .             IDLE
    WATCHING   WATCHING  PROBING  .          .         .        .             .             IDLE
    PROBING    WATCHING  .        ASKING_ZK  WATCHING  STANDBY  .             .             IDLE
    ASKING_ZK  WATCHING  .        .          .         .        DEAD          STANDBY       IDLE
    DEAD       WATCHING  .        .          .         .        .             .             IDLE
    STANDBY    WATCHING  .        .          .         .        .             .             IDLE

``.`` means ignored. PROBING + ANSWERED goes back to WATCHING (a fresh connection: the
master closed ours for its own reasons, or was restarted and accepts again). DEAD keeps
its evidence until the coordinator follows someone (FOLLOW) or the evidence no longer
names the lock (``names_dead_session``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..addresses import parse_broker_url
from ..client.connection import ConnectionClosed
from ..config import ZkTls
from ..zk.embedded import four_letter_word
from ..zk.group import ZK_CALL_TIMEOUT_S
from ..zk.paths import ZkPaths
from .host import BrokerHost
from .peers import open_peer

log = logging.getLogger(__name__)

#: How long a connect to the master's port may take before it counts as silent.
PROBE_TIMEOUT_S = 0.25
#: How long ZooKeeper's servers are asked (every ASK_ZK_EVERY_S) to drop the lock's session
#: from their connections: a server notices a closed client socket within milliseconds.
ASK_ZK_FOR_S = 0.3
ASK_ZK_EVERY_S = 0.02
#: A fresh watch connection after the last one failed to open, at most this often.
REWATCH_S = 0.5

_SESSION_ID = re.compile(r"\bsid=0x([0-9a-fA-F]+)")


class Phase(enum.Enum):
    IDLE = "idle"
    WATCHING = "watching"
    PROBING = "probing"
    ASKING_ZK = "asking_zk"
    DEAD = "dead"
    STANDBY = "standby"

    __hash__ = object.__hash__


class Seen(enum.Enum):
    FOLLOW = "follow"
    DROPPED = "dropped"
    REFUSED = "refused"
    ANSWERED = "answered"
    SILENT = "silent"
    SESSION_GONE = "session_gone"
    SESSION_SEEN = "session_seen"
    UNFOLLOW = "unfollow"


_ANY = tuple(Phase)
#: The transition table above: (state, event) -> next state; missing rows are ignored.
TRANSITIONS: dict[tuple[Phase, Seen], Phase] = {
    **{(phase, Seen.FOLLOW): Phase.WATCHING for phase in _ANY},
    **{(phase, Seen.UNFOLLOW): Phase.IDLE for phase in _ANY},
    (Phase.WATCHING, Seen.DROPPED): Phase.PROBING,
    (Phase.PROBING, Seen.REFUSED): Phase.ASKING_ZK,
    (Phase.PROBING, Seen.ANSWERED): Phase.WATCHING,
    (Phase.PROBING, Seen.SILENT): Phase.STANDBY,
    (Phase.ASKING_ZK, Seen.SESSION_GONE): Phase.DEAD,
    (Phase.ASKING_ZK, Seen.SESSION_SEEN): Phase.STANDBY,
}


def next_phase(phase: Phase, seen: Seen) -> Phase | None:
    """The row of the table, or None (ignored)."""
    return TRANSITIONS.get((phase, seen))


@dataclass(frozen=True)
class DeadMaster:
    """The evidence that the master at ``url`` died: its lock's session, and when it was complete."""

    url: str
    session_id: int  # the master node's ephemeralOwner (ZooKeeper's word)
    observed_at: float  # time.monotonic() when every piece of evidence held


# --- the evidence, one function per piece --------------------------------------------------------


async def probe_port(url: str, timeout: float = PROBE_TIMEOUT_S) -> Seen:
    """REFUSED if nothing listens at ``url`` (ECONNREFUSED), ANSWERED if a connection was
    accepted, SILENT if it timed out or failed any other way (unreachable, ...)."""
    host, port = parse_broker_url(url)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return Seen.REFUSED
    except (OSError, asyncio.TimeoutError):
        return Seen.SILENT
    writer.close()
    return Seen.ANSWERED


def zk_servers(connect: str) -> list[tuple[str, int]]:
    """(host, port) of every server of a connect string (a chroot suffix dropped)."""
    servers = []
    for server in connect.split("/", 1)[0].split(","):
        host, _, port = server.strip().rpartition(":")
        servers.append((host.strip("[]") or server.strip(), int(port or 2181)))
    return servers


def zk_tls_context(tls: ZkTls | None) -> ssl.SSLContext | None:
    """How to ask a TLS-only ZooKeeper its four-letter words (the broker's own ZooKeeper TLS settings)."""
    if tls is None:
        return None
    context = ssl.create_default_context(cafile=tls.ca_file)
    context.check_hostname = tls.verify_hostname
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def connected_sessions(servers: list[tuple[str, int]], tls: ssl.SSLContext | None, timeout: float = 0.5) -> set[int] | None:
    """The session ids every server lists among its client connections (``cons``); None if
    any server does not answer or does not allow ``cons``: then nobody can say a session
    has no connection."""
    sessions: set[int] = set()
    for host, port in servers:
        try:
            reply = four_letter_word(host, port, "cons", timeout=timeout, tls=tls)
        except (OSError, ssl.SSLError):
            return None
        if "queued=" not in reply:  # "cons is not executed because it is not in the whitelist."
            return None
        sessions.update(int(found, 16) for found in _SESSION_ID.findall(reply))
    return sessions


def lock_owner(client: KazooClient, paths: ZkPaths, broker_id: int, url: str) -> int | None:
    """The session holding the master node, if the node names ``url``; None otherwise."""
    try:
        data, stat = client.get_async(paths.master(broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        return None
    return stat.ephemeralOwner if data.decode("utf-8", "replace") == url else None


class _DropNotice(asyncio.Protocol):
    """Wraps a connection's protocol to learn when the peer ends the connection."""

    def __init__(self, inner: Any, dropped: "asyncio.Future[None]") -> None:
        self.inner = inner
        self.dropped = dropped

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if not self.dropped.done():
            self.dropped.set_result(None)
        return None  # close the transport: the peer is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)
        if not self.dropped.done():
            self.dropped.set_result(None)


class DeathWatch:
    """Watches the master this broker follows; gathers the evidence that its process died."""

    def __init__(self, host: BrokerHost, paths: ZkPaths, on_dead: Callable[[], None]) -> None:
        self.host = host
        self.paths = paths
        self.broker_id = host.config.broker_id
        self._on_dead = on_dead
        self.phase = Phase.IDLE
        self.url: str | None = None
        #: The evidence, once complete (phase DEAD); kept until FOLLOW.
        self.dead: DeadMaster | None = None
        #: Why the last master was not deposed this way (STANDBY), for the log and stats.
        self.standby_reason: str | None = None
        self._task: asyncio.Task[None] | None = None
        #: Takeovers this broker won on this evidence (stats ``ha_fast_takeovers``).
        self.fast_takeovers = 0

    def _move(self, seen: Seen) -> bool:
        new = next_phase(self.phase, seen)
        if new is None:
            return False
        log.debug("death watch: %s --%s--> %s", self.phase.value, seen.value, new.value)
        self.phase = new
        return True

    # --- driven by the coordinator -------------------------------------------------------

    def watch(self, url: str) -> None:
        """We follow the master at ``url`` now: watch it (fresh evidence only)."""
        self.unwatch()
        self._move(Seen.FOLLOW)
        self.url, self.dead, self.standby_reason = url, None, None
        self._task = asyncio.ensure_future(self._run(url))

    def unwatch(self) -> None:
        """We stopped following: stop watching (evidence already complete is kept)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.phase is not Phase.DEAD:
            self._move(Seen.UNFOLLOW)

    async def names_dead_session(self, url: str) -> DeadMaster | None:
        """The evidence, if the master node still names ``url`` under the dead session."""
        dead = self.dead
        if dead is None or dead.url != url:
            return None
        try:
            owner = await asyncio.to_thread(lock_owner, self.host.registry.client, self.paths, self.broker_id, url)
        except Exception as exc:  # ZooKeeper away: no evidence can be used now
            log.debug("cannot read the master node's owner (%s)", exc)
            return None
        return dead if owner == dead.session_id else None

    def forget(self) -> None:
        """The evidence was used (or found stale): never act on it twice."""
        self.dead = None
        if self.phase is Phase.DEAD:
            self.phase = Phase.IDLE

    # --- the watch task --------------------------------------------------------------------

    async def _run(self, url: str) -> None:
        try:
            while self.phase is Phase.WATCHING:
                if not await self._watch_connection(url):
                    await asyncio.sleep(REWATCH_S)
                    continue
                self._move(Seen.DROPPED)
                seen = await probe_port(url)
                self._move(seen)
                if seen is Seen.ANSWERED:
                    log.info("not deposing the master at %s: it closed our connection, but its port accepts connections"
                             " (restarted, or closed it for its own reasons)", url)
                elif seen is Seen.SILENT:
                    self._stand_by(url, "its port did not answer a connect (a silent host or link)")
                elif seen is Seen.REFUSED:
                    await self._ask_zookeeper(url)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("death watch of %s failed; the session-timeout path applies", url)

    async def _watch_connection(self, url: str) -> bool:
        """Open a connection to the master and wait until its side ends it; False if it could not be opened."""
        slave_id = self.host.registry.slave_id
        try:
            conn = await open_peer(self.host, url, slave_id, timeout=3)
        except (ConnectionClosed, OSError, ValueError) as exc:
            log.debug("death watch cannot connect to %s (%s)", url, exc)
            return False
        transport = conn._transport
        dropped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if transport is None or transport.is_closing():
            return True
        transport.set_protocol(_DropNotice(transport.get_protocol(), dropped))
        try:
            await dropped
        finally:
            conn.close()
        return True

    async def _ask_zookeeper(self, url: str) -> None:
        registry = self.host.registry
        zk_config = self.host.config.zk
        servers = zk_servers(zk_config.zk_connect)
        tls = zk_tls_context(zk_config.tls)
        deadline = time.monotonic() + ASK_ZK_FOR_S
        why = "ZooKeeper did not answer"
        while True:
            try:
                owner = await asyncio.to_thread(lock_owner, registry.client, self.paths, self.broker_id, url)
            except Exception as exc:
                owner, why = None, f"the master node could not be read ({exc})"
            if owner is None:
                # The node is gone (the session expired meanwhile) or names another broker:
                # nothing to depose; the master-node watch drives what follows.
                self._stand_by(url, why if "could not" in why else "the master node no longer names it")
                return
            sessions = await asyncio.to_thread(connected_sessions, servers, tls)
            if sessions is not None and owner not in sessions:
                self.dead = DeadMaster(url, owner, time.monotonic())
                self._move(Seen.SESSION_GONE)
                log.warning(
                    "the master at %s is dead: its connection dropped, its port refuses connections and no ZooKeeper"
                    " server holds its session 0x%x; taking over without waiting for the session to expire", url, owner,
                )
                self._on_dead()
                return
            why = ("a ZooKeeper server does not answer `cons` (not in 4lw.commands.whitelist?)" if sessions is None
                   else f"ZooKeeper still holds a connection of its session 0x{owner:x}")
            if time.monotonic() >= deadline:
                self._move(Seen.SESSION_SEEN)
                self._stand_by(url, why)
                return
            await asyncio.sleep(ASK_ZK_EVERY_S)

    def _stand_by(self, url: str, why: str) -> None:
        self.standby_reason = why
        log.info("not deposing the master at %s at once: %s; waiting for its ZooKeeper session to expire", url, why)

    def status_pairs(self) -> list[tuple[str, object]]:
        return [("ha_death_watch", self.phase.value), ("ha_fast_takeovers", self.fast_takeovers)]
