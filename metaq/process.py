"""An OS process this program started: signalled by pid only, stopped TERM-then-KILL.

Shared by the embedded ZooKeeper and the broker-process launcher: neither ever
touches a process it did not start (no ``pkill``), and both treat a SIGSTOPped
child correctly (it is continued before SIGTERM, which it would otherwise not see).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import IO

log = logging.getLogger(__name__)


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """TERM-then-KILL for a process known only by its pid (one a drill restarted, say):
    continued first if stopped, reaped if it is our child."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return  # our child, and reaped
        except ChildProcessError:
            try:
                os.kill(pid, 0)  # not our child: is it still there?
            except ProcessLookupError:
                return
        time.sleep(0.05)
    log.warning("pid %d ignored SIGTERM for %.0fs, killing it", pid, timeout)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class ChildProcess:
    """Mixin: ``self._process`` is the Popen (or None), ``self._log_handle`` its log file."""

    _process: "subprocess.Popen[bytes] | None" = None
    _log_handle: "IO[bytes] | None" = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._process.poll() if self._process else None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (a clean shutdown), then SIGKILL if it takes longer than ``timeout``."""
        if self.alive:
            assert self._process is not None
            self.resume()  # a SIGSTOPped process would not see SIGTERM
            self._signal(signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("pid %d ignored SIGTERM for %.0fs, killing it", self._process.pid, timeout)
                self.kill()
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL: a crash."""
        if self.alive:
            assert self._process is not None
            self._signal(signal.SIGKILL)
            self._process.wait()
        return self._reap()

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if self.alive:
            assert self._process is not None
            os.kill(self._process.pid, signum)

    def _reap(self) -> int | None:
        code = self._process.poll() if self._process else None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        return code
