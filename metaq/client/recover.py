"""The local recover store: messages whose listener kept failing, redelivered in the background.

``ConsumerConfig(failure_store="local")``, MetaQ's way (the default is the group's retry
topic, retry_topics.py: replicated and seen by every member, where this store lives and
dies with one host's disk). A consumer with the default still drains what an earlier
version left here (its RecoverManager runs in both modes), so switching loses nothing.

MetaQ moves such a message to a local store so that one bad message does not stall its
partition, and retries it later. Here each message is one file,
``{dir}/{topic}/{partition}-{offset:020d}.rec``, holding the message as a record in the
log format (msg id, attribute, data, CRC), written to a temp file and renamed into place:
a crash leaves a whole file or none. A file is deleted only after its listener succeeded,
so a message stays in the store across consumer restarts until it is handled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path
from typing import Awaitable, Callable

from ..record import RecordError, encode_record, iter_records
from .message import Message, Partition

log = logging.getLogger(__name__)

SUFFIX = ".rec"


class RecoverStore:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, message: Message) -> Path:
        return self.directory / message.topic / f"{message.partition}-{message.offset or 0:020d}{SUFFIX}"

    def append(self, message: Message) -> Path:
        path = self._path(message)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = encode_record(message.data, message.attribute, message.id or 0)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(record)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def pending(self, topic: str) -> list[tuple[Path, Message]]:
        """The stored messages of ``topic`` in (partition, offset) order; unreadable files are skipped."""
        folder = self.directory / topic
        if not folder.is_dir():
            return []
        found = []
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            try:
                found.append((path, self._load(topic, path)))
            except (OSError, ValueError) as exc:
                log.warning("recover store: skipping unreadable %s: %s", path, exc)
        return found

    def count(self, topic: str | None = None) -> int:
        topics = [topic] if topic else [p.name for p in self.directory.iterdir() if p.is_dir()] if self.directory.is_dir() else []
        return sum(len(list((self.directory / t).glob(f"*{SUFFIX}"))) for t in topics)

    @staticmethod
    def _load(topic: str, path: Path) -> Message:
        partition_name, _, offset_text = path.name[: -len(SUFFIX)].rpartition("-")
        records = list(iter_records(path.read_bytes()))
        if len(records) != 1:
            raise RecordError(f"expected one whole record, found {len(records)}")
        record = records[0]
        return Message(
            topic,
            record.data,
            record.attribute,
            id=record.msg_id,
            partition=Partition.parse(partition_name),
            offset=int(offset_text),
        )

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)


Deliver = Callable[[Message], Awaitable[bool]]


class RecoverManager:
    """Every ``interval`` seconds, hands each stored message of the subscribed topics to ``deliver``.

    ``deliver`` returns True when the listener accepted the message; the file is then removed.
    """

    def __init__(self, store: RecoverStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._listeners: dict[str, Deliver] = {}
        self._task: asyncio.Task[None] | None = None
        self.redelivered = 0

    def register(self, topic: str, deliver: Deliver) -> None:
        self._listeners[topic] = deliver

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="metaq-recover")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run_once(self) -> int:
        """One pass over the store; returns how many messages were redelivered."""
        done = 0
        for topic, deliver in list(self._listeners.items()):
            for path, message in await asyncio.to_thread(self.store.pending, topic):
                if await deliver(message):
                    self.store.remove(path)
                    done += 1
        self.redelivered += done
        return done

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                done = await self.run_once()
                if done:
                    log.info("recover store: redelivered %d message(s)", done)
            except Exception:
                log.exception("recover pass failed; will retry")
