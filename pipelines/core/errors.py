"""The pipelines' error types; each message says what to fix.

The command line prints any of them as one line (``pipelines.cli.describe``).
"""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A run cannot go on; the message says what to fix."""


class ConfigError(ValueError):
    """A configuration value or file is wrong; the message names the key."""


class MissingDataError(FileNotFoundError):
    """A corpus read at run time is not installed; the message says how to get it."""
