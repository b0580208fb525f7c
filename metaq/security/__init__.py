"""Trust: who may talk to a broker, and what they may do.

Built as self-contained parts that the broker's connection, handlers and HA code call:

    scram.py        SCRAM-SHA-256 secrets as stored at rest (salted, iterated; never passwords)
    messages.py     the ``auth`` op exchange as msgpack header fields
    handshake.py    sans-IO authenticators for both sides of the handshake
    principals.py   who a peer is once authenticated: a user, or a broker of a group
    credentials.py  the operator's security file: users, their secrets and their ACLs
    acl.py          the Authorizer: ``allowed(principal, operation, topic)``
    group.py        the group secret shared by a group's brokers, and what derives from it
    tls.py          ``ssl.SSLContext`` builders, with certificate reload on file change
    settings.py     the security keys of server.ini, loaded into the objects above
"""
