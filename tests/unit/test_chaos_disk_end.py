"""``ChaosBroker.disk_end``: a partition's bytes on disk, read while the broker changes them."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from chaos.cluster import ChaosBroker


def test_a_segment_that_goes_while_the_sizes_are_summed_is_looked_at_again(tmp_path: Path, monkeypatch) -> None:
    """Campaign seed 7204: a truncation removed a segment between the listing and its stat, and
    the runner crashed in the settle check (FileNotFoundError), an ERROR row."""
    partition = tmp_path / "data" / "chaos-0"
    partition.mkdir(parents=True)
    (partition / f"{0:020d}.meta").write_bytes(b"x" * 100)
    going = partition / f"{100:020d}.meta"
    going.write_bytes(b"y" * 50)
    broker = ChaosBroker(SimpleNamespace(dir=tmp_path, name="g0-a"), 0, 1, 2, [])  # type: ignore[arg-type]
    real_stat = Path.stat

    def stat_after_removal(self: Path, **kwargs):
        if self == going and os.path.exists(going):
            going.unlink()  # the truncation, between glob() and stat()
        return real_stat(self, **kwargs)

    monkeypatch.setattr(Path, "stat", stat_after_removal)
    assert broker.disk_end("chaos", 0) == 100
    assert broker.disk_end("other", 0) == 0
