"""Corruption fault kinds without a cluster: the tool that corrupts a data directory (checked
against the store's own CRC scan), when a schedule may draw the faults, and the campaign option."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.corruption import flip_bit, truncate_segment
from chaos.scenarios import schedule
from metaq import record
from metaq.store.log import PartitionLog
from metaq.store.scrub import check_data_dir

CORRUPTION = {"corrupt-master", "corrupt-slave"}


def _data_dir(tmp_path: Path, records: int, segment_size: int = 1000) -> Path:
    log_ = PartitionLog(tmp_path / "chaos-0", max_segment_size=segment_size)
    for n in range(records):
        log_.append(record.encode_record(b"%079d" % n + b"\n"))  # 100-byte records
    log_.flush()
    log_.close()  # writes the flushed-end checkpoint
    return tmp_path


@pytest.mark.parametrize("seed", range(5))
def test_a_flipped_bit_lands_in_a_payload_of_a_sealed_segment_and_the_crc_scan_finds_it(tmp_path: Path, seed: int) -> None:
    data_dir = _data_dir(tmp_path, 25)
    found = flip_bit(data_dir, random.Random(seed), "chaos", sealed_only=True)
    assert found is not None and not found.file.endswith("00000000000000002000.meta")  # never the active one
    assert found.record_offset % 100 == 0 and found.record_offset + record.HEADER_SIZE <= found.offset < found.record_offset + 100
    [report] = check_data_dir(data_dir)
    assert [(b.start, b.kind) for b in report.bad] == [(found.record_offset, "corrupt")]


def test_without_sealed_segments_only_flushed_records_of_the_active_one_are_hit(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path, 5)
    assert flip_bit(data_dir, random.Random(1), sealed_only=True) is None
    with open(data_dir / "chaos-0" / "00000000000000000000.meta", "ab") as f:
        f.write(record.encode_record(b"not flushed"))  # past the checkpoint: a torn tail's place
    for seed in range(10):
        found = flip_bit(data_dir, random.Random(seed))
        assert found is not None and found.offset < 500  # never past the flushed end


def test_a_truncated_sealed_segment_breaks_the_log(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path, 25)
    cut = truncate_segment(data_dir, random.Random(2))
    assert cut is not None and cut.offset < cut.record_offset
    [report] = check_data_dir(data_dir)
    assert report.error is not None and "not contiguous (gap)" in report.error


def test_random_draws_corruption_only_when_the_run_is_set_up_for_it() -> None:
    drawn = lambda corruption: {s.kind for s in schedule("random", 3, 2, 3, 1.5, steps=400, corruption=corruption)}
    assert not drawn(False) & CORRUPTION
    assert CORRUPTION <= drawn(True)
    for scenario in sorted(CORRUPTION):
        with pytest.raises(ValueError, match=f"scenario {scenario} needs --corruption"):
            schedule(scenario, 1, 1, 1, 1.5)
        assert {s.kind for s in schedule(scenario, 1, 1, 1, 1.5, steps=5, corruption=True)} == {scenario}


def test_a_corruption_campaign_passes_the_option_to_every_run_and_is_not_mixed(tmp_path: Path) -> None:
    from chaos import campaign

    assert all("--corruption" in s.command(30, tmp_path, 3) for s in campaign.plan(4, 1, corruption=True))
    assert not any("--corruption" in s.command(30, tmp_path, 3) for s in campaign.plan(4, 1))
    (tmp_path / campaign.SETTINGS_FILE).write_text('{"seconds": 30, "first_seed": 1, "zk_nodes": 3, "power_loss": false}')
    assert campaign.check_settings(tmp_path, 30, 1, 3) is None
    assert "--corruption False (now True)" in campaign.check_settings(tmp_path, 30, 1, 3, corruption=True)
