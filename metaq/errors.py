"""Errors a user can act on; the CLI prints them as one line, without a traceback."""

from __future__ import annotations


class MetaqError(Exception):
    """Base of every error meant for the user."""
