"""Who answered: a slave acts on a peer's answer about the group's log only if it came from
the acting master of the epoch ZooKeeper names.

Theory of operation
-------------------
A rejoining broker cuts its log where the master's ``epoch_end`` answer says its last epoch
ends, and copies the master's ``epochs`` history; a slave appends what its fetches return.
The address it asks comes from ZooKeeper's master node, but the broker listening there may
no longer be that master: a deposed master that has not heard yet, a broker restarted on the
master's old address as a slave, another slave. Its own history is another log's: cut to it,
the asker would lose bytes the group's master holds, or keep bytes it never had.

So every such answer says who answers, from the answerer's own role machine:

* ``epoch_end`` and ``epochs`` replies carry ``role`` (``master`` while it holds the lock;
  ``fenced`` for a master that stopped acking in its term, ``resigned`` for one that handed
  its lock over; ``slave{k}``, ``orphaned``, ``electing``, ``starting`` otherwise) and ``serving_epoch`` (the epoch it leads or follows
  in). A broker that is not the acting master refuses ``epoch_end`` outright (below);
  ``epochs`` it answers (tools read any member's history: ``metaq drill``, the console, the
  chaos checker), and the asker checks.
* a replication request (replica ``get``, ``position``, ``news``, ``stream``) or ``epoch_end``
  sent to a broker that is not the acting master is refused with ``403``, ``reason:
  "not_master"``, ``role`` and ``serving_epoch`` (``NotMasterRefusal``): the slave acts on
  the fields, never on the words of ``msg``.

The asker (``check_master_answer``) uses an answer only when ``role`` is an acting master's
and ``serving_epoch`` is the epoch it read from ZooKeeper; otherwise it raises
``NotTheMaster`` and what it does next is ZooKeeper's to decide: the rejoin gives up and the
HA coordinator reads the master node again (followership.py), a following slave asks the
coordinator to look again (follower.py). Never does the peer's word alone change whom a
slave follows. The fields are what the peer says about itself; they are trusted only to
*withhold* action (an honest stale peer says so), never to grant it: the epoch the answer
must match is ZooKeeper's, and with security on the peer proved the group's secret
(peers.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol import commands as c
from .role import ACTING_MASTER, HOLDS_LOCK

if TYPE_CHECKING:
    from ..client.connection import Reply

#: ``reason`` of a 403 from a broker that is not the acting master.
NOT_MASTER = "not_master"
#: The ``role`` an acting master answers with (``HaNode.role_name`` of ``role.ACTING_MASTER``).
ACTING_MASTER_ROLES = frozenset("master" if role in HOLDS_LOCK else role.value for role in ACTING_MASTER)


def answerer_fields(role: str, serving_epoch: int) -> dict[str, Any]:
    """The reply fields that say who answers."""
    return {"role": role, "serving_epoch": serving_epoch}


class NotMasterRefusal(c.RequestError):
    """The broker's 403 to a request only the acting master serves (replication, ``epoch_end``)."""

    def __init__(self, broker_id: int, role: str, serving_epoch: int) -> None:
        super().__init__(c.FORBIDDEN, f"broker {broker_id} is not the master ({role})", reason=NOT_MASTER)
        self.role = role
        self.serving_epoch = serving_epoch

    def reply(self, opaque: int | None) -> dict[str, Any]:
        return {**super().reply(opaque), **answerer_fields(self.role, self.serving_epoch)}


class NotTheMaster(ConnectionError):
    """A peer asked as the group's master answered as something else (or in another epoch)."""

    def __init__(self, address: str, what: str, role: Any, serving_epoch: Any, expected_epoch: int | None) -> None:
        self.address, self.role, self.serving_epoch, self.expected_epoch = address, role, serving_epoch, expected_epoch
        wanted = f" in epoch {expected_epoch} (ZooKeeper's)" if expected_epoch is not None else ""
        super().__init__(f"{what}: the broker at {address} answers as {role!s}, serving epoch {serving_epoch!s}, "
                         f"not as the acting master{wanted}; its answer is not used")

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two refusals the same one (said once)."""
        return self.address, self.role, self.serving_epoch, self.expected_epoch


def refusal_of(reply: "Reply", address: str, what: str, expected_epoch: int | None = None) -> NotTheMaster | None:
    """The ``NotTheMaster`` a ``403 reason: not_master`` reply stands for, or None."""
    if reply.code != c.FORBIDDEN or reply.reason != NOT_MASTER:
        return None
    return NotTheMaster(address, what, reply.get("role"), reply.get("serving_epoch"), expected_epoch)


def check_master_answer(reply: "Reply", address: str, what: str, expected_epoch: int) -> None:
    """Raise NotTheMaster unless ``reply`` comes from the acting master in ``expected_epoch``, the
    epoch the asker read from ZooKeeper: a ``not_master`` refusal, or a success whose ``role`` is
    not an acting master's or whose ``serving_epoch`` is another. Other errors are the caller's."""
    refused = refusal_of(reply, address, what, expected_epoch)
    if refused is not None:
        raise refused
    role, serving = reply.get("role"), reply.get("serving_epoch")
    if reply.ok and (not isinstance(role, str) or role not in ACTING_MASTER_ROLES or type(serving) is not int
                     or serving != expected_epoch):
        raise NotTheMaster(address, what, role, serving, expected_epoch)
