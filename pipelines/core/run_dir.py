"""The run folder: its paths, the config fingerprint guard, atomic writes.

A run lives in one folder; every task writes the same core files::

    run.json                 task, config fingerprint, status, epochs done
    config.yaml              the resolved configuration
    data_summary.txt         the data after filtering: sizes, what was dropped or cut
    backup/epoch-NNNNNN/     the last two end-of-epoch states: a rerun resumes here
    checkpoints/best.weights.h5   the best validation loss so far
    model.weights.h5         the final weights (written last)
    history.csv              one row per finished epoch
    logs/                    TensorBoard
    metrics.json, plots/     from evaluate

plus the task's own files (tokenizers, predictions). Every file is written
to a temporary name and renamed into place, so a crash never leaves half a
file under a real name. Each such commit (a rename or a removal) first calls
`commit_point`, the one place a crash test stops the process
(``ATTENTION_PIPELINES_CRASH_AT=N`` kills it at the N-th).

Example:

>>> import tempfile
>>> from pipelines.core.run_dir import RunDir, write_json, read_json
>>> run = RunDir(tempfile.mkdtemp())
>>> _ = write_json(run.state_path, {"status": "training"})
>>> read_json(run.state_path)["status"]
'training'
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.core.errors import PipelineError

# Crash-point testing (docs/pipelines/reliability.md): the process kills
# itself at the N-th commit point; the labels of those passed are appended to
# the log file, one a line, so a test counts the points of a command.
CRASH_AT = "ATTENTION_PIPELINES_CRASH_AT"
CRASH_LOG = "ATTENTION_PIPELINES_CRASH_LOG"
_commits = 0


def commit_point(label: str) -> None:
    """Mark the next durable change (a rename into place, a removal).

    Called just before the change: a crash here leaves the state before it.
    With ``ATTENTION_PIPELINES_CRASH_AT=N`` the N-th call of the process
    kills it with SIGKILL (no clean-up runs, as when a machine is lost);
    ``ATTENTION_PIPELINES_CRASH_LOG=FILE`` appends each label to ``FILE``.
    """
    global _commits
    _commits += 1
    log = os.environ.get(CRASH_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{_commits} {label}\n")
    if os.environ.get(CRASH_AT) == str(_commits):
        os.kill(os.getpid(), signal.SIGKILL)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/attention-pipelines`` (default ``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-pipelines"


def partial_name(name: str) -> str:
    """A hidden temporary name beside ``name``, unique to this process."""
    return f".{name}.partial-{socket.gethostname()}-{os.getpid()}"


_PARTIAL = re.compile(r"^\..+\.partial-(?P<host>.+)-(?P<pid>\d+)(\.weights\.h5)?$")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one we may not signal does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(folder: str | Path) -> list[str]:
    """Remove the temporaries (`partial_name`) that killed processes of this
    host left in ``folder``; returns their names. Those of live processes, or
    of other hosts sharing the folder, are kept."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed, host = [], socket.gethostname()
    for path in folder.glob(".*.partial-*"):
        match = _PARTIAL.match(path.name)
        if not match or match["host"] != host or pid_alive(int(match["pid"])):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def fsync(path: str | Path) -> None:
    """Flush ``path`` to the disk: a file's bytes, or a folder's entries (so
    that a rename into it survives a power loss)."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    except OSError:
        if not os.path.isdir(path):  # some file systems cannot flush a folder
            raise
    finally:
        os.close(handle)


def write_atomically(
    path: str | Path, write: Callable[[Path], Any], suffix: str = ""
) -> Path:
    """``write(tmp)`` to a temporary name beside ``path`` (ending in
    ``suffix``), flushed to the disk and renamed onto ``path``; a failed
    write (a full disk) leaves no temporary behind."""
    path = Path(path)
    tmp = path.with_name(partial_name(path.name) + suffix)
    try:
        write(tmp)
        fsync(tmp)
        commit_point(f"write {path.name}")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    return write_atomically(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, UTF-8 encoded (see `write_bytes`)."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, payload: Any) -> Path:
    return write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def read_json(path: str | Path) -> Any:
    """The JSON in ``path``; a damaged file raises `PipelineError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PipelineError(f"{path} is damaged ({error}).") from None


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class RunDir:
    """Paths of one run folder, and the guard that keeps runs apart."""

    # What `train --overwrite` removes (with the task's own files), in this
    # order: the backups, the run's source of truth, first; what names the
    # run's configuration last, so a kill part-way leaves no trained file
    # under a folder that names another configuration.
    ARTIFACTS = (
        "backup",
        "checkpoints",
        "model.weights.h5",
        "history.csv",
        "logs",
        "metrics.json",
        "plots",
        "data_summary.txt",
        "config.yaml",
        "run.json",
    )
    # run.json's status while `--overwrite` clears the folder: set in one
    # step before anything is removed; a rerun finishes the clear.
    OVERWRITING = "overwriting"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __fspath__(self) -> str:
        return str(self.root)

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    state_path = property(lambda self: self.root / "run.json")
    config_path = property(lambda self: self.root / "config.yaml")
    summary_path = property(lambda self: self.root / "data_summary.txt")
    backup = property(lambda self: self.root / "backup")
    checkpoints = property(lambda self: self.root / "checkpoints")
    best_weights = property(lambda self: self.root / "checkpoints" / "best.weights.h5")
    weights = property(lambda self: self.root / "model.weights.h5")
    history = property(lambda self: self.root / "history.csv")
    logs = property(lambda self: self.root / "logs")
    metrics = property(lambda self: self.root / "metrics.json")
    plots = property(lambda self: self.root / "plots")

    def state(self) -> dict | None:
        """``run.json`` as a dict, or None for a folder no run has written."""
        if not self.state_path.exists():
            return None
        try:
            return read_json(self.state_path)
        except PipelineError as error:
            raise PipelineError(
                f"{error} Rerun with --overwrite to start afresh there."
            ) from None

    def task_name(self) -> str | None:
        """The task whose run the folder holds, if it says (a damaged run.json
        says nothing)."""
        try:
            state = self.state()
        except PipelineError:
            return None
        return state.get("task") if isinstance(state, dict) else None

    def trained(self) -> bool:
        """Whether the folder holds anything training saved: a backup (sound
        or not), the best weights or the final ones."""
        backups = self.backup.iterdir() if self.backup.is_dir() else ()
        return (
            self.weights.exists()
            or self.best_weights.exists()
            or any(not path.name.startswith(".") for path in backups)
        )

    def write_state(self, **changes) -> dict:
        state = {**(self.state() or {}), **changes}
        write_json(self.state_path, state)
        return state

    def check_task(self, task: str) -> None:
        """Refuse a folder that another task's run holds."""
        state = self.state()
        if state and state.get("task", task) != task:
            raise PipelineError(
                f"{self.root} holds a {state['task']} run, not a {task} one; "
                f"use `attention-pipelines {state['task']} ...` or another --run-dir."
            )

    def require_trained(self, task: str) -> None:
        """Refuse a folder without sound final weights: not trained yet, half
        cleared by an interrupted ``--overwrite``, or weights that do not
        match the checksum ``run.json`` recorded."""
        self.check_task(task)
        train = f"`attention-pipelines {task} train --run-dir {self.root}`"
        state = self.state() or {}
        if state.get("status") == self.OVERWRITING:
            raise PipelineError(
                f"{self.root} is being cleared by an interrupted `train --overwrite`; "
                f"run {train} to finish it and train afresh."
            )
        if not self.weights.exists():
            raise PipelineError(f"{self.weights} not found: train first ({train}).")
        expected = state.get("weights_sha256")
        if state.get("status") == "finished" and expected:
            if sha256(self.weights) != expected:
                raise PipelineError(
                    f"{self.weights} is damaged (it does not match the checksum "
                    f"run.json recorded); {train} rebuilds it from the backups."
                )

    def clear(self, extra: tuple[str, ...] = ()) -> list[str]:
        """Remove what training writes (not exports); returns the names removed.

        In `ARTIFACTS`' order, the task's files (``extra``) before
        ``config.yaml``; a folder is renamed to a hidden name first (one
        step), then deleted, so a kill never leaves half of one under its
        name."""
        removed = []
        *first, config, state = self.ARTIFACTS
        for name in (*first, *extra, config, state):
            path = self.root / name
            if not (path.exists() or path.is_symlink()):
                continue
            commit_point(f"remove {name}")
            if path.is_dir() and not path.is_symlink():
                aside = path.with_name(partial_name(name))
                path.rename(aside)
                shutil.rmtree(aside)
            else:
                path.unlink()
            removed.append(name)
        fsync(self.root)
        return removed

    @contextlib.contextmanager
    def lock(self):
        """Hold ``.lock`` while training: a second trainer here is refused."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.root / ".lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise PipelineError(
                f"another process is training in {self.root}; wait for it or use "
                "another --run-dir."
            ) from None
        try:
            yield self
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
