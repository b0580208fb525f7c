"""Fakes shared by the HA coordinator's unit tests (metaq/ha/coordinator.py and its parts)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable


async def call_inline(func: Callable[..., Any], *args: Any) -> Any:
    """``BrokerRegistry.call`` without the worker thread: the call runs where it is awaited."""
    return func(*args)


def fake_registry(url: str, **fields: Any) -> SimpleNamespace:
    """A registry with no ZooKeeper behind it: its ordered worker runs each call inline."""
    return SimpleNamespace(client=object(), url=url, call=call_inline, **fields)
