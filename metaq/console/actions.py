"""The console's operations are the CLI's commands, run as the CLI runs them.

``metaq promote``, ``metaq topics create|alter|delete`` and ``metaq groups reset-offsets``
already check everything (a slave outside the sync set, partitions that only grow, a
group with live members, an offset that does not start a message, ...) and answer with
one line and an exit status. The console builds the command line from the form's fields
and runs ``python -m metaq ...`` as a child process with the console's own cluster login
(``--zk``, ``--user`` with the password on the child's stdin, ``--tls-ca``, the group's
``--group-secret``): whatever the CLI refuses is refused here with the CLI's own line, and
what it does is what it would do in a terminal. Every field becomes one ``--option=value``
word, so no value can pass for an option, and no shell is involved.

A confirmation names what is acted on: the request carries ``confirm`` equal to the broker
group id (promote), the topic (topics) or the consumer group (an executed reset), as the
operator typed it in the page's dialog; a mismatch is a 400 before anything runs. A reset
without ``execute`` is the CLI's dry run (its plan), which needs no confirmation.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import metaq

#: Seconds a command may take: the CLI's own waits (a promote's 15 s, a topic change's 15 s) plus margin.
COMMAND_TIMEOUT_S = 60.0
RESET_TARGETS = {"earliest": "--to-earliest", "latest": "--to-latest", "current": "--to-current", "datetime": "--to-datetime",
                 "duration": "--by-duration", "offset": "--to-offset", "shift": "--shift-by"}


class ActionError(Exception):
    """A request the console refuses before running anything (400): the one line says why."""


@dataclass(frozen=True)
class ClusterLogin:
    """How the console's commands reach the cluster: the console's own options, passed on."""

    zk: str
    zk_root: str
    user: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    #: broker group id -> its group secret file (ZooKeeper ACLs on)
    group_secrets: tuple[tuple[int, str], ...] = ()

    def argv(self, broker_id: int | None = None) -> list[str]:
        words = [f"--zk={self.zk}", f"--zk-root={self.zk_root}"]
        if self.user is not None:
            words += [f"--user={self.user}", "--password-file=/dev/stdin"]
        if self.tls_ca is not None:
            words.append(f"--tls-ca={self.tls_ca}")
        secret = dict(self.group_secrets).get(broker_id) if broker_id is not None else None
        if secret is not None:
            words.append(f"--group-secret={secret}")
        return words


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    exit_code: int
    output: str
    error: str

    def json(self) -> dict[str, Any]:
        # The command as an operator would type it (the password never was on it).
        return {"command": "metaq " + " ".join(self.argv), "exit_code": self.exit_code, "output": self.output, "error": self.error}

    @property
    def http_status(self) -> int:
        return {0: 200, 2: 400}.get(self.exit_code, 409)


async def run_cli(login: ClusterLogin, words: list[str], broker_id: int | None = None) -> CommandResult:
    """``metaq WORDS`` with the console's cluster login, as a child process."""
    argv = words + login.argv(broker_id)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(metaq.__file__).parent.parent), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "200"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metaq", *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    secret = (login.password + "\n").encode() if login.password is not None else b""
    try:
        out, err = await asyncio.wait_for(process.communicate(secret), COMMAND_TIMEOUT_S)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        return CommandResult(argv, 1, "", f"metaq {words[0]}: no answer within {COMMAND_TIMEOUT_S:.0f} s; stopped")
    shown = [w for w in argv if not w.startswith("--password-file")]
    return CommandResult(shown, process.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


# --- forms -> command words --------------------------------------------------------------------


def _text(form: dict[str, Any], key: str) -> str:
    value = form.get(key)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value).strip() == "":
        raise ActionError(f"{key!r} is required")
    return str(value).strip()


def _int(form: dict[str, Any], key: str) -> int:
    text = _text(form, key)
    if not text.lstrip("-").isdigit():
        raise ActionError(f"{key!r} must be a whole number, got {text!r}")
    return int(text)


def _confirmed(form: dict[str, Any], name: str, what: str) -> None:
    if str(form.get("confirm", "")).strip() != name:
        raise ActionError(f"not confirmed: type {what} {name!r} to confirm")


def promote_words(form: dict[str, Any]) -> tuple[list[str], int]:
    broker_id = _int(form, "broker_id")
    _confirmed(form, str(broker_id), "the broker group id")
    words = ["promote", f"--broker-id={broker_id}", f"--slave={_int(form, 'slave')}"]
    if form.get("unclean") is True:
        words.append("--unclean")
    return words, broker_id


def topic_words(action: str, form: dict[str, Any]) -> tuple[list[str], int]:
    if action not in ("create", "alter", "delete"):
        raise ActionError(f"unknown topic action {action!r} (create, alter or delete)")
    broker_id, topic = _int(form, "broker_id"), _text(form, "topic")
    _confirmed(form, topic, "the topic")
    words = ["topics", action, f"--broker-id={broker_id}", f"--topic={topic}"]
    if action != "delete":
        if form.get("partitions") not in (None, ""):
            words.append(f"--partitions={_int(form, 'partitions')}")
        settings = form.get("settings") or []
        if not isinstance(settings, list) or not all(isinstance(s, str) for s in settings):
            raise ActionError("'settings' must be a list of KEY=VALUE texts")
        words += [f"--set={setting.strip()}" for setting in settings if setting.strip()]
    return words, broker_id


def reset_words(form: dict[str, Any]) -> list[str]:
    group = _text(form, "group")
    words = ["groups", "reset-offsets", f"--group={group}"]
    words.append("--all-topics" if form.get("topic") in (None, "", "*") else f"--topic={_text(form, 'topic')}")
    if form.get("partition") not in (None, ""):
        words.append(f"--partition={_text(form, 'partition')}")
    target = _text(form, "target")
    if target not in RESET_TARGETS:
        raise ActionError(f"unknown target {target!r} ({', '.join(RESET_TARGETS)})")
    option = RESET_TARGETS[target]
    words.append(option if target in ("earliest", "latest", "current") else f"{option}={_text(form, 'value')}")
    if form.get("execute") is True:
        _confirmed(form, group, "the consumer group")
        words.append("--execute")
    return words
