"""Logging for every ``metaq`` command: stderr or a rotating file, text or JSON lines.

Sources, later ones winning: the command line (``metaq --log-file F --log-format json
-v``), then a broker's ``[system]`` keys (``logFile``, ``logFormat``, ``logLevel``,
``logMaxBytes``, ``logBackupCount``). ``set_level`` changes the level of a running
broker (SIGHUP).

kazoo logs every failed reconnection attempt as a warning, many lines a second while
ZooKeeper is down; its loggers are held at ERROR, and an outage is reported by the
broker itself, one line when it starts and one when it ends (``metaq.zk.monitor``).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The root logger's handler installed by ``configure`` (replaced on each call).
_HANDLER_ATTR = "_metaq_handler"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC, ms), ``level``, ``logger``, ``msg``, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(
    level: str | int = "INFO",
    log_file: str | None = None,
    log_format: str = "text",
    max_bytes: int = 100 * 1024 * 1024,
    backup_count: int = 5,
    force: bool = False,
) -> None:
    """Send every log record to one handler: stderr, or ``log_file`` rotated at ``max_bytes``.

    ``max_bytes=0`` never rotates (for logrotate with copytruncate). Calling it again
    replaces the handler (a broker re-configures once it has read its server.ini).
    Like ``logging.basicConfig``, it leaves a process whose logging someone else set up
    (pytest, an application embedding the CLI) alone unless ``force``.
    """
    root = logging.getLogger()
    if not force and any(h is not getattr(root, _HANDLER_ATTR, None) for h in root.handlers):
        return
    if log_file:
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8"
        )
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    old = getattr(root, _HANDLER_ATTR, None)
    if old is not None:  # only our own: handlers others installed (pytest's, an embedding app's) stay
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    setattr(root, _HANDLER_ATTR, handler)
    set_level(level)
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def set_level(level: str | int) -> None:
    logging.getLogger().setLevel(level if isinstance(level, int) else level.upper())
