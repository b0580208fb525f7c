"""`--hosts local|netns` without a cluster: which faults a schedule draws, and the skip where namespaces cannot be made."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.scenarios import FAULTS, schedule

PROXY_ONLY = {"latency-master", "bandwidth-master"}
HOSTS_ONLY = {"silence-master", "silence-slave"}


def kinds(hosts: str, can_cut: bool = True) -> set[str]:
    return {s.kind for s in schedule("random", 4, 2, 3, 1.5, steps=400, hosts=hosts, can_cut=can_cut)}


def test_random_draws_only_the_faults_each_hosts_mode_can_inject() -> None:
    local, netns = kinds("local"), kinds("netns")
    assert PROXY_ONLY <= local and not local & HOSTS_ONLY
    assert HOSTS_ONLY <= netns and not netns & PROXY_ONLY
    assert {"partition-master-slave", "partition-master-zk", "kill-master", "pause-master"} <= netns


def test_without_nftables_hosts_mode_leaves_the_partitions_out() -> None:
    drawn = kinds("netns", can_cut=False)
    assert not {k for k in drawn if k.startswith("partition-")}
    assert HOSTS_ONLY <= drawn
    with pytest.raises(ValueError, match="needs nftables"):
        schedule("partition-master-slave", 1, 1, 1, 1.5, hosts="netns", can_cut=False)
    # The proxy cuts links without nftables.
    assert schedule("partition-master-slave", 1, 1, 1, 1.5, steps=1, can_cut=False)[0].kind == "partition-master-slave"


def test_a_scenario_of_the_other_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="silence-master needs --hosts netns"):
        schedule("silence-master", 1, 1, 1, 1.5)
    with pytest.raises(ValueError, match="slow-links needs the fault proxy"):
        schedule("slow-links", 1, 1, 1, 1.5, hosts="netns")


def test_the_default_mode_draws_as_before_the_hosts_only_faults() -> None:
    """A seed's schedule in the default mode did not change when hosts-only (or, without
    --power-loss, power-loss, or without --corruption, corruption) faults were added."""
    before = [k for k, f in FAULTS.items()
              if f.heals and k not in HOSTS_ONLY and not f.needs_power_loss and not f.needs_corruption]
    rng = random.Random("schedule/random/4")
    expected = [rng.choice(before) for _ in range(50)]
    assert [s.kind for s in schedule("random", 4, 1, 3, 1.5, steps=50)] == expected


def test_hosts_mode_where_namespaces_cannot_be_made_is_skipped_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from chaos import runner
    from chaos.__main__ import main

    monkeypatch.setattr(runner, "hosts_unavailable", lambda: "network namespaces need root (ip netns add)")
    code = main(["run", "--scenario", "silence-master", "--hosts", "netns", "--out", str(tmp_path / "run")])
    assert code == runner.EXIT_SKIPPED
    err = capsys.readouterr().err
    assert err == "chaos run skipped: --hosts netns needs network namespaces: network namespaces need root (ip netns add)\n"
    assert not (tmp_path / "run").exists()  # nothing ran
