"""Keep the C++ start-up lines of TensorFlow and absl off the terminal.

At import and at device set-up TensorFlow's C++ side writes to file
descriptor 2 whatever ``TF_CPP_MIN_LOG_LEVEL`` says, before absl's logging
is initialised: "All log messages before absl::InitializeLog() ...",
"oneDNN custom operations are on", "Could not find cuda drivers" and, on a
machine without a GPU, "failed call to cuInit: CUDA error". Above the one
line of an error they bury it. `native_stderr_to` sends descriptor 2 to a
file for the rest of the process and gives Python's ``sys.stderr`` the
terminal back, so what Python prints (errors, warnings, progress) still
shows; a command's ``--verbose`` leaves both alone.

Example:

>>> import os, sys, tempfile
>>> log = os.path.join(tempfile.mkdtemp(), "native.log")
>>> pid = os.fork()
>>> if pid == 0:
...     native_stderr_to(log)
...     _ = os.write(2, b"from C++\\n")
...     os._exit(0)
>>> _ = os.waitpid(pid, 0)
>>> open(log).read()
'from C++\\n'
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

KEEP_BYTES = 1 << 20


def native_stderr_to(path: str | Path) -> Path:
    """Point descriptor 2 (C and C++ libraries) at ``path`` and keep
    ``sys.stderr`` on the terminal; returns ``path``.

    Processes append (several commands may run at once); the file starts
    afresh once it holds more than a MiB.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > KEEP_BYTES:
        path.unlink(missing_ok=True)
    sys.stderr.flush()
    terminal = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)
    sys.stderr = os.fdopen(
        terminal, "w", buffering=1, encoding="utf-8", errors="backslashreplace"
    )
    return path
