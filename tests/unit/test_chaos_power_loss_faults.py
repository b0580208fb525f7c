"""Power-loss fault kinds without a cluster: when a schedule may draw them, and the refusals."""

from __future__ import annotations

import pytest

from chaos.cluster import ChaosCluster
from chaos.scenarios import schedule

POWER_LOSS = {"power-loss-master", "power-loss-slave"}


def drawn(power_loss: bool) -> set[str]:
    return {s.kind for s in schedule("random", 3, 2, 3, 1.5, steps=400, power_loss=power_loss)}


def test_random_draws_power_loss_only_with_brokers_under_the_shim() -> None:
    assert not drawn(False) & POWER_LOSS
    with_shim = drawn(True)
    assert POWER_LOSS <= with_shim
    assert {"kill-master", "pause-master", "partition-master-zk"} <= with_shim  # the others stay in


def test_a_power_loss_scenario_without_the_shim_is_refused_by_name() -> None:
    for scenario in sorted(POWER_LOSS):
        with pytest.raises(ValueError, match=f"scenario {scenario} needs --power-loss"):
            schedule(scenario, 1, 1, 1, 1.5)
        assert {s.kind for s in schedule(scenario, 1, 1, 1, 1.5, steps=5, power_loss=True)} == {scenario}


def test_power_loss_schedule_is_the_same_for_the_same_seed() -> None:
    first = schedule("random", 9, 1, 3, 1.5, steps=50, power_loss=True)
    assert first == schedule("random", 9, 1, 3, 1.5, steps=50, power_loss=True)


def test_power_loss_cluster_refuses_hosts_of_their_own(tmp_path) -> None:
    with pytest.raises(ValueError, match="--power-loss runs only with --hosts local"):
        ChaosCluster(tmp_path, power_loss=True, hosts="netns")


def test_a_power_loss_campaign_passes_the_option_to_every_run_and_is_not_mixed(tmp_path) -> None:
    from chaos import campaign

    assert all("--power-loss" in s.command(30, tmp_path, 3) for s in campaign.plan(4, 1, power_loss=True))
    assert not any("--power-loss" in s.command(30, tmp_path, 3) for s in campaign.plan(4, 1))
    # A campaign recorded before the option existed resumes as one without power loss...
    (tmp_path / campaign.SETTINGS_FILE).write_text('{"seconds": 30, "first_seed": 1, "zk_nodes": 3}')
    assert campaign.check_settings(tmp_path, 30, 1, 3) is None
    # ...and is not continued with power loss (its table would mix two kinds of runs).
    assert "--power-loss False (now True)" in campaign.check_settings(tmp_path, 30, 1, 3, power_loss=True)
