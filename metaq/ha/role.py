"""The HA role state machine of one broker: pure transitions, no I/O.

Theory of operation
-------------------
Every broker of a group (same ``brokerId``) runs this machine. ZooKeeper alone
decides who is master: the ephemeral ``/brokers/ids/{id}/master`` znode is the
lock, ``/brokers/ids/{id}/epoch`` numbers the masters (see election.py). The
coordinator (coordinator.py) watches ZooKeeper, turns what it sees into events,
feeds them to this machine, and carries out the new state:

* FOLLOWING: replicate from the registered master, after cutting any divergent
  tail of our own log (epoch-based truncation); serve reads up to the master's
  committed offset.
* ORPHANED: a slave with no master registered; serve what we have, and ask the
  election rules whether we may take over.
* ELECTING: try the ZooKeeper transaction that takes the lock and the next epoch.
* LEADING: the master. Acks puts only while the ZooKeeper lease holds.
* FENCED: we were leading but lost contact with ZooKeeper (or saw a higher
  epoch): acks stop at once; if the same session comes back with our epoch
  still current we lead again, otherwise we start over (and, since someone else
  now leads, become their slave).

A broker's *preference* (started with or without ``--slave``) only matters for a
group that never had a master: the first master is a broker started without it.

Transition table (event -> new state; anything not listed is ignored, which
keeps duplicate and late ZooKeeper events harmless):

    state       MASTER_SEEN  MASTER_GONE  ELIGIBLE   WON      LOST     SUSPENDED  RECONNECTED  SESSION_LOST  HIGHER_EPOCH  STOP
    ----------  -----------  -----------  ---------  -------  -------  ---------  -----------  ------------  ------------  -------
    STARTING    FOLLOWING    ORPHANED     .          .        .        .          .            .             .             STOPPED
    FOLLOWING   FOLLOWING*   ORPHANED     .          .        .        .          .            .             .             STOPPED
    ORPHANED    FOLLOWING    .            ELECTING   .        .        .          .            .             .             STOPPED
    ELECTING    FOLLOWING    .            .          LEADING  ORPHANED .          .            ORPHANED      .             STOPPED
    LEADING     .            FENCED       .          .        .        FENCED     .            FENCED        FENCED        STOPPED
    FENCED      FOLLOWING    ORPHANED     .          .        .        .          LEADING      ORPHANED      .             STOPPED

    * FOLLOWING + MASTER_SEEN with another address re-enters FOLLOWING (new master:
      truncate against it, then follow).

FENCED + RECONNECTED is only sent when the session survived and the epoch in
ZooKeeper is still ours; FENCED + MASTER_GONE is sent once the session is known
to be lost (our lock is gone). Guarantees kept by the coordinator:

* writes are acked only in LEADING, with a valid lease (lease.py);
* LEADING is entered only by winning the election transaction, so two brokers
  can never both be LEADING in the same epoch, and epochs only grow;
* FOLLOWING starts with truncation to the master's end of our last epoch, so
  after it our log is a prefix of the master's again.
"""

from __future__ import annotations

import enum


class Role(enum.Enum):
    STARTING = "starting"
    FOLLOWING = "following"
    ORPHANED = "orphaned"
    ELECTING = "electing"
    LEADING = "leading"
    FENCED = "fenced"
    STOPPED = "stopped"


class Event(enum.Enum):
    MASTER_SEEN = "master_seen"
    MASTER_GONE = "master_gone"
    ELIGIBLE = "eligible"
    WON = "won"
    LOST = "lost"
    SUSPENDED = "suspended"
    RECONNECTED = "reconnected"
    SESSION_LOST = "session_lost"
    HIGHER_EPOCH = "higher_epoch"
    STOP = "stop"


S, E = Role, Event

TRANSITIONS: dict[tuple[Role, Event], Role] = {
    (S.STARTING, E.MASTER_SEEN): S.FOLLOWING,
    (S.STARTING, E.MASTER_GONE): S.ORPHANED,
    (S.FOLLOWING, E.MASTER_SEEN): S.FOLLOWING,
    (S.FOLLOWING, E.MASTER_GONE): S.ORPHANED,
    (S.ORPHANED, E.MASTER_SEEN): S.FOLLOWING,
    (S.ORPHANED, E.ELIGIBLE): S.ELECTING,
    (S.ELECTING, E.MASTER_SEEN): S.FOLLOWING,
    (S.ELECTING, E.WON): S.LEADING,
    (S.ELECTING, E.LOST): S.ORPHANED,
    (S.ELECTING, E.SESSION_LOST): S.ORPHANED,
    (S.LEADING, E.MASTER_GONE): S.FENCED,
    (S.LEADING, E.SUSPENDED): S.FENCED,
    (S.LEADING, E.SESSION_LOST): S.FENCED,
    (S.LEADING, E.HIGHER_EPOCH): S.FENCED,
    (S.FENCED, E.MASTER_SEEN): S.FOLLOWING,
    (S.FENCED, E.MASTER_GONE): S.ORPHANED,
    (S.FENCED, E.RECONNECTED): S.LEADING,
    (S.FENCED, E.SESSION_LOST): S.ORPHANED,
}
for _state in Role:
    if _state is not Role.STOPPED:
        TRANSITIONS[(_state, Event.STOP)] = Role.STOPPED


class RoleMachine:
    """Holds the current role; ``handle`` returns the new role, or None if the event is ignored."""

    def __init__(self) -> None:
        self.state = Role.STARTING

    def handle(self, event: Event) -> Role | None:
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            return None
        self.state = new
        return new

    @property
    def may_ack_writes(self) -> bool:
        return self.state is Role.LEADING

