"""Message filters (MetaQ's ``ConsumerMessageFilter``): skip messages before the listener.

A filter is an object with ``accept(group, message) -> bool``, or a plain callable with
the same arguments. Messages it rejects are never handed to a listener, a batch listener
or an iterating application, yet the partition's offset moves past them as if consumed
(a restarted consumer does not see them again, unless it re-reads uncommitted ones: a
filter must give the same answer for the same message).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Protocol, Union, runtime_checkable

from .message import Message

log = logging.getLogger(__name__)


@runtime_checkable
class ConsumerMessageFilter(Protocol):
    def accept(self, group: str, message: Message) -> bool: ...


MessageFilter = Union[ConsumerMessageFilter, Callable[[str, Message], bool]]


class AttributeFilter:
    """Accept only messages whose attribute is one of ``attributes`` (None: no attribute)."""

    def __init__(self, *attributes: str | None) -> None:
        if not attributes:
            raise ValueError("AttributeFilter needs at least one attribute")
        self.attributes = frozenset(attributes)

    def accept(self, group: str, message: Message) -> bool:
        return message.attribute in self.attributes

    def __repr__(self) -> str:
        return f"AttributeFilter({', '.join(map(repr, sorted(self.attributes, key=str)))})"


def accept_function(message_filter: MessageFilter) -> Callable[[str, Message], bool]:
    """The filter as a plain ``accept(group, message)`` function."""
    if isinstance(message_filter, ConsumerMessageFilter):
        return message_filter.accept
    if callable(message_filter):
        return message_filter
    raise TypeError(f"a message filter needs accept(group, message) or must be callable, got {type(message_filter).__name__}")


def accepted(accept: Callable[[str, Message], bool], group: str, messages: Iterable[Message]) -> list[Message]:
    """The messages the filter accepts, in order. A filter that raises lets the message through:
    a broken filter must not make messages vanish unseen."""
    kept = []
    failed = 0
    for message in messages:
        try:
            ok = accept(group, message)
        except Exception:
            # One traceback per fetch: a filter broken for every message would otherwise log
            # one per message, burying everything else in the log.
            if not failed:
                log.exception("message filter failed on %s-%s@%s; delivering the message",
                              message.topic, message.partition, message.offset)
            failed += 1
            ok = True
        if ok:
            kept.append(message)
    if failed > 1:
        log.error("message filter failed on %d more message(s) of the same fetch; delivered them", failed - 1)
    return kept
