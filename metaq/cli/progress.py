"""A live count-and-rate line on stderr for long `metaq produce` / `metaq consume` runs.

Shown only when stderr is a terminal, so pipes and test logs get the summary alone.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, description: str, total: int | None = None, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self.count = 0
        self._progress: Any = None
        self._task: Any = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

            columns = [SpinnerColumn(), TextColumn("{task.description}")]
            columns += [BarColumn(), MofNCompleteColumn()] if total else [TextColumn("{task.completed:>10,.0f}")]
            columns += [TextColumn("{task.fields[rate]:>10,.0f} msg/s"), TimeElapsedColumn()]
            self._progress = RichProgress(*columns, console=Console(stderr=True), transient=True)
            self._task = self._progress.add_task(description, total=total, rate=0.0)
            self._progress.start()

    def advance(self, n: int = 1) -> None:
        self.count += n
        if self._progress is not None:
            self._progress.update(self._task, completed=self.count, rate=self.rate)

    @property
    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    @property
    def rate(self) -> float:
        return self.count / self.elapsed

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
