"""Fault kinds and scenarios: a seeded, deterministic fault schedule.

A *fault* is one step: inject, hold for ``hold_s``, heal; then the runner waits for the
cluster to settle and for ``gap_s`` of fault-free load; a fault that never heals (a member
lost for good) is the last step. Targets are roles ("the master of group 1"), resolved
when the step runs. A *scenario* is a fixed list of fault kinds, repeated until the run's
time is up; ``random`` draws each step from every fault kind that heals and fits the run
(power-loss kinds only with ``--power-loss``, corrupt-* only with ``--corruption``) (seeded). The whole schedule (kinds, groups, holds, gaps) is drawn from the seed up front,
so two runs with the same seed inject the same faults in the same order.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .cluster import ChaosBroker, ChaosCluster


@dataclass
class Step:
    kind: str
    group: int
    hold_s: float
    gap_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FaultKind:
    role: str                       # whom it hits: "master" | "slave" | "zk"
    hold: tuple[float, float]       # hold range, as multiples of the session timeout
    heals: bool = True              # False: never healed during the run (a member lost for good)
    reads_during: bool = False      # reads must go on while the fault holds
    master_fixed: bool = False      # no failover while the fault holds
    needs: str = ""                 # "proxy": only with every process on 127.0.0.1 behind the fault
                                    # proxy; "netns": only with hosts of their own (--hosts netns)
    needs_power_loss: bool = False  # only with every broker under the power-loss shim (--power-loss)
    needs_corruption: bool = False  # only in a run with small segments and a fast scrub (--corruption)


FAULTS: dict[str, FaultKind] = {
    "kill-master": FaultKind("master", (1.0, 3.0)),          # kill -9, restarted after the hold
    "kill-slave": FaultKind("slave", (1.0, 3.0)),
    "pause-master": FaultKind("master", (2.5, 4.0)),         # SIGSTOP past the session timeout, then SIGCONT
    "pause-slave": FaultKind("slave", (2.5, 4.0)),
    "partition-master-zk": FaultKind("master", (2.5, 4.0)),  # master cut from ZooKeeper only: split brain
    "partition-master-peers": FaultKind("master", (2.0, 4.0)),  # master cut from clients and slaves
    "partition-master-slave": FaultKind("master", (2.0, 4.0)),  # master cut from its slaves only
    "partition-client-master": FaultKind("master", (2.0, 4.0)),  # master cut from its clients only
    "partition-slave-peers": FaultKind("slave", (2.0, 4.0)),
    "latency-master": FaultKind("master", (2.0, 4.0), needs="proxy"),    # 150 ms ± 50 each way on all its TCP peers
    "bandwidth-master": FaultKind("master", (2.0, 4.0), needs="proxy"),  # 20 KB/s each way
    # Its host's link down past the session timeout (--hosts netns): silent both ways, no
    # RST; its sockets hang until the link comes back.
    "silence-master": FaultKind("master", (2.5, 4.0), needs="netns"),
    "silence-slave": FaultKind("slave", (2.5, 4.0), needs="netns"),
    "kill-zk-node": FaultKind("zk", (2.0, 4.0)),             # one ZooKeeper node of the ensemble
    # A slave killed, its data directory emptied, restarted after the hold: a new member
    # that re-syncs the whole log from its master while the group serves.
    "replace-slave": FaultKind("slave", (1.0, 2.0)),
    # Two of three ZooKeeper nodes killed, restarted after the hold: no quorum. Reads go on
    # and the master stays the master (nobody can be elected without ZooKeeper).
    "zk-majority": FaultKind("zk", (2.0, 3.0), reads_during=True, master_fixed=True),
    # kill -9 and never restarted while the run lasts (the final heal brings it back for the
    # snapshot): the group must serve on without it.
    "lose-master": FaultKind("master", (0.0, 0.0), heals=False),
    "lose-slave": FaultKind("slave", (0.0, 0.0), heals=False),
    # kill -9, then everything it wrote and did not fsync is lost (chaos/power_loss.py), then
    # restarted after the hold like kill-*: only in a cluster run under the shim (--power-loss).
    "power-loss-master": FaultKind("master", (1.0, 3.0), needs_power_loss=True),
    "power-loss-slave": FaultKind("slave", (1.0, 3.0), needs_power_loss=True),
    # kill -9, one payload bit of a flushed record flipped on its disk (chaos/corruption.py),
    # restarted after the hold: recovery or the scrub finds it, a slave (also the old master,
    # back as a slave) fetches it again; only with --corruption.
    "corrupt-master": FaultKind("master", (1.0, 3.0), needs_corruption=True),
    "corrupt-slave": FaultKind("slave", (1.0, 3.0), needs_corruption=True),
}

SCENARIOS: dict[str, list[str]] = {
    "kill-master": ["kill-master"],
    "kill-slave": ["kill-slave"],
    "pause-master": ["pause-master"],
    "pause-slave": ["pause-slave"],
    "partition-master-zk": ["partition-master-zk"],
    "partition-master-peers": ["partition-master-peers"],
    "partition-slave-peers": ["partition-slave-peers"],
    "partition-master-slave": ["partition-master-slave"],
    "partition-client-master": ["partition-client-master"],
    "slow-links": ["latency-master", "bandwidth-master"],
    "kill-zk-node": ["kill-zk-node"],
    "mixed": ["kill-master", "partition-master-zk", "pause-master", "partition-master-peers", "kill-slave"],
    "replace-slave": ["replace-slave"],
    "zk-majority": ["zk-majority"],
    "lose-master": ["lose-master"],
    "lose-slave": ["lose-slave"],
    "silence-master": ["silence-master"],
    "silence-slave": ["silence-slave"],
    "power-loss-master": ["power-loss-master"],
    "power-loss-slave": ["power-loss-slave"],
    "corrupt-master": ["corrupt-master"],
    "corrupt-slave": ["corrupt-slave"],
}
# ``random`` draws from every fault that heals (a fault that never heals ends the schedule).
RANDOM_KINDS = [k for k, f in FAULTS.items() if f.heals]


def writes_expected(kind: str, mode: str, on_sync_slave_loss: str, slaves: int) -> bool:
    """Whether writes must resume after the fault ends (for a lasting fault: while it holds).

    A healed fault leaves a whole group: writes resume. A member lost for good leaves
    ``slaves - 1`` slaves beside the master; in sync mode with ``onSyncSlaveLoss=reject`` and
    ``minSyncSlaves=1`` the master refuses writes by design when no slave is left to join
    its sync set. Async groups and ``degrade`` write on alone.
    """
    if FAULTS[kind].heals:
        return True
    return not (mode == "sync" and on_sync_slave_loss == "reject" and slaves < 2)


def scenario_names() -> list[str]:
    return sorted(SCENARIOS) + ["random"]


def cuts_links(kind: str) -> bool:
    """A partition: with --hosts netns made with nftables in the host's namespace."""
    return kind.startswith("partition-")


def fits_power_loss(kind: str, power_loss: bool) -> bool:
    """Whether the fault can be injected: a power loss only where the brokers run under the shim."""
    return power_loss or not FAULTS[kind].needs_power_loss


def fits_corruption(kind: str, corruption: bool) -> bool:
    """Whether the fault can be injected: corruption only in a run set up for it."""
    return corruption or not FAULTS[kind].needs_corruption


def fits_hosts(kind: str, hosts: str, can_cut: bool = True) -> bool:
    """Whether the fault can be injected where the processes run (``local`` or ``netns``;
    ``can_cut``: whether a netns host can be cut from a peer, i.e. nftables works here)."""
    needs = FAULTS[kind].needs
    if hosts == "netns" and cuts_links(kind) and not can_cut:
        return False
    return not needs or needs == ("netns" if hosts == "netns" else "proxy")


def schedule(scenario: str, seed: int, groups: int, zk_nodes: int, session_s: float, steps: int = 400,
             hosts: str = "local", can_cut: bool = True, power_loss: bool = False,
             corruption: bool = False) -> list[Step]:
    """The first ``steps`` fault steps of a scenario (the runner stops when time is up);
    ``power_loss``: the brokers run under the power-loss shim, so power-loss faults fit;
    ``corruption``: the run is set up for the corrupt-* faults."""
    rng = random.Random(f"schedule/{scenario}/{seed}")
    if scenario == "random":
        kinds = [k for k in RANDOM_KINDS
                 if (FAULTS[k].role != "zk" or zk_nodes >= 3) and fits_hosts(k, hosts, can_cut)
                 and fits_power_loss(k, power_loss) and fits_corruption(k, corruption)]
        sequence = [rng.choice(kinds) for _ in range(steps)]
    elif scenario in SCENARIOS:
        base = SCENARIOS[scenario]
        if any(FAULTS[k].role == "zk" for k in base) and zk_nodes < 3:
            raise ValueError(f"scenario {scenario} needs --zk-nodes 3")
        if not all(fits_power_loss(k, power_loss) for k in base):
            raise ValueError(f"scenario {scenario} needs --power-loss (brokers under the power-loss shim)")
        if not all(fits_corruption(k, corruption) for k in base):
            raise ValueError(f"scenario {scenario} needs --corruption (small segments, a fast scrub)")
        unfit = [k for k in base if not fits_hosts(k, hosts, can_cut)]
        if unfit:
            needs = FAULTS[unfit[0]].needs
            where = ("--hosts netns" if needs == "netns" else "the fault proxy (not --hosts netns)" if needs
                     else "nftables (nft) to cut hosts apart in --hosts netns, which does not work here")
            raise ValueError(f"scenario {scenario} needs {where}")
        sequence = [base[i % len(base)] for i in range(steps)]
    else:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(scenario_names())}")
    out = []
    for kind in sequence:
        low, high = FAULTS[kind].hold
        out.append(Step(kind, rng.randrange(groups), round(rng.uniform(low, high) * session_s, 2),
                        round(rng.uniform(0.5, 2.0), 2)))
    return out


def inject(cluster: ChaosCluster, step: Step, rng: random.Random) -> tuple[str, dict[str, Any], Callable[[], None]]:
    """Carry out a step's fault now; returns (target name, details, heal). For a fault that
    never heals, ``heal`` does nothing (the run's final heal restarts everything)."""
    role = FAULTS[step.kind].role
    if step.kind == "zk-majority":
        lost = sorted(rng.sample(range(len(cluster.zks)), len(cluster.zks) // 2 + 1))
        for index in lost:
            cluster.kill_zk(index)

        def restart() -> None:
            # The fault ends when ZooKeeper has a quorum again, not when the JVMs are
            # forked: the liveness bound runs from there (a JVM start and a leader
            # election take 1.5-3 s here, which no broker setting can shorten).
            for index in lost:
                cluster.restart_zk(index)
            for index in lost:
                cluster.zks[index].wait_until_serving(60)

        return "+".join(f"zk{i + 1}" for i in lost), {}, restart
    if role == "zk":
        index = rng.randrange(len(cluster.zks))
        cluster.kill_zk(index)
        return f"zk{index + 1}", {}, lambda: cluster.restart_zk(index)
    target: ChaosBroker | None
    if role == "master":
        target = cluster.master_of(step.group)
    else:
        slaves = [b for b in cluster.slaves_of(step.group)]
        target = slaves[rng.randrange(len(slaves))] if slaves else None
    if target is None:
        return "none", {"skipped": f"group {step.group} has no {role}"}, lambda: None
    b = target
    kind = step.kind
    if kind.startswith("lose-"):
        cluster.kill(b)
        return b.name, {}, lambda: None
    if kind.startswith("power-loss-"):
        cluster.kill(b)
        lost = cluster.lose_power(b)
        return b.name, {"bytes_lost": lost.bytes_lost, "power_loss": str(lost)}, lambda: cluster.restart(b)
    if kind.startswith("corrupt-"):
        cluster.kill(b)
        found = cluster.corrupt(b, rng)
        details = found.to_json() if found is not None else {"corruption": "nothing flushed yet"}
        return b.name, details, lambda: cluster.restart(b)
    if kind == "replace-slave":
        cluster.kill(b)
        cluster.wipe(b)
        return b.name, {"data": "wiped"}, lambda: cluster.restart(b)
    if kind.startswith("kill-"):
        cluster.kill(b)
        return b.name, {}, lambda: cluster.restart(b)
    if kind.startswith("pause-"):
        cluster.pause(b)
        return b.name, {}, lambda: cluster.resume(b)
    if kind.startswith("silence-"):
        cluster.silence(b)
        return b.name, {"link": "down"}, lambda: cluster.unsilence(b)
    if kind == "partition-master-zk":
        cluster.cut_zk(b)
        return b.name, {"link": "zk"}, lambda: cluster.heal_zk(b)
    if kind.endswith("-peers"):
        cluster.cut_peers(b)
        return b.name, {"link": "peers"}, lambda: cluster.heal_peers(b)
    if kind in ("partition-master-slave", "partition-client-master"):
        links = ("brokers",) if kind == "partition-master-slave" else ("clients",)
        cluster.cut_peers(b, links)
        return b.name, {"link": links[0]}, lambda: cluster.heal_peers(b, links)
    if kind == "latency-master":
        cluster.add_toxic(b, "latency", latency=150, jitter=50)
        return b.name, {"toxic": "latency", "latency_ms": 150}, lambda: cluster.clear_toxics(b)
    if kind == "bandwidth-master":
        cluster.add_toxic(b, "bandwidth", rate=20)
        return b.name, {"toxic": "bandwidth", "rate_kbs": 20}, lambda: cluster.clear_toxics(b)
    raise ValueError(kind)
