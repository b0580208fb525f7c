"""The one retry policy of the producers' requests: bounded by attempts and by total time,
with exponential back-off (``send_retry_min_wait_s`` doubling up to ``send_retry_max_wait_s``).

Every sender that retries (a plain put, a numbered put, a transaction step or put) asks
one ``RetryPolicy`` whether another attempt fits, and waits by it; what counts as worth
retrying stays with the sender (it classified the failure). The decisions are tenacity's
stop and wait strategies; this object carries their state through a sender's own loop
(the senders renumber, re-route or re-obtain an id between attempts, which a decorator
around one call cannot express).
"""

from __future__ import annotations

import asyncio
import time

from tenacity import RetryCallState, stop_after_attempt, stop_before_delay, stop_never, wait_exponential

from .config import MetaClientConfig


class RetryPolicy:
    def __init__(self, config: MetaClientConfig, timeout: float | None = None, *, attempts: int = 0,
                 max_attempts: int | None = -1) -> None:
        """``attempts``: made already (a first attempt elsewhere counts); ``max_attempts``: -1 for
        ``send_max_attempts``, None for no bound but the time (a transaction step through a failover)."""
        budget = timeout if timeout is not None else config.send_timeout_s
        self.deadline = time.monotonic() + budget
        self.max_attempts = config.send_max_attempts if max_attempts == -1 else max_attempts
        self.attempts = attempts
        self._wait = wait_exponential(multiplier=config.send_retry_min_wait_s, max=config.send_retry_max_wait_s)
        # Stop when out of attempts, or when the next wait would end past the time budget.
        self._stop = stop_before_delay(budget) | (
            stop_after_attempt(self.max_attempts) if self.max_attempts is not None else stop_never
        )
        self._state = RetryCallState(None, None, (), {})  # start_time: now, on the monotonic clock
        self._back_offs = 0

    def attempted(self) -> int:
        """Count an attempt about to be made; its number."""
        self.attempts += 1
        return self.attempts

    @property
    def wait(self) -> float:
        """The next back-off: the first is the minimum wait, each one after doubles it."""
        self._state.attempt_number = self._back_offs + 1
        return self._wait(self._state)

    @property
    def exhausted(self) -> bool:
        """No attempt left, or no time for the next wait and an attempt after it."""
        upcoming = self.wait
        state = self._state
        state.attempt_number = self.attempts
        state.outcome_timestamp = time.monotonic()
        state.upcoming_sleep = upcoming
        return bool(self._stop(state))

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def back_off(self) -> None:
        await asyncio.sleep(self.wait)
        self._back_offs += 1
