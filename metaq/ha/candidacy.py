"""This broker's candidacy while orphaned: waiting its turn among the slaves that may take over.

The election rules (election.eligibility) say whether this broker may take the master
lock at all. Two of them also say *when*, and need state kept across looks at
ZooKeeper, which lives here:

* async failover by a slave: every orphaned slave posts its log end; the most caught-up
  eligible one tries first (election.candidate_turn);
* ZooKeeper lost its data: every member posts a re-seed claim (its newest epoch); only the
  broker that led the newest one re-seeds the group, after the others' claims
  (election.reseed_turn).

Both post an ephemeral node, poll while waiting (``look_again_in`` schedules the next look
at ZooKeeper) and withdraw the node when the orphaned period ends (``withdraw``). The
coordinator (coordinator.py) owns one ``Candidacy`` and asks it from its ORPHANED entry
action only, so these steps never interleave.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ..zk.group import GroupState
from ..zk.paths import ZkPaths
from .election import (
    ZK_ERRORS,
    Candidate,
    ReseedClaim,
    candidate_turn,
    post_candidacy,
    post_reseed_claim,
    read_candidates,
    read_reseed_claims,
    reseed_turn,
    was_last_leader,
    withdraw_candidacy,
    withdraw_reseed_claim,
)
from .host import BrokerHost

log = logging.getLogger(__name__)

#: ``(go now, why)``; ``(False, None)`` while waiting for our turn (a look is scheduled).
Verdict = tuple[bool, "str | None"]


class Candidacy:
    def __init__(self, host: BrokerHost, paths: ZkPaths, look_again_in: Callable[[float], None]) -> None:
        self.host = host
        self.paths = paths
        self.broker_id = host.config.broker_id
        self._look_again_in = look_again_in
        #: This broker's stable identity (datadirs.broker_identity), known once the coordinator started.
        self.identity: str | None = None
        #: When this broker first posted its candidacy in the current orphaned period.
        self._candidate_since: float | None = None
        #: The last "not yet" reason logged (each new one is logged once).
        self._last_turn: str | None = None
        #: ZooKeeper lost its data: when we first posted our re-seed claim, and the newest
        #: epoch any posted member's history reaches (the next epoch goes above it).
        self._reseed_since: float | None = None
        self.newest_claimed = 0

    @property
    def _zk(self) -> Any:
        return self.host.registry.client

    def _log_end(self) -> int:
        return sum(l.log_end for l in self.host.store.logs().values())

    # --- async failover: the most caught-up slave first -------------------------------------

    def ranks_candidates(self, state: GroupState, mode: str) -> bool:
        """Async failover by a slave: the most caught-up one goes first (election.candidate_turn)."""
        registry = self.host.registry
        return (
            mode == "async"
            and registry.slave_id is not None
            and not was_last_leader(state, registry.url, self.identity)
        )

    async def candidate(self, state: GroupState, eligible: bool, why: str) -> Verdict:
        """Post our log end; ``(ok, why)``, or ``(False, None)`` while waiting for our turn."""
        slave_id = self.host.registry.slave_id
        now = time.monotonic()
        if self._candidate_since is None:
            self._candidate_since = now
        me = Candidate(slave_id, self._log_end(), state.epoch, eligible)
        zk = self._zk
        try:
            await self.host.registry.call(post_candidacy, zk, self.paths, self.broker_id, me)
            candidates, live = await self.host.registry.call(read_candidates, zk, self.paths, self.broker_id)
        except ZK_ERRORS as exc:
            log.warning("cannot post or read election candidates (%s); retrying", exc)
            self._look_again_in(0.2)
            return False, None
        if not eligible:
            return False, why
        turn = candidate_turn(slave_id, state.epoch, candidates, live, now - self._candidate_since)
        # Poll: a better candidate may post, win, or vanish in the meantime.
        return self._my_turn(why, *turn, poll_s=0.05, waiting="not taking over yet", level=logging.INFO)

    def _my_turn(self, why: str, ok: bool, turn: str, retry_after: float, *, poll_s: float, waiting: str, level: int) -> Verdict:
        """``(True, why; turn)`` to go now, or ``(False, None)`` while waiting (each new reason logged once, a look scheduled)."""
        if ok:
            return True, f"{why}; {turn}"
        if turn != self._last_turn:
            log.log(level, "%s: %s", waiting, turn)
            self._last_turn = turn
        self._look_again_in(min(retry_after, poll_s))
        return False, None

    # --- ZooKeeper lost its data: the member that led the newest epoch re-seeds ----------------

    def _my_claim(self, history: int, led_history: bool) -> ReseedClaim:
        assert self.identity is not None
        return ReseedClaim(self.identity, self.host.registry.url, history, led_history, self._log_end())

    async def post_reseed_claim(self, state: GroupState, history: int, led_history: bool) -> list[ReseedClaim] | None:
        """ZooKeeper lost its data (our history is past its epoch): post our claim, read everyone's.

        ``[]`` when ZooKeeper has not lost anything we know of; None if it did not answer.
        """
        if history <= state.epoch:
            self._reseed_since, self.newest_claimed = None, 0
            return []
        if self._reseed_since is None:
            self._reseed_since = time.monotonic()
        me = self._my_claim(history, led_history)
        zk = self._zk
        try:
            await self.host.registry.call(post_reseed_claim, zk, self.paths, self.broker_id, me)
            claims = await self.host.registry.call(read_reseed_claims, zk, self.paths, self.broker_id)
        except ZK_ERRORS as exc:
            log.warning("cannot post or read re-seed claims (%s); retrying", exc)
            self._look_again_in(0.2)
            return None
        self.newest_claimed = max([history, *(c.history for c in claims)])
        if not led_history:
            self._look_again_in(0.5)  # a claim may be gone with its broker, or a master may come
        return claims

    def reseed_turn(self, history: int, led_history: bool, claims: list[ReseedClaim], why: str) -> Verdict:
        """``(True, why)`` to re-seed now, or ``(False, None)`` while waiting (a look is scheduled)."""
        assert self._reseed_since is not None
        turn = reseed_turn(self._my_claim(history, led_history), claims, time.monotonic() - self._reseed_since)
        return self._my_turn(why, *turn, poll_s=0.2, waiting="not re-seeding yet", level=logging.WARNING)

    # --- the orphaned period ends ----------------------------------------------------------

    async def withdraw(self) -> None:
        """Leaving the orphaned state: our candidacy and re-seed claim (if any) are over."""
        zk = self._zk
        if self._reseed_since is not None and self.identity is not None:
            self._reseed_since, self._last_turn = None, None
            try:
                await self.host.registry.call(withdraw_reseed_claim, zk, self.paths, self.broker_id, self.identity)
            except ZK_ERRORS as exc:
                log.debug("re-seed claim not withdrawn (%s); it goes with our session", exc)
        if self._candidate_since is None:
            return
        self._candidate_since, self._last_turn = None, None
        slave_id = self.host.registry.slave_id
        if slave_id is not None:
            try:
                await self.host.registry.call(withdraw_candidacy, zk, self.paths, self.broker_id, slave_id)
            except ZK_ERRORS as exc:
                log.debug("candidacy not withdrawn (%s); it goes with our session", exc)
