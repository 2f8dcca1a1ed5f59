"""Errors raised by the data layer."""

from __future__ import annotations


class MissingDataError(FileNotFoundError):
    """A corpus read at run time is not installed; the message says how to get it."""
