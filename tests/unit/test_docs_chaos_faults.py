"""docs/chaos.md, "Faults" and "Scenarios and the seed": the fault table names every fault
kind of ``chaos.scenarios.FAULTS`` once with its hold range (x the session timeout), and the
scenario list names every scenario ``python -m chaos run --scenario`` accepts."""

from __future__ import annotations

import re
from pathlib import Path

from chaos.scenarios import FAULTS, scenario_names

DOC = (Path(__file__).resolve().parents[2] / "docs" / "chaos.md").read_text()


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}")
    return DOC[start: DOC.index("\n## ", start + 1)]


def documented_holds() -> dict[str, str]:
    holds = {}
    for row in section("Faults (`chaos/scenarios.py`)").splitlines():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            for kind in re.findall(r"`([a-z-]+)`", cells[0]):
                assert kind not in holds, f"{kind} has two rows"
                holds[kind] = cells[2]
    return holds


def hold_text(kind: str) -> str:
    fault = FAULTS[kind]
    if not fault.heals:
        return "never heals"
    return "-".join(f"{bound:g}" for bound in fault.hold)


def test_the_fault_table_has_every_fault_kind_with_its_hold():
    holds = documented_holds()
    assert set(holds) == set(FAULTS)
    assert {kind: holds[kind] for kind in FAULTS} == {kind: hold_text(kind) for kind in FAULTS}


def test_the_scenario_list_names_every_scenario():
    listed = set(re.findall(r"`([a-z-]+)`", section("Scenarios and the seed").split("The configuration")[0]))
    assert set(scenario_names()) - {"random"} <= listed
