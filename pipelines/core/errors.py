"""The pipelines' error types; each message says what to fix.

The command line prints any of them as one line (``pipelines.cli.describe``),
at most `MAX_MESSAGE` characters (`capped`). `os_failure` finds a full disk,
a refused permission, a read-only file system or too many open files
anywhere in an exception's chain or its text (h5py and TensorFlow wrap the
``OSError``), and says what to do about it.
"""

from __future__ import annotations

import errno
import os
import re

MAX_MESSAGE = 500  # characters of a one-line error message


def capped(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text``, or its first ``limit`` characters and how many were cut.

    >>> capped("x" * 600)[-29:]
    'xxxxx... (100 characters cut)'
    """
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} characters cut)"


class PipelineError(RuntimeError):
    """A run cannot go on; the message says what to fix."""


class ConfigError(ValueError):
    """A configuration value or file is wrong; the message names the key (and
    is capped: a value quoted in it cannot make it long)."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(capped(str(message)), *args)


class MissingDataError(FileNotFoundError):
    """A corpus read at run time is not installed; the message says how to get it."""


# errno -> (what happened, what to do)
_OS_FAILURES = {
    errno.ENOSPC: (
        "no space left on the device",
        "free some space there (or write to another disk) and rerun",
    ),
    errno.EDQUOT: (
        "disk quota exceeded",
        "free some space there (or write to another disk) and rerun",
    ),
    errno.EACCES: (
        "permission denied",
        "fix the permissions (or choose a folder you may write to) and rerun",
    ),
    errno.EPERM: (
        "operation not permitted",
        "fix the permissions (or choose a folder you may write to) and rerun",
    ),
    errno.EROFS: (
        "read-only file system",
        "choose a writable folder (e.g. another --run-dir or --base) and rerun",
    ),
    errno.EMFILE: (
        "too many open files",
        "raise the limit of this shell (`ulimit -n 4096`) and rerun",
    ),
    errno.ENFILE: (
        "too many open files in the system",
        "close other programs or raise the system's limit (fs.file-max) and rerun",
    ),
}
_SCANNED = 100_000  # characters of a message searched for an errno
_ERRNO_TEXT = re.compile(r"(?:\berrno\s*=\s*|\[Errno\s+)(\d+)", re.IGNORECASE)
_STRERROR_TEXT = re.compile(
    "|".join(re.escape(os.strerror(number)) for number in _OS_FAILURES),
    re.IGNORECASE,
)
_NUMBER_OF = {os.strerror(number).lower(): number for number in _OS_FAILURES}
_PATH_TEXT = (
    re.compile(r"filename = '([^']+)'"),  # HDF5's "file write failed"
    re.compile(r"\[Errno \d+\][^:]*: '([^']+)'"),  # str(OSError)
    re.compile(r"(/[^\s;:,']+)(?:;|:)\s*(?:" + _STRERROR_TEXT.pattern + ")"),  # TF
)


def _chain(error: BaseException) -> list[BaseException]:
    """``error``, then its causes and the errors it was raised handling."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen) or len(seen) >= 20:
            continue
        seen.append(item)
        todo += [item.__cause__, item.__context__]
    return seen


def _text_of(error: BaseException) -> str:
    message = getattr(error, "message", None)
    return str(message if isinstance(message, str) else error)[:_SCANNED]


def os_failure(error: BaseException) -> tuple[int, str | None] | None:
    """``(errno, path or None)`` of a full disk, a refused permission, a
    read-only file system or too many open files in ``error``'s chain or in
    its messages (``errno = 28``, "No space left on device"); else None.

    >>> os_failure(RuntimeError("flush failed (errno = 28, filename = '/d/w.h5')"))
    (28, '/d/w.h5')
    """
    chain = _chain(error)
    for item in chain:
        if isinstance(item, OSError) and item.errno in _OS_FAILURES:
            written = item.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
            path = (item.filename2 if written else None) or item.filename
            if path is None:
                return item.errno, _path_in(_text_of(item))
            return item.errno, os.fsdecode(path)
    for item in chain:
        text = _text_of(item)
        number = None
        for match in _ERRNO_TEXT.finditer(text):
            if int(match[1]) in _OS_FAILURES:
                number = int(match[1])
                break
        if number is None:
            match = _STRERROR_TEXT.search(text)
            number = _NUMBER_OF[match[0].lower()] if match else None
        if number is not None:
            return number, _path_in(text)
    return None


def _path_in(text: str) -> str | None:
    """The file an error's text names (HDF5's, Python's, TensorFlow's form)."""
    found = (pattern.search(text) for pattern in _PATH_TEXT)
    return next((match[1] for match in found if match), None)


def os_advice(error: BaseException) -> str | None:
    """One line for an `os_failure`: what happened, where, and what to do.

    >>> os_advice(OSError(errno.EROFS, "Read-only file system", "/mnt/runs"))
    'read-only file system: /mnt/runs; choose a writable folder (e.g. another \
--run-dir or --base) and rerun.'
    """
    found = os_failure(error)
    if found is None:
        return None
    number, path = found
    what, todo = _OS_FAILURES[number]
    where = f": {path}" if path else ""
    return capped(f"{what}{where}; {todo}.")
