"""A result handed on the moment it is known: the broker's hot waits without a loop hop.

An ``asyncio.Future`` runs its callbacks on a later turn of the event loop
(``call_soon``), and a coroutine waiting on it is a task that is woken the same way:
each wait costs a task, a scheduled callback and a turn of the loop before anything
is written. The broker's hot waits end on a synchronous event it sees itself (a
put's append wakes a parked fetch; a slave's fetch releases the sync puts it covers),
so ``Deferred`` calls its callbacks right there, in the code that resolved it: the
parked fetch's reply and the put's ack are written before that code returns
(docs/sync-replication.md, "The round trip").

A callback runs inside whatever resolved the ``Deferred`` (another connection's
request, a flush completion), so callbacks must not raise: one that does is logged
and the others still run. ``await deferred`` works too (a Future is made then, only
for that awaiter), so code that is not hot keeps awaiting it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Generator, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")

_PENDING, _RESULT, _ERROR, _CANCELLED = range(4)


class Deferred(Generic[T]):
    """One result (or exception) with synchronous callbacks; the Future methods its users need."""

    __slots__ = ("_state", "_value", "_callbacks", "_on_cancel")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[["Deferred[T]"], None]] | None = None
        #: Called once by ``cancel`` while pending: releases what the wait holds (a timer, a watch).
        self._on_cancel: Callable[[], None] | None = None

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> T:
        """The value; raises the exception it failed with (``asyncio.CancelledError`` if cancelled)."""
        if self._state == _RESULT:
            return self._value
        if self._state == _ERROR:
            raise self._value
        if self._state == _CANCELLED:
            raise asyncio.CancelledError()
        raise asyncio.InvalidStateError("Deferred is not done")

    def exception(self) -> BaseException | None:
        """The exception it failed with, or None (``asyncio.CancelledError`` if cancelled)."""
        if self._state == _ERROR:
            return self._value
        if self._state == _CANCELLED:
            raise asyncio.CancelledError()
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("Deferred is not done")
        return None

    def set_result(self, value: T) -> None:
        self._finish(_RESULT, value)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(_ERROR, exc)

    def cancel(self) -> bool:
        """Nobody wants the result any more (its connection closed): release the wait."""
        if self._state != _PENDING:
            return False
        on_cancel, self._on_cancel = self._on_cancel, None
        self._finish(_CANCELLED, None)
        if on_cancel is not None:
            on_cancel()
        return True

    def on_cancel(self, release: Callable[[], None]) -> None:
        self._on_cancel = release

    def _finish(self, state: int, value: Any) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError("Deferred is already done")
        self._state, self._value = state, value
        # Done, there is nothing left to release: dropped, so that a wait whose release
        # refers back to this Deferred (a parked fetch) forms no reference cycle.
        self._on_cancel = None
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for callback in callbacks:
                _call(callback, self)

    def add_done_callback(self, callback: Callable[["Deferred[T]"], None]) -> None:
        """Call ``callback(self)`` when done: now if it already is, else from ``set_*``."""
        if self._state != _PENDING:
            _call(callback, self)
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def then(self, outcome: Callable[["Deferred[T]"], U]) -> "Deferred[U]":
        """A Deferred of ``outcome(self)``, computed as soon as this one is done; cancelling it
        cancels this one too (nobody else waits for it: a parked fetch lets go of its watch)."""
        derived: Deferred[U] = Deferred()
        derived.on_cancel(self.cancel)

        def forward(done: "Deferred[T]") -> None:
            if derived._state != _PENDING or done._state == _CANCELLED:  # done(), cancelled(): per sync ack
                return
            try:
                value = outcome(done)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on ``derived``
                derived.set_exception(exc)
            else:
                derived.set_result(value)

        self.add_done_callback(forward)
        return derived

    def __await__(self) -> Generator[Any, None, T]:
        if self._state == _PENDING:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.add_done_callback(lambda _done: future.done() or future.set_result(None))
            yield from future.__await__()
        return self.result()


def _call(callback: Callable[[Any], None], deferred: Deferred[Any]) -> None:
    try:
        callback(deferred)
    except Exception:  # one bad callback must not stop the resolver (another request's put)
        log.exception("error in a callback of %r", callback)
