"""Fast takeover: depose a master whose process died, without waiting out its ZooKeeper session.

Theory of operation
-------------------
A master noticed only when ZooKeeper expires its session costs a failover of about
``zk.zkSessionTimeoutMs`` (``T``). When the master's *process* dies and its host stays up,
the host's kernel says so at once:

1. every TCP connection the process held is closed by the kernel (FIN or RST): our
   watch connection to the master drops;
2. nothing listens on its port any more: a new connection is refused (ECONNREFUSED).

Neither is proof of death. A fault proxy that stops listening (the chaos suite's
``cut_peers``: the proxy's listener closes, and so do its connections) gives exactly (1)
and (2) while the master lives and holds its ZooKeeper session; so would an nftables
``reject with tcp reset`` rule. (The chaos suite's hosts mode drops packets silently: no
refusal, so it never gets this far.) The third piece of evidence therefore comes through
ZooKeeper, from the session that holds the lock:

3. the lock's session does not answer a challenge within ``answer_wait_s`` (``T/16``,
   50 to 250 ms). The slave creates ``liveness/ask-{nonce}`` under the group's node;
   every broker whose session holds the lock answers from its ZooKeeper watch thread
   (not its event loop, so a busy broker answers too) by creating the ephemeral
   ``liveness/ans-{nonce}-{its session id}``. The answer counts only if ZooKeeper reports
   it owned (``ephemeralOwner``) by the session that holds the master node: ZooKeeper's
   word, never what a peer says of itself. With ACLs on, only the group writes there.

A master that is alive and talks to ZooKeeper answers in milliseconds, whatever its
replication link does: a cut slave link, a closed proxy listener, a reject rule. One
that does not answer is dead, or cannot reach ZooKeeper either. The latter stops acking
on its own: its ZooKeeper client sees the connection go (SUSPENDED fences it at once) or
its lease runs out, ``T/2`` after its last ZooKeeper round trip, which started before
the challenge. The coordinator covers that window:

* sync mode: nothing to wait for. The old master acks only what every member of the
  sync set reported; we are a member and stopped reporting, and it cannot drop us from
  the set without writing the set to ZooKeeper, which checks the epoch node's version:
  after our takeover that check fails. The takeover itself checks the sync set's version,
  so a set shrunk by a live master between our read and our transaction fails it too.
* async mode: the new master acks nothing until ``T/2`` after the evidence was complete
  (its put replies say "taking over" meanwhile): by then the old master's lease has run out.

The takeover is the ordinary election transaction (election.try_take_master) with one
more operation: ``check(epoch) ; set(epoch) ; delete(master) ; create(master)``. The
master node is deleted only if its ``ephemeralOwner`` is the session of the evidence,
read just before; any other master node can only have been created together with a new
epoch, which fails the ``check``. Two slaves that race commit against the same epoch
version: one wins, the other follows it. Every election rule still applies (sync-set
membership, ``autoFailover``, the most caught-up async slave first): the evidence only
stands in for the session's expiry.

When the fast path does not apply, the session-timeout path does, unchanged: a silent
host or a cut link (no drop, or a connect that times out), a paused process (the kernel
still accepts connections on its listening socket), a master restarted on the same port
(it accepts connections), a proxy in front of a dead master (it accepts, then closes), a
master that answers the challenge.

States and events
-----------------
One ``DeathWatch`` per broker, driven by the coordinator (``watch(url)`` when it starts
following, ``unwatch()`` when it stops) and by its own task, which watches the
connection and gathers the evidence.

* IDLE: not following anyone.
* WATCHING: a connection to the master is open; waiting for it to drop.
* PROBING: the master's side closed it: is the port refusing connections?
* CHALLENGING: refused: does the lock's session answer through ZooKeeper?
* DEAD: all three pieces of evidence hold; the coordinator may depose the session.
* STANDBY: not dead by this evidence: the session-timeout path applies to this master.

Events: FOLLOW, DROPPED, REFUSED, ANSWERED (a connect was accepted), SILENT (a connect
timed out or failed otherwise), UNANSWERED (the challenge was not answered by the lock's
session in time), ALIVE (it was answered, or ZooKeeper could not be asked), RETRY
(STANDBY_RETRY_S after STANDBY), UNFOLLOW.

    state        FOLLOW    DROPPED  REFUSED      ANSWERED  SILENT   UNANSWERED  ALIVE    RETRY     UNFOLLOW
    -----------  --------  -------  -----------  --------  -------  ----------  -------  --------  --------
    IDLE         WATCHING  .        .            .         .        .           .        .         IDLE
    WATCHING     WATCHING  PROBING  .            .         .        .           .        .         IDLE
    PROBING      WATCHING  .        CHALLENGING  WATCHING  STANDBY  .           .        .         IDLE
    CHALLENGING  WATCHING  .        .            .         .        DEAD        STANDBY  .         IDLE
    DEAD         WATCHING  .        .            .         .        .           .        .         DEAD
    STANDBY      WATCHING  .        .            .         .        .           .        WATCHING  IDLE

``.`` means ignored. PROBING + ANSWERED goes back to WATCHING with a fresh connection
(the master closed ours for its own reasons, or was restarted and accepts again).
STANDBY + RETRY watches the same master again (a healed link: if it dies later, the
fast path applies again). DEAD + UNFOLLOW stays DEAD: the coordinator stops following
on its way to use the evidence; it is dropped when the coordinator follows someone
(FOLLOW), uses it (``forget``), or finds the master node owned by another session, or the
evidence older than the session timeout (``names_dead_session``; a slave that may not use
the evidence looks again at that moment, and follows the master again: a dead session would
have expired by then, so one that still holds the lock lives -- its answer to the
challenge was late, on an overloaded machine for instance). Kept, evidence that was wrong
would make every later event naming that live session "its process died", and the slave
would never follow it again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..addresses import parse_broker_url
from ..client.connection import ConnectionClosed
from ..zk.group import ZK_CALL_TIMEOUT_S
from ..zk.paths import ZkPaths
from .host import BrokerHost
from .peers import open_peer

log = logging.getLogger(__name__)

#: How long a connect to the master's port may take before it counts as silent.
PROBE_TIMEOUT_S = 0.25
#: After a drop, a port that accepts is probed again for this long (see probe_after_drop).
PROBE_AGAIN_S = 0.1
PROBE_AGAIN_EVERY_S = 0.02
#: How many times a probe that found the port silent is made again before standing by.
SILENT_PROBES_AGAIN = 2
#: How long the lock's session has to answer a challenge: ``T/16``, within these bounds. A
#: live master answers from its ZooKeeper watch thread in a few milliseconds (the log says
#: how many when it does).
ANSWER_WAIT_MIN_S = 0.05
ANSWER_WAIT_MAX_S = 0.25
#: How often the answer is looked for while waiting.
ANSWER_POLL_S = 0.01
#: A fresh watch connection after the last one failed to open, at most this often.
REWATCH_S = 0.5
#: STANDBY watches the same master again after this long.
STANDBY_RETRY_S = 1.0


def answer_wait_s(session_timeout_ms: int) -> float:
    return min(ANSWER_WAIT_MAX_S, max(ANSWER_WAIT_MIN_S, session_timeout_ms / 16000))


class Phase(enum.Enum):
    IDLE = "idle"
    WATCHING = "watching"
    PROBING = "probing"
    CHALLENGING = "challenging"
    DEAD = "dead"
    STANDBY = "standby"

    __hash__ = object.__hash__


class Seen(enum.Enum):
    FOLLOW = "follow"
    DROPPED = "dropped"
    REFUSED = "refused"
    ANSWERED = "answered"
    SILENT = "silent"
    UNANSWERED = "unanswered"
    ALIVE = "alive"
    RETRY = "retry"
    UNFOLLOW = "unfollow"


_ANY = tuple(Phase)
#: The transition table above: (state, event) -> next state; missing rows are ignored.
TRANSITIONS: dict[tuple[Phase, Seen], Phase] = {
    **{(phase, Seen.FOLLOW): Phase.WATCHING for phase in _ANY},
    **{(phase, Seen.UNFOLLOW): Phase.IDLE for phase in _ANY if phase is not Phase.DEAD},
    (Phase.DEAD, Seen.UNFOLLOW): Phase.DEAD,
    (Phase.WATCHING, Seen.DROPPED): Phase.PROBING,
    (Phase.PROBING, Seen.REFUSED): Phase.CHALLENGING,
    (Phase.PROBING, Seen.ANSWERED): Phase.WATCHING,
    (Phase.PROBING, Seen.SILENT): Phase.STANDBY,
    (Phase.CHALLENGING, Seen.UNANSWERED): Phase.DEAD,
    (Phase.CHALLENGING, Seen.ALIVE): Phase.STANDBY,
    (Phase.STANDBY, Seen.RETRY): Phase.WATCHING,
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


async def probe_after_drop(url: str) -> Seen:
    """``probe_port`` right after our connection dropped, again a few times while it answers.

    A dying process's kernel closes its descriptors one by one: our connection's may go
    before the listening socket's, and a connect in between is still accepted (then
    reset). A port that keeps accepting for PROBE_AGAIN_S is a live listener.
    """
    seen = await probe_port(url)
    deadline = time.monotonic() + PROBE_AGAIN_S
    while seen is Seen.ANSWERED and time.monotonic() < deadline:
        await asyncio.sleep(PROBE_AGAIN_EVERY_S)
        seen = await probe_port(url)
    # A connect that timed out may be our own event loop's delay on a loaded machine, not the
    # host's silence (a fresh-clone CI run beside chaos runs took the session-timeout path
    # after a kill -9 this way): asked again, a dead process's port refuses at once, a silent
    # host stays silent. Only REFUSED leads on to the challenge, so this never deposes sooner.
    for _ in range(SILENT_PROBES_AGAIN):
        if seen is not Seen.SILENT:
            break
        seen = await probe_port(url)
    return seen


def liveness_path(paths: ZkPaths, broker_id: int) -> str:
    """Where challenges to the lock's session and their answers live (docs/zookeeper.md)."""
    return f"{paths.broker(broker_id)}/liveness"


def challenge(client: KazooClient, paths: ZkPaths, broker_id: int, owner: int, wait_s: float) -> float | None:
    """Ask the session ``owner`` (the lock's) to answer: the seconds it took, or None if it
    did not within ``wait_s`` (or another session answered).

    Raises a ZooKeeper error when the challenge cannot be posted (then nothing is known).
    """
    base = liveness_path(paths, broker_id)
    nonce = secrets.token_hex(8)
    # Each answering session names its answer: a fenced broker of an earlier term (it answers
    # too) can never take the name of the lock holder's answer.
    ask, answer = f"{base}/ask-{nonce}", f"{base}/ans-{nonce}-{owner:x}"
    client.create_async(ask, b"", ephemeral=True, makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
    try:
        asked = time.monotonic()
        while True:
            stat = client.exists_async(answer).get(timeout=ZK_CALL_TIMEOUT_S)
            if stat is not None:
                # ZooKeeper's word on who answered: only the lock's own session counts.
                return time.monotonic() - asked if stat.ephemeralOwner == owner else None
            if time.monotonic() - asked >= wait_s:
                return None
            time.sleep(ANSWER_POLL_S)
    finally:
        for path in (answer, ask):
            client.delete_async(path)  # not waited for: a leftover goes with its session


def answer_challenges(client: KazooClient, paths: ZkPaths, broker_id: int, holds_lock: Callable[[], bool]) -> None:
    """While ``holds_lock()``, answer every challenge posted to this group (on kazoo's thread)."""
    base = liveness_path(paths, broker_id)
    client.ensure_path(base)

    def answer(children: list[str]) -> bool:
        session = client.client_id[0] if client.client_id else None
        if session is not None and holds_lock():
            present = set(children)
            for child in children:
                mine = f"ans-{child[4:]}-{session:x}"
                if child.startswith("ask-") and mine not in present:
                    client.create_async(f"{base}/{mine}", b"", ephemeral=True)
        return True

    client.ChildrenWatch(base, answer)


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
        self._answered_logged = False
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
        self.url, self.dead, self.standby_reason, self._answered_logged = url, None, None, False
        self._task = asyncio.ensure_future(self._run(url))

    def unwatch(self) -> None:
        """We stopped following: stop watching (evidence already complete is kept)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._move(Seen.UNFOLLOW)

    async def names_dead_session(self, url: str) -> DeadMaster | None:
        """The evidence, if the master node still names ``url`` under the dead session.

        Evidence older than the session timeout is dropped: had the session died, ZooKeeper
        would have expired it by now, so a node it still holds belongs to a live session
        (its answer to the challenge came late, say on an overloaded machine)."""
        dead = self.dead
        if dead is None or dead.url != url:
            return None
        if time.monotonic() - dead.observed_at > self.host.config.zk.session_timeout_ms / 1000:
            log.info("the evidence that the master at %s died is older than its session timeout and its session"
                     " still holds the lock: it lives; following it again", url)
            self.forget()
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
            while self.phase in (Phase.WATCHING, Phase.STANDBY):
                if self.phase is Phase.STANDBY:
                    await asyncio.sleep(STANDBY_RETRY_S)
                    self._move(Seen.RETRY)
                    continue
                if not await self._watch_connection(url):
                    await asyncio.sleep(REWATCH_S)
                    continue
                self._move(Seen.DROPPED)
                seen = await probe_after_drop(url)
                self._move(seen)
                if seen is Seen.ANSWERED:
                    # Logged once per master followed: a master that keeps closing our connection
                    # (its connection limits, idle timeout) would repeat it.
                    level, self._answered_logged = (logging.DEBUG if self._answered_logged else logging.INFO), True
                    log.log(level, "not deposing the master at %s: it closed our connection, but its port accepts"
                            " connections (restarted, or closed it for its own reasons)", url)
                    await asyncio.sleep(REWATCH_S)
                elif seen is Seen.SILENT:
                    self._stand_by(url, "its port did not answer a connect (a silent host or link)")
                elif seen is Seen.REFUSED:
                    await self._challenge(url)
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

    async def _challenge(self, url: str) -> None:
        zk = self.host.registry.client
        wait_s = answer_wait_s(self.host.config.zk.session_timeout_ms)
        try:
            owner = await asyncio.to_thread(lock_owner, zk, self.paths, self.broker_id, url)
            answered = None if owner is None else await asyncio.to_thread(challenge, zk, self.paths, self.broker_id, owner, wait_s)
        except Exception as exc:  # ZooKeeper away or slow: nothing is known
            self._move(Seen.ALIVE)
            self._stand_by(url, f"ZooKeeper could not be asked ({str(exc) or type(exc).__name__})")
            return
        if owner is None:
            # The node is gone (the session expired meanwhile) or names another broker now:
            # nothing to depose; the master-node watch drives what follows.
            self._move(Seen.ALIVE)
            self._stand_by(url, "the master node no longer names it")
            return
        if answered is not None:
            self._move(Seen.ALIVE)
            self._stand_by(url, f"its ZooKeeper session 0x{owner:x} answered in {answered * 1000:.0f} ms, so it lives"
                                " (only our link to it is cut)")
            return
        self.dead = DeadMaster(url, owner, time.monotonic())
        self._move(Seen.UNANSWERED)
        log.warning(
            "the master at %s is dead: its connection dropped, its port refuses connections and its ZooKeeper session"
            " 0x%x did not answer within %.0f ms; taking over without waiting for the session to expire", url, owner,
            wait_s * 1000,
        )
        self._on_dead()

    def _stand_by(self, url: str, why: str) -> None:
        self.standby_reason = why
        log.info("not deposing the master at %s at once: %s; waiting for its ZooKeeper session to expire", url, why)

    def status_pairs(self) -> list[tuple[str, object]]:
        return [("ha_death_watch", self.phase.value), ("ha_fast_takeovers", self.fast_takeovers)]
