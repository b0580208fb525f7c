"""From server.ini's security keys to the objects a broker uses: the one call the wiring makes.

``load_broker_security(config)`` reads every file the keys name (group secret, security
file, certificates) at start, so a broker with a missing or wrong file refuses to start
with one line naming it instead of failing on the first connection.
"""

from __future__ import annotations

import functools
import ssl
import weakref
from dataclasses import dataclass, field
from typing import Protocol

from ..config import BrokerConfig, SecurityConfig
from ..zk.acl import ZkSecurity
from .acl import Authorizer
from .credentials import SecurityFile
from .group import GroupSecret
from .principal_tags import PrincipalTags
from .principals import Principal
from .producer_tokens import ProducerTokens
from .handshake import ClientAuthenticator, ServerAuthenticator
from .scram import ScramSecret
from .tls import ReloadingServerContext, client_context


class Closable(Protocol):
    """A logged-in connection, as far as a reload that invalidates its login needs it."""

    def close(self) -> None: ...


@dataclass
class BrokerSecurity:
    config: SecurityConfig
    group: GroupSecret | None = None
    users: SecurityFile | None = None
    authorizer: Authorizer | None = None
    group_scram: ScramSecret | None = None
    tls: ReloadingServerContext | None = None
    zookeeper: ZkSecurity | None = None
    #: Connections logged in as a user (not a broker), with the principal each proved: closed
    #: when a reload removes the user or changes its password (``reload_users``). Weak: a
    #: closed connection just goes.
    _logged_in: "weakref.WeakKeyDictionary[Closable, Principal]" = field(
        default_factory=weakref.WeakKeyDictionary, repr=False)

    @property
    def authentication_required(self) -> bool:
        return self.config.enabled

    def lookup(self, name: str) -> ScramSecret | None:
        """The stored secret of a user or of this group's brokers; None for anyone else."""
        if self.group is not None and self.group.accepts(name):
            return self.group_scram
        return self.users.secret_for(name) if self.users is not None else None

    def describe(self) -> str:
        """For the broker's start line: whether security and TLS are on."""
        security = "security on (SCRAM logins, ACLs, ZooKeeper ACLs)" if self.config.enabled else "security off"
        if not self.config.tls_enabled:
            return f"{security}, TLS off (plaintext)"
        return f"{security}, TLS on (client certificates: {self.config.tls_client_auth})"

    def known_user(self, name: str) -> bool:
        """A user of the security file now, or one of this group's brokers."""
        return self.lookup(name) is not None

    def logged_in(self, connection: "Closable", principal: Principal) -> None:
        """``connection`` proved ``principal``'s password (the handshake's verdict)."""
        if not principal.is_broker:
            self._logged_in[connection] = principal

    def reload_users(self) -> str | None:
        """Re-read the security file (SIGHUP); what changed as one phrase, None if nothing did.

        New users may log in at once, a new password is the only one accepted from now on,
        and an ACL change applies to the next request. A removed user's connections, and
        those that logged in with a password that changed, are closed (their proof is no
        longer valid), and a removed user's producer tokens stop verifying
        (``producer_tokens``). SecurityError (the old users stay) on a bad file.
        """
        if self.users is None or self.config.security_config is None:
            return None
        old = self.users
        new = SecurityFile.load(self.config.security_config)
        added = sorted(set(new.users) - set(old.users))
        removed = sorted(set(old.users) - set(new.users))
        changed = sorted(name for name in set(old.users) & set(new.users) if old.users[name].secret != new.users[name].secret)
        acls = sorted(name for name in set(old.users) & set(new.users) if old.users[name].acl != new.users[name].acl)
        # Users and ACLs change together: the authenticator and the connections read them
        # from here on every login and request.
        self.users = new
        self.authorizer = Authorizer(self.authorizer.broker_id if self.authorizer else 0, new.acls())
        invalid = set(removed) | set(changed)
        closed = [conn for conn, principal in list(self._logged_in.items()) if principal.name in invalid]
        for conn in closed:
            conn.close()
        parts = [f"{what} {', '.join(names)}" for what, names in
                 (("added", added), ("removed", removed), ("new password for", changed), ("new permissions for", acls)) if names]
        if not parts:
            return None
        return "security.ini users (" + "; ".join(parts) + (f"; closed {len(closed)} connection(s)" if closed else "") + ")"

    def server_authenticator(self) -> ServerAuthenticator:
        """A fresh authenticator for one incoming connection."""
        assert self.group is not None, "authentication is off"
        return ServerAuthenticator(self.lookup, self.group.decoy_key())

    def broker_authenticator(self, member: str) -> ClientAuthenticator:
        """A slave's (``slave{k}``) or master's side when it connects to a broker of its group."""
        assert self.group is not None, "authentication is off"
        return ClientAuthenticator(self.group.username(member), self.group.scram_password())

    @property
    def heartbeat_key(self) -> bytes | None:
        """The HMAC key of the group's UDP heartbeats; None with security off (unsigned)."""
        return self.group.heartbeat_key() if self.group is not None else None

    @functools.cached_property
    def producer_tokens(self) -> ProducerTokens | None:
        """Issues and checks producer tokens; None with security off (every client is trusted)."""
        if self.group is None:
            return None
        # A token names its user: once security.ini no longer has the user, its tokens stop verifying.
        return ProducerTokens(self.group.producer_token_key(), known_user=self.known_user)

    @functools.cached_property
    def principal_tags(self) -> PrincipalTags | None:
        """Tags user names for the logs and ZooKeeper; None with security off (no users to tell apart)."""
        return PrincipalTags(self.group.principal_tag_key()) if self.group is not None else None

    def peer_client_context(self) -> ssl.SSLContext | None:
        """The context for connecting to another broker of the group (TLS on), verifying it by the CA."""
        if not self.config.tls_enabled:
            return None
        # Brokers are usually addressed by IP: the CA, not the name, says who is a broker.
        return client_context(
            self.config.tls_ca_file, self.config.tls_cert_file, self.config.tls_key_file, check_hostname=False
        )


def load_broker_security(config: BrokerConfig) -> BrokerSecurity:
    """Everything the security keys of ``config`` name, loaded and checked (SecurityError on a bad file)."""
    settings = config.security
    security = BrokerSecurity(settings)
    if settings.tls_enabled:
        assert settings.tls_cert_file is not None and settings.tls_key_file is not None  # config checks the pair
        security.tls = ReloadingServerContext(
            settings.tls_cert_file, settings.tls_key_file, settings.tls_ca_file, settings.tls_client_auth
        )
    if settings.enabled:
        group = GroupSecret.load(settings.group_secret_file, config.broker_id)
        users = SecurityFile.load(settings.security_config)
        security.group = group
        security.users = users
        security.group_scram = group.scram_secret()
        security.authorizer = Authorizer(config.broker_id, users.acls())
        security.zookeeper = ZkSecurity(config.zk.root, config.broker_id, group.zookeeper_password(), settings.group_secret_file)
    return security
