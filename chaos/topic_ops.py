"""Topic operations as chaos faults: the plan for the side topic and what each operation should leave.

The side topic is never counted by the checked workload, so deleting it is legal. This module holds
only the pure model (which operation comes next, what the group must serve afterwards); driving the
operations against a cluster is not wired into the runner yet.
"""
from __future__ import annotations

from dataclasses import dataclass

# The cycle a scenario walks: create, grow, alter, delete, re-create smaller. Re-creating with fewer
# partitions than before is the case the broker's topic incarnations exist for.
TOPIC_OP_KINDS = ["topic-create", "topic-add-partitions", "topic-alter", "topic-delete", "topic-recreate"]


@dataclass(frozen=True)
class SideTopicState:
    """What every member of the group must serve for the side topic: None partitions = dropped."""
    partitions: int | None
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def exists(self) -> bool:
        return self.partitions is not None


def apply_op(state: SideTopicState, kind: str, initial_partitions: int = 2) -> SideTopicState:
    """The expected state after ``kind``; a clear ValueError when the op is illegal in ``state``."""
    if kind not in TOPIC_OP_KINDS:
        raise ValueError(f"unknown topic operation {kind!r} (one of {', '.join(TOPIC_OP_KINDS)})")
    if initial_partitions < 2:
        # topic-recreate must shrink the topic, so it needs at least two to shrink from.
        raise ValueError(f"side topic needs at least 2 partitions, got {initial_partitions}")
    if kind == "topic-create":
        if state.exists:
            raise ValueError("topic-create: the side topic already exists")
        return SideTopicState(initial_partitions)
    if not state.exists and kind != "topic-recreate":
        raise ValueError(f"{kind}: the side topic does not exist")
    if kind == "topic-add-partitions":
        return SideTopicState(state.partitions + 1, state.settings)
    if kind == "topic-alter":
        return SideTopicState(state.partitions, (("retention.hours", "1"),))
    if kind == "topic-delete":
        return SideTopicState(None)
    # topic-recreate: delete (if present) then create with fewer partitions than ever before.
    return SideTopicState(1)


def plan(steps: int, initial_partitions: int = 2) -> list[tuple[str, SideTopicState]]:
    """``steps`` operations walking the cycle, each paired with the state it must leave."""
    state, out = SideTopicState(None), []
    for i in range(steps):
        kind = TOPIC_OP_KINDS[i % len(TOPIC_OP_KINDS)]
        if kind == "topic-create" and state.exists:
            kind = "topic-recreate"
        state = apply_op(state, kind, initial_partitions)
        out.append((kind, state))
    return out
