"""Reading a file the user names: a regular file, of bounded size.

Every reader of a user's files (data sources, captions and images of a
folder, ``predict --file``, config files, the C loader's ``KEY=@FILE``) goes
through `read_file`: it refuses what is not a regular file (a FIFO would
hang, ``/dev/zero`` never ends, a socket cannot be read) naming what was
expected, refuses a file larger than the bound, and reads at most the bound
and one byte more, so a file that grows while it is read is refused too.
The bound is `DEFAULT_MAX_BYTES` unless the environment variable
``ATTENTION_PIPELINES_MAX_FILE_BYTES`` gives another.

Example:

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> path = os.path.join(folder, "pairs.tsv")
>>> with open(path, "w") as handle:
...     _ = handle.write("a\\tb\\n")
>>> read_file(path, "a TSV file")
b'a\\tb\\n'
>>> read_file(path, "a TSV file", limit=2)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pipelines.core.errors.PipelineError: ...pairs.tsv: expected a TSV file of at most 2 ...
>>> read_file(folder, "a TSV file")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pipelines.core.errors.PipelineError: ...: expected a TSV file, received a folder...
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pipelines.core.errors import PipelineError

MAX_BYTES_VARIABLE = "ATTENTION_PIPELINES_MAX_FILE_BYTES"
DEFAULT_MAX_BYTES = 2 * 2**30  # 2 GiB
_CHUNK = 1 << 20


def max_bytes() -> int:
    """The bound on a user file's size: ``$ATTENTION_PIPELINES_MAX_FILE_BYTES``
    or `DEFAULT_MAX_BYTES`."""
    value = os.environ.get(MAX_BYTES_VARIABLE, "").strip()
    if not value:
        return DEFAULT_MAX_BYTES
    if not value.isdigit() or int(value) < 1:
        raise PipelineError(
            f"{MAX_BYTES_VARIABLE} must be a positive number of bytes, received "
            f"{value[:40]!r}; unset it for the default ({DEFAULT_MAX_BYTES})."
        )
    return int(value)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` is, in words ("a FIFO", "a folder", ...)."""
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _too_large(path: Path, what: str, limit: int, size: str) -> PipelineError:
    return PipelineError(
        f"{path}: expected {what} of at most {limit} bytes, received {size}; "
        f"split it, or raise the bound with {MAX_BYTES_VARIABLE}=BYTES."
    )


def read_file(
    path: str | Path, what: str = "a file", limit: int | None = None
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them
    (default `max_bytes`).

    Raises:
        PipelineError: ``path`` is not a regular file (a folder, a FIFO, a
            device, a socket), or holds more than ``limit`` bytes; the
            message names ``what`` was expected.
        OSError: the file cannot be opened (missing, no permission): callers
            word that themselves.
    """
    path = Path(path)
    limit = max_bytes() if limit is None else limit
    mode = os.stat(path).st_mode  # follows links; FileNotFoundError as usual
    if not stat.S_ISREG(mode):
        raise PipelineError(
            f"{path}: expected {what}, received {kind_of(mode)}; give a regular "
            "file (copy a stream into one first)."
        )
    # O_NONBLOCK: were the path swapped for a FIFO since, opening it does not
    # wait for a writer (the check below refuses it).
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    handle = os.open(path, flags)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise PipelineError(
                f"{path}: expected {what}, received {kind_of(info.st_mode)}."
            )
        if info.st_size > limit:
            raise _too_large(path, what, limit, f"{info.st_size} bytes")
        chunks, total = [], 0
        while True:
            chunk = os.read(handle, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _too_large(path, what, limit, "more (it grew while read)")
        return b"".join(chunks)
    finally:
        os.close(handle)
