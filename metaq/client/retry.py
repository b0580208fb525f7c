"""The one retry policy of the producers' requests: bounded by attempts and by total time,
with exponential back-off (``send_retry_min_wait_s`` doubling up to ``send_retry_max_wait_s``).

Every sender that retries (a plain put, a numbered put, a transaction step or put) asks
one ``RetryPolicy`` whether another attempt fits, and waits by it; what counts as worth
retrying stays with the sender (it classified the failure).
"""

from __future__ import annotations

import asyncio
import time

from .config import MetaClientConfig


class RetryPolicy:
    def __init__(self, config: MetaClientConfig, timeout: float | None = None, *, attempts: int = 0,
                 max_attempts: int | None = -1) -> None:
        """``attempts``: made already (a first attempt elsewhere counts); ``max_attempts``: -1 for
        ``send_max_attempts``, None for no bound but the time (a transaction step through a failover)."""
        self.deadline = time.monotonic() + (timeout if timeout is not None else config.send_timeout_s)
        self.max_attempts = config.send_max_attempts if max_attempts == -1 else max_attempts
        self.attempts = attempts
        self.wait = config.send_retry_min_wait_s
        self.max_wait = config.send_retry_max_wait_s

    def attempted(self) -> int:
        """Count an attempt about to be made; its number."""
        self.attempts += 1
        return self.attempts

    @property
    def exhausted(self) -> bool:
        """No attempt left, or no time for the next wait and an attempt after it."""
        out_of_attempts = self.max_attempts is not None and self.attempts >= self.max_attempts
        return out_of_attempts or time.monotonic() + self.wait > self.deadline

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def back_off(self) -> None:
        await asyncio.sleep(self.wait)
        self.wait = min(self.wait * 2, self.max_wait)
