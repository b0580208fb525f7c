"""Errors a user can act on; the CLI prints them as one line, without a traceback."""

from __future__ import annotations


class MetaqError(Exception):
    """Base of every error meant for the user."""


class UsageError(MetaqError):
    """A command line whose options do not make a request (one missing that the action needs,
    two that go together given apart): the CLI exits 2, as argparse does for an unknown option."""
