"""The admin commands' ZooKeeper errors: a connection lost mid-command says that a change it
was writing may still be applied (ZooKeeper applies a write that reached it once its majority
is back), where any other failure is a plain one-line error."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from typing import Iterator

import pytest
from kazoo.exceptions import ConnectionLoss, NoAuthError, OperationTimeoutError
from kazoo.handlers.threading import KazooTimeoutError

from metaq.cli import admin
from metaq.errors import MetaqError
from metaq.zk import session


@pytest.fixture
def args(monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    @contextmanager
    def fake_session(*_args: object, **_kwargs: object) -> Iterator[object]:
        yield object()

    monkeypatch.setattr(session, "zk_session", fake_session)
    monkeypatch.setattr(admin, "zk_security", lambda *_args: None)
    return argparse.Namespace(zk="127.0.0.1:2181", zk_root="/meta", timeout=1.0, broker_id=0)


@pytest.mark.parametrize("lost", [ConnectionLoss(), OperationTimeoutError(), KazooTimeoutError()])
def test_a_connection_lost_mid_command_says_the_change_may_be_applied(args: argparse.Namespace, lost: Exception) -> None:
    with pytest.raises(MetaqError) as raised:
        with admin.zk_client(args):
            raise lost
    assert str(raised.value).startswith("ZooKeeper at 127.0.0.1:2181: ")
    assert "the change may still be applied" in str(raised.value)


def test_a_refusal_is_not_an_unknown_outcome(args: argparse.Namespace) -> None:
    with pytest.raises(MetaqError) as raised:
        with admin.zk_client(args):
            raise NoAuthError()
    assert "may still be applied" not in str(raised.value)
