"""SIGHUP: re-read server.ini, apply what can change in a running broker, say the rest.

Applied live: topic sections (new topics, partitions, per-topic flush policy and
retention), the ``[system]`` topic defaults except ``dataPath`` (flush policy,
retention, segment size), logging (``logLevel``, ``logFile``, ``logFormat``), and,
with security on, the users of the security file (``securityConfig``): new users,
new passwords and ACLs apply at once; a removed user's connections (and those that
logged in with a password that changed) are closed and its producer tokens stop
verifying (metaq/security/settings.py ``reload_users``). Everything else (ports, ids,
replication mode, ZooKeeper, the security keys of server.ini, ``dataPath``) needs a
restart; the broker keeps running with the old values and says so.

In a broker group with a topic configuration in ZooKeeper (metaq/zk/topic_config.py)
topic sections go through it: a broker started without ``--slave`` publishes the
sections the edit changed, so the whole group applies them; a slave's sections do
not override the group's. The outcome is one log line:
``reload: applied ...; needs a restart: ...``, logged at the broker's log level or
above, so that ``logLevel=WARNING`` still shows it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..config import BrokerConfig, ConfigError, TopicConfig, changed_keys, load_server_ini
from ..logsetup import configure as configure_logging
from .live_config import LiveConfig, logging_changed

if TYPE_CHECKING:
    from ..security.settings import BrokerSecurity
    from .group_topics import GroupTopicsApplier
    from .registry import BrokerRegistry


log = logging.getLogger(__name__)

#: Keys a running broker takes over from a reloaded server.ini.
LIVE_KEYS = {
    "numPartitions", "unflushThreshold", "unflushInterval", "maxSegmentSize", "maxTransferSize",
    "deletePolicy", "deleteWhen", "acceptPublish", "acceptSubscribe",
    "logLevel", "logFile", "logFormat", "logMaxBytes", "logBackupCount",
}


class ReloadedBroker(Protocol):
    """What a reload uses of the broker (metaq.server.broker.Broker), and nothing more
    (tests/unit/test_broker_protocols.py holds this module to it)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def live_config(self) -> LiveConfig:
        """The configuration's one owner: ``reload`` takes over the live keys."""

    @property
    def local_topics(self) -> dict[str, TopicConfig]: ...

    @property
    def registry(self) -> BrokerRegistry | None:
        """Publishes the new server.ini checksum (``set_checksum``)."""

    @property
    def group_topics(self) -> GroupTopicsApplier | None:
        """The group's topic configuration, when the broker serves one."""

    @property
    def security(self) -> BrokerSecurity:
        """Re-reads the security file's users (``reload_users``)."""

    async def update_topics(self, topics: dict[str, TopicConfig]) -> None: ...


async def reload_config(broker: ReloadedBroker) -> str:
    """Apply the server.ini on disk; return (and log) the one-line outcome."""
    path = broker.config.source_path
    if not path:
        return _say("reload: nothing to do (this broker was not started from a file)")
    try:
        new = load_server_ini(path)
    except ConfigError as exc:
        return _say(f"reload refused, still running the old configuration: {exc}", logging.ERROR)
    old = broker.config
    keys = changed_keys(old, new)
    restart = [key for key in keys if key not in LIVE_KEYS]
    applied = [key for key in keys if key in LIVE_KEYS]
    local = broker.local_topics  # before the reload replaces them
    edited = {name: (local.get(name), topic) for name, topic in new.topics.items() if local.get(name) != topic}
    removed = sorted(set(local) - set(new.topics))
    broker.live_config.reload(new)  # its subscribers follow (follow_logging); server.ini's topics too
    if broker.registry is not None and new.checksum != old.checksum:
        await broker.registry.set_checksum(new.checksum)  # slaves with autoSyncMasterConfig re-read it
    applied += await _apply_topics(broker, new, edited, removed)
    applied += _reload_users(broker, restart)
    if removed and broker.group_topics is not None and broker.group_topics.group.exists:
        restart.append(f"nothing: removed sections {', '.join(removed)} stay in the group (metaq topics delete)")
    line = "reload: applied " + (", ".join(applied) if applied else "nothing (no live setting changed)")
    if restart:
        line += "; needs a restart: " + ", ".join(restart)
    return _say(line)


async def _apply_topics(broker: ReloadedBroker, new: BrokerConfig, edited: dict, removed: list[str]) -> list[str]:
    group = broker.group_topics
    if group is not None and group.group.exists:
        notes = []
        if edited and group.seeds:
            try:
                await group.publish(edited)
            except Exception as exc:  # ZooKeeper away: the operator sends SIGHUP again later
                notes.append(f"nothing from sections {', '.join(sorted(edited))} (cannot write the group's topic configuration: {exc!r}; send SIGHUP again)")
            else:
                notes.append(f"topic sections {', '.join(sorted(edited))} (published to the group's topic configuration)")
        elif edited:
            notes.append(f"nothing from sections {', '.join(sorted(edited))} (a slave serves the group's topic configuration)")
        await group.apply(group.group)  # the [system] defaults may have changed
        return notes
    await broker.update_topics(new.topics)
    changed = sorted(set(edited) | set(removed))
    return [f"topic sections {', '.join(changed)}"] if changed else []


def _reload_users(broker: ReloadedBroker, restart: list[str]) -> list[str]:
    """The security file's users, re-read (security on); a bad file keeps the old ones."""
    from ..security.errors import SecurityError

    try:
        change = broker.security.reload_users()
    except (SecurityError, OSError) as exc:
        restart.append(f"nothing from {broker.config.security.security_config} (kept the old users: {exc})")
        return []
    return [change] if change else []


def follow_logging(old: BrokerConfig, new: BrokerConfig) -> None:
    """A LiveConfig subscriber: apply the logging keys when a swap changed them."""
    if logging_changed(old, new):
        apply_logging(new)


def apply_logging(config: BrokerConfig) -> None:
    """The broker's ``[system]`` logging keys; unset ones leave the command line's choice."""
    if config.log_file or config.log_format:
        configure_logging(
            config.log_level or logging.getLogger().level, config.log_file, config.log_format or "text",
            config.log_max_bytes, config.log_backup_count, force=True,  # the server.ini asked for it
        )
    elif config.log_level:
        logging.getLogger().setLevel(config.log_level)


def _say(line: str, level: int = logging.INFO) -> str:
    # The operator sent the signal and looks for this line: never below the level that is shown.
    log.log(max(level, log.getEffectiveLevel()), "%s", line)
    return line
