"""The run folder's guard: which run a folder holds, and whether it may go on.

A folder holds one task's run, trained with one configuration (its
fingerprint, `pipelines.core.config.fingerprint`), which the newest sound
backup records (then ``config.yaml``, then ``run.json``). `check_run`
refuses a folder of another task, or one that training saved anything in (a
backup, weights) under another configuration (``--overwrite`` clears it and
starts afresh); a run that failed before it saved anything (a wrong data
path, say) takes the new configuration. `finished` tells a finished run from
one to resume.
"""

from __future__ import annotations

from pipelines.core import config as config_lib
from pipelines.core.backups import Backups
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.recovery import backup_fingerprint
from pipelines.core.run_dir import RunDir, sha256, write_json
from pipelines.core.task import Task


def run_config(task: Task, run: RunDir) -> config_lib.RunConfig:
    """The configuration a run folder was trained with (its ``config.yaml``)."""
    return config_lib.load(str(run.config_path), task.presets(), task.default_preset)


def trained_config(task: Task, run: RunDir) -> config_lib.RunConfig:
    """The configuration of the run's newest sound backup, else `run_config`."""
    newest = Backups(run.backup).newest()
    values = newest[1].get("config") if newest else None
    if isinstance(values, dict):
        return config_lib.from_dict(
            values, task.presets(), origin="a backup", default=task.default_preset
        )
    return run_config(task, run)


def check_run(
    task: Task,
    config: config_lib.RunConfig,
    run: RunDir,
    overwrite: bool = False,
    chief: bool = True,
) -> dict | None:
    """The run folder's guard; returns the previous ``run.json`` (None if new).

    A folder holding another task's run is refused, even with ``overwrite``;
    ``overwrite`` clears the folder's training files (not its exports) and
    starts afresh: ``run.json`` says so first, in one step, so that a kill
    part-way leaves a folder the next ``train`` finishes clearing, never one
    that mixes two configurations. Otherwise a run with another fingerprint
    is refused if training saved anything (`RunDir.trained`), and cleared,
    in one line, if not. Only the ``chief`` (worker) clears; another worker
    takes such a folder as new.
    """
    holder = run.task_name()
    if holder not in (None, task.name):
        raise PipelineError(
            f"{run.root} holds a {holder} run, not a {task.name} one; use "
            f"`attention-pipelines {holder} ...` or another --run-dir."
        )
    interrupted = _status(run) == RunDir.OVERWRITING
    if overwrite or interrupted:
        if not chief:
            return None
        if not interrupted and not (run.state_path.exists() or run.trained()):
            removed = run.clear(task.run_files)  # files of a failed start
        else:
            write_json(run.state_path, {"task": task.name,
                                        "status": RunDir.OVERWRITING})  # fmt: skip
            removed = run.clear(task.run_files)
        if interrupted:
            print(f"{run.root}: finished clearing the folder, as an interrupted "
                  "`train --overwrite` asked; training starts afresh.")  # fmt: skip
        elif removed:
            print(f"--overwrite: removed {', '.join(removed)} in {run.root}")
        return None
    state = run.state()
    if state is None and run.config_path.exists():
        state = _legacy_state(task, run)
    if state is None and run.trained():  # trained files, no record: ask them
        state = {"task": task.name, "status": "unknown"}
    if state is None or _trained_fingerprint(task, run, state) == (
        config_lib.fingerprint(config)
    ):
        return state
    detail = " (its configuration is not recorded)"
    try:
        detail = f" ({config_lib.differences(trained_config(task, run), config)})"
    except (ConfigError, FileNotFoundError):
        pass
    if run.trained():
        raise PipelineError(
            f"{run.root} holds a run trained with another configuration{detail}; "
            "use another --run-dir, or --overwrite to start afresh there."
        )
    if chief:
        # Its files (tokenizers, data summary) belong to the old configuration.
        run.clear(task.run_files)
        print(
            f"{run.root}: the earlier configuration is replaced{detail}; its run "
            "saved no trained epoch, so nothing is lost."
        )
    return None


def _status(run: RunDir) -> str | None:
    try:
        state = run.state()
    except PipelineError:
        return None
    return state.get("status") if isinstance(state, dict) else None


def _trained_fingerprint(task: Task, run: RunDir, state: dict) -> str | None:
    """The fingerprint the run was trained with: its newest sound backup's,
    else its config.yaml's under today's defaults (so a field added to the
    code since does not make old runs look different), else the one
    run.json recorded."""
    newest = Backups(run.backup).newest()
    if newest is not None:
        recorded = backup_fingerprint(task, newest[1])
        if recorded:
            return recorded
    try:
        return config_lib.fingerprint(run_config(task, run))
    except (ConfigError, FileNotFoundError):
        return state.get("fingerprint")


def weights_sound(run: RunDir, state: dict | None) -> bool:
    """Whether the final weights are there and match the checksum a
    finished ``run.json`` recorded (if it recorded one)."""
    if not run.weights.is_file():
        return False
    expected = (state or {}).get("weights_sha256")
    return expected is None or sha256(run.weights) == expected


def _legacy_state(task: Task, run: RunDir) -> dict:
    """``run.json`` for a folder written before it existed (by config.yaml)."""
    if (run.backup / "latest.weights.h5").exists():
        raise PipelineError(
            f"{run.root} holds an interrupted run of an older version (Keras "
            "BackupAndRestore files in backup/), which cannot be resumed; rerun with "
            "--overwrite to start afresh, or use another --run-dir."
        )
    state = {"task": task.name, "status": "unknown"}
    try:
        state["fingerprint"] = config_lib.fingerprint(run_config(task, run))
    except ConfigError:
        pass
    if run.weights.exists():
        epochs = 0
        if run.history.exists():
            epochs = max(0, len(run.history.read_text().splitlines()) - 1)
        state.update(status="finished", epochs=epochs)
    return state


def finished(state: dict | None, config: config_lib.RunConfig) -> bool:
    """Whether the run of ``state`` (``run.json``) has nothing left to train."""
    if not state or state.get("status") != "finished":
        return False
    # next_epoch: the epochs trained and those an early stop skipped.
    done = state.get("next_epoch", state.get("epochs", 0))
    return done >= config.train.epochs or bool(state.get("stopped_early"))


def nothing_to_do(run: RunDir, state: dict) -> str:
    """What ``train`` says of a finished run."""
    if state.get("stopped_early"):
        return (
            f"{run.root} is already trained: it stopped early after "
            f"{state.get('epochs')} epochs (no better validation loss in "
            f"train.early_stopping_patience epochs){_kept(state)}; nothing to "
            "do. --overwrite retrains from scratch."
        )
    return (
        f"{run.root} is already trained ({state.get('epochs')} epochs); nothing to "
        "do. Raise train.epochs to train on, or --overwrite to retrain."
    )


def _kept(state: dict) -> str:
    """``", keeping epoch N"`` of a finished ``run.json`` that names it."""
    best = state.get("best_epoch")
    return f", keeping epoch {best + 1}" if isinstance(best, int) else ""
