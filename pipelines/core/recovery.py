"""A run folder's records rebuilt from its newest sound backup.

The newest backup whose files check out (`pipelines.core.backups`) is the
run's source of truth: it holds the task, the configuration and its
fingerprint, the full history and a copy of the best weights. Everything
else training writes is derived from it and rebuilt here when missing or
damaged: ``run.json`` and ``config.yaml`` (`recover`, before any verb reads
the folder: `require_trained` for ``evaluate`` and ``export``), ``history.csv``
and ``checkpoints/best.weights.h5`` (`sync_best` and `sync_history`, after the
trainer has restored a generation).

Example:

>>> import tempfile, keras, numpy as np
>>> from pipelines.core.backups import Backups
>>> from pipelines.core.run_dir import RunDir
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.compile("adam", "mse")
>>> run = RunDir(tempfile.mkdtemp())
>>> _ = Backups(run.backup).save(model, {"epoch": 1, "history": [{"epoch": 0}]})
>>> sync_history(run, [{"epoch": 0, "loss": 1.0}])
True
>>> run.history.read_text().splitlines()
['epoch,loss', '0,1.0']
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import yaml

from pipelines.core import config as config_lib
from pipelines.core.backups import BEST, LEARNED, Backups
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.run_dir import (
    RunDir,
    sha256,
    write_atomically,
    write_json,
    write_text,
)


def backup_fingerprint(task, state: dict) -> str | None:
    """The fingerprint of a backup's configuration under today's defaults (a
    field added to the code since does not make the run look different), or
    the one it recorded; None for a backup of an older version, which
    records neither."""
    values = state.get("config")
    if isinstance(values, dict):
        try:
            config = config_lib.from_dict(
                values, task.presets(), origin="a backup", default=task.default_preset
            )
            return config_lib.fingerprint(config)
        except ConfigError:
            pass
    return state.get("fingerprint")


def recover(task, run: RunDir, log=print) -> list[str]:
    """Rebuild ``run.json``, ``config.yaml`` and the preprocessors' files
    (`Task.learned_files`) from the newest sound backup where missing or
    damaged (a learned file that differs from the backup's copy is
    damaged: it never changes after training starts); returns the names
    rebuilt (said in one line). A backup of another task, or of an older
    version (no configuration recorded), rebuilds nothing.

    Call it holding the run's lock: a live trainer's files are its own."""
    newest = Backups(run.backup, log=log).newest()
    if newest is None:
        return []
    generation, state = newest
    if state.get("task") != task.name or not isinstance(state.get("config"), dict):
        return []
    rebuilt = []
    if not _config_sound(task, run):
        text = yaml.safe_dump(state["config"], sort_keys=False)
        write_text(run.config_path, text)
        rebuilt.append("config.yaml")
    try:
        sound = isinstance(run.state(), dict)
    except PipelineError:
        sound = False
    if not sound:
        write_json(
            run.state_path,
            {
                "task": task.name,
                "fingerprint": state.get("fingerprint"),
                "status": "training",  # a rerun of train finishes it
                "epochs": state["epoch"],
            },
        )
        rebuilt.append("run.json")
    for name in learned_files(task):
        copy, path = generation / LEARNED / name, run / name
        if copy.is_file() and not (path.is_file() and sha256(path) == sha256(copy)):
            _put_back(copy, path)
            rebuilt.append(name)
    if rebuilt:
        log(
            f"{run.root}: rebuilt {_listed(rebuilt)} from backup "
            f"{generation.name} (after epoch {state['epoch']})."
        )
    return rebuilt


def learned_files(task) -> tuple[str, ...]:
    """`Task.learned_files` (none for a task object that does not say)."""
    return tuple(getattr(task, "learned_files", ()))


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if names[1:] else names)


def _config_sound(task, run: RunDir) -> bool:
    if not run.config_path.is_file():
        return False
    try:
        config_lib.load(str(run.config_path), task.presets(), task.default_preset)
    except (ConfigError, OSError):
        return False
    return True


def sync_best(run: RunDir, generation: Path | None, state: dict, log=print) -> bool:
    """Make ``checkpoints/best.weights.h5`` the restored generation's copy
    when it is not (a kill after a better epoch's weights were saved but
    before its backup, a fall-back past a damaged backup, or a damaged
    file); returns whether the file now matches the restored state.

    False for a generation of an older version, which holds no copy: the
    trainer then tracks the best epoch again from the restored one."""
    expected = state.get("best_sha256")
    best = run.best_weights
    if expected is None:
        return not best.exists()
    if best.is_file() and sha256(best) == expected:
        return True
    copy = generation / BEST if generation is not None else None
    if copy is None or not copy.is_file() or sha256(copy) != expected:
        return False
    run.checkpoints.mkdir(exist_ok=True)
    _put_back(copy, best)
    log(
        f"{best} did not belong to backup {generation.name}; the backup's copy "
        "of the best weights is put back."
    )
    return True


def _put_back(copy: Path, path: Path) -> None:
    """Copy a backup's ``copy`` to ``path`` atomically."""
    write_atomically(path, lambda tmp: shutil.copyfile(copy, tmp))


def holds_best(generation: Path | None, state: dict) -> bool:
    """Whether the restored ``state`` names its best weights by a copy in
    ``generation`` (or has none): then it, not the file, is the truth."""
    if not state or state.get("best_sha256") is None:
        return True
    return generation is not None and (generation / BEST).is_file()


def history_text(rows: list[dict]) -> str:
    """``history.csv``'s text: one row per finished epoch."""
    keys = ["epoch"] + sorted({k for row in rows for k in row} - {"epoch"})
    out = io.StringIO()
    writer = csv.DictWriter(out, keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def sync_history(run: RunDir, rows: list[dict]) -> bool:
    """Write ``history.csv`` from ``rows`` unless it holds them already (a
    kill between a backup and the history's write leaves it one row
    short); returns whether it was written."""
    text = history_text(rows)
    try:
        if run.history.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    write_text(run.history, text)
    return True


def require_trained(task, run: RunDir) -> None:
    """`RunDir.require_trained`, after `recover` has rebuilt a missing or
    damaged ``run.json`` or ``config.yaml`` from the backups (unless a
    trainer holds the folder: its files are its own)."""
    if run.root.is_dir():
        try:
            with run.lock():
                recover(task, run)
        except (PipelineError, OSError):
            pass  # another process trains there, or the folder is read-only
    run.require_trained(task.name)
