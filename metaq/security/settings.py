"""From server.ini's security keys to the objects a broker uses: the one call the wiring makes.

``load_broker_security(config)`` reads every file the keys name (group secret, security
file, certificates) at start, so a broker with a missing or wrong file refuses to start
with one line naming it instead of failing on the first connection.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass

from ..config import BrokerConfig, SecurityConfig
from ..zk.acl import ZkSecurity
from .acl import Authorizer
from .credentials import SecurityFile
from .group import GroupSecret
from .producer_tokens import ProducerTokens
from .handshake import ClientAuthenticator, ServerAuthenticator
from .scram import ScramSecret
from .tls import ReloadingServerContext, client_context


@dataclass
class BrokerSecurity:
    config: SecurityConfig
    group: GroupSecret | None = None
    users: SecurityFile | None = None
    authorizer: Authorizer | None = None
    group_scram: ScramSecret | None = None
    tls: ReloadingServerContext | None = None
    zookeeper: ZkSecurity | None = None

    @property
    def authentication_required(self) -> bool:
        return self.config.enabled

    def lookup(self, name: str) -> ScramSecret | None:
        """The stored secret of a user or of this group's brokers; None for anyone else."""
        if self.group is not None and self.group.accepts(name):
            return self.group_scram
        return self.users.secret_for(name) if self.users is not None else None

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
        return ProducerTokens(self.group.producer_token_key()) if self.group is not None else None

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
