"""Concurrent writers of one partition's flushed-end checkpoint (metaq/store/checkpoint.py).

Campaign seed 5002: a partition added by ``numPartitions 2 -> 3`` had its first checkpoint
written by the batch that lays out new logs while the new master's flush of every log saved
the next one. Both wrote ``flushed-end-checkpoint.tmp``; one renamed the other's file away and
the second rename failed (FileNotFoundError), which failed the master's takeover."""

from __future__ import annotations

import threading
from pathlib import Path

from metaq.store.checkpoint import checkpoint_path, read_flushed_end, write_first_checkpoints, write_flushed_end


def test_concurrent_writers_of_one_checkpoint_never_fail_and_leave_one_of_their_values(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(values: range, first: bool) -> None:
        start.wait()
        try:
            for value in values:
                if first:
                    write_first_checkpoints({tmp_path: value})
                else:
                    write_flushed_end(tmp_path, value, durable=False)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(range(k * 100, k * 100 + 60), k % 2 == 0)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert read_flushed_end(tmp_path) in {v for k in range(4) for v in range(k * 100, k * 100 + 60)}
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_path(tmp_path).name], "no temporary file is left"
