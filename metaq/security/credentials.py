"""The security file: users, their stored SCRAM secrets and their ACLs (``securityConfig``).

An INI file the operator writes with ``metaq security add-user`` (or by hand):

    [user=alice]
    scram=SCRAM-SHA-256:4096:<salt>:<stored key>:<server key>
    produce=orders, logs.*
    consume=*
    admin=false

Passwords are never stored: only the salted, iterated SCRAM secret, which checks a
password but cannot be used to log in. The file is still kept owner-only, since the
secret allows an offline guessing attack on weak passwords.
"""

from __future__ import annotations

import configparser
import io
from dataclasses import dataclass, field, replace
from pathlib import Path

from .acl import UserAcl, parse_patterns
from .errors import SecurityError
from .files import read_private, write_private
from .principals import check_user_name
from .scram import DEFAULT_ITERATIONS, ScramSecret, make_secret

_SECTION_PREFIX = "user="
_KEYS = ("scram", "produce", "consume", "admin")
_HEADER = "; metaq security file: users, their SCRAM secrets (never passwords) and ACLs.\n"


@dataclass(frozen=True)
class User:
    name: str
    secret: ScramSecret
    acl: UserAcl = field(default_factory=UserAcl)


@dataclass
class SecurityFile:
    users: dict[str, User] = field(default_factory=dict)
    path: str = "security.ini"

    # --- reading ------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> "SecurityFile":
        return cls.parse(read_private(path, "security file"), str(path))

    @classmethod
    def parse(cls, data: bytes, path: str = "security.ini") -> "SecurityFile":
        parser = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            parser.read_string(data.decode("utf-8"), source=path)
        except (configparser.Error, UnicodeDecodeError) as exc:
            raise SecurityError(f"{path}: not a valid INI file: {str(exc).splitlines()[0]}") from None
        users: dict[str, User] = {}
        for section in parser.sections():
            if not section.startswith(_SECTION_PREFIX):
                raise SecurityError(f"{path}: [{section}]: unknown section (expected [user=NAME])")
            users[section[len(_SECTION_PREFIX):]] = cls._user(parser[section], section, path)
        return cls(users, path)

    @staticmethod
    def _user(values: configparser.SectionProxy, section: str, path: str) -> User:
        name = section[len(_SECTION_PREFIX):]
        try:
            check_user_name(name)
            for key in values:
                if key not in _KEYS:
                    raise SecurityError(f"{key}: unknown key (expected one of {', '.join(_KEYS)})")
            if "scram" not in values:
                raise SecurityError("scram: required key is missing")
            secret = ScramSecret.decode(values["scram"])
            try:
                admin = values.getboolean("admin", fallback=False)
            except ValueError:
                raise SecurityError(f"admin: expected true or false, got {values['admin']!r}") from None
            acl = UserAcl(parse_patterns(values.get("produce", "")), parse_patterns(values.get("consume", "")), admin)
        except SecurityError as exc:
            raise SecurityError(f"{path}: [{section}] {exc}") from None
        return User(name, secret, acl)

    def secret_for(self, name: str) -> ScramSecret | None:
        user = self.users.get(name)
        return user.secret if user else None

    def acls(self) -> dict[str, UserAcl]:
        return {name: user.acl for name, user in self.users.items()}

    # --- changing -------------------------------------------------------------------------

    def add_user(
        self,
        name: str,
        password: str,
        *,
        produce: str = "",
        consume: str = "",
        admin: bool = False,
        iterations: int = DEFAULT_ITERATIONS,
    ) -> User:
        """Add a user, or replace an existing one's password and ACL."""
        user = User(
            check_user_name(name),
            make_secret(password, iterations),
            UserAcl(parse_patterns(produce), parse_patterns(consume), admin),
        )
        self.users[name] = user
        return user

    def set_password(self, name: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> None:
        user = self._existing(name)
        self.users[name] = replace(user, secret=make_secret(password, iterations))

    def remove_user(self, name: str) -> None:
        self._existing(name)
        del self.users[name]

    def _existing(self, name: str) -> User:
        if name not in self.users:
            raise SecurityError(f"{self.path}: no user {name!r}")
        return self.users[name]

    # --- writing --------------------------------------------------------------------------

    def render(self) -> str:
        out = io.StringIO()
        out.write(_HEADER)
        for user in self.users.values():
            out.write(f"\n[{_SECTION_PREFIX}{user.name}]\n")
            out.write(f"scram={user.secret.encode()}\n")
            out.write(f"produce={', '.join(user.acl.produce)}\n")
            out.write(f"consume={', '.join(user.acl.consume)}\n")
            out.write(f"admin={'true' if user.acl.admin else 'false'}\n")
        return out.getvalue()

    def save(self, path: str | Path | None = None) -> None:
        write_private(path or self.path, self.render().encode("utf-8"))


def load_or_new(path: str | Path) -> SecurityFile:
    """The file at ``path``, or an empty one to be saved there."""
    if Path(path).exists():
        return SecurityFile.load(path)
    return SecurityFile({}, str(path))
