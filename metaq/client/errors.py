"""Which failures a retry can fix: the client's error classes (Kafka's retriable vs fatal).

A *retriable* failure may go away by itself (a failover, a broker restarting, a master
not registered yet): the producer retries it until ``send_timeout_s``. A *fatal* one
cannot succeed before someone changes a setting (a password, an ACL, ``acceptPublish``,
TLS on one side only): the send fails at once with the broker's reason, so the caller
sees the cause in well under a second instead of a timeout with misleading words. The
full table is in docs/client.md ("Error classes").
"""

from __future__ import annotations

import re

from ..protocol import commands as c

#: A 403 that an ACL decided: the principal lacks the right, on every broker of the group,
#: until an operator grants it. Every other 403 is retriable: a slave that names its master,
#: a stale epoch, a fence. A broker marks its authorization refusals with ``reason: "acl"``
#: (protocol/codes.py, ``AccessDenied``); for a broker older than that field, the wording
#: (``security/acl.py : Authorizer.denial``) is matched instead.
#: tests/unit/test_client_errors.py runs every denial Authorizer can word through this.
_ACCESS_DENIAL = re.compile(
    r"(?:user '[^']*' (?:may not |has no permissions here|lacks the admin permission)"
    r"|not authenticated: send the auth handshake)"
)


def access_denied(code: int, message: str, reason: object = None) -> bool:
    """Is a reply with ``code``, ``message`` and header field ``reason`` an ACL's refusal (fatal)?"""
    if code != c.FORBIDDEN:
        return False
    if reason is not None:  # the broker said why: trust that over the wording
        return reason == c.ACCESS_DENIED
    return _ACCESS_DENIAL.search(message) is not None

