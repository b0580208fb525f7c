"""The epochs one broker keeps track of, moved only by named transitions.

A master's term is numbered by its epoch (election.py); four numbers say where this
broker stands in the group's sequence of terms, and each changes at one kind of moment:

* ``seen``: the newest epoch ZooKeeper showed us, or the one we won (``saw``, ``won``);
* ``serving``: the epoch put replies and replica fetches carry, set as we start to lead
  or to follow (``serve``);
* ``followed``: the epoch we last finished following into (``followed_in``): the
  election rules ask it of a slave that may take over;
* ``led``: the newest epoch this broker led, as its led-epoch file says (``led_in``,
  after the file is durable): a partition whose newest epoch is this one may end in
  writes of ours no slave has (HaNode.committed).

Invariant, epochs only grow: ``saw`` never lowers ``seen``, and an election wins an
epoch above every one ZooKeeper held (election.try_take_master).
"""

from __future__ import annotations


class Epochs:
    def __init__(self, led: int = 0) -> None:
        self.seen = 0
        self.serving = 0
        self.followed = 0
        self.led = led

    def saw(self, epoch: int) -> None:
        """ZooKeeper shows ``epoch``: remember it if it is newer."""
        self.seen = max(self.seen, epoch)

    def won(self, epoch: int) -> None:
        """Our election transaction took ``epoch`` (the next one, above all in ZooKeeper)."""
        self.seen = epoch

    def serve(self) -> int:
        """We start to lead or follow in the newest epoch seen: replies carry it from now on."""
        self.serving = self.seen
        return self.serving

    def followed_in(self) -> None:
        """Our logs agree with the master of the newest epoch seen (truncated against it)."""
        self.followed = self.seen

    def led_in(self) -> None:
        """The led-epoch file durably names the epoch we serve as master."""
        self.led = self.seen
