"""The one error type of the HTTP layer: a status and a one-line reason for the client."""

from __future__ import annotations

from typing import Any


class HttpError(Exception):
    def __init__(self, status: int, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.status = status
        # A reason is one line: a multi-line one would break clients that print the first line.
        self.reason = " ".join(reason.split())
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": self.reason, **self.extra}
