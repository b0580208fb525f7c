"""Operator and test tools built on the runtime: the failover drill, the replica verifier, the local process launcher.

Nothing in the broker or the client imports from here."""
