"""Train a task in its run folder: the guard, the strategy, crash-safe resume.

`train` runs the same steps for every task:

1. the run folder's guard: a folder trained with another configuration is
   refused (by the fingerprint in ``run.json``; ``--overwrite`` starts
   afresh), unless that run saved no epoch (it failed early: its
   configuration is replaced), a finished run is not retrained, a second
   trainer is locked out;
2. the data (`Task.load_data`), refused before training when the training or
   validation split is empty, summarised in ``data_summary.txt``;
3. the preprocessors, learned from the training split and saved;
4. the model under the configured strategy and dtype policy, compiled with
   Adam or SGD (``train.optimizer``, ``train.learning_rate``,
   ``train.clipnorm``) and the task's loss;
   the rate is reduced on a plateau of the validation loss when
   ``train.lr_reduce_factor`` < 1;
5. ``fit`` from the newest sound backup (`pipelines.core.backups`): no
   finished epoch is lost and the optimizer's step count continues (past a
   damaged backup, its epoch is trained again); the backup is the run's
   source of truth: the best weights and ``history.csv`` are made to match
   it (`pipelines.core.recovery`); an early stop says after which epoch,
   why, and which epoch's weights it keeps;
6. the final weights: those of the best validation loss, written last, with
   their checksum in ``run.json`` (a damaged file is rebuilt by a rerun).

Only the chief worker writes; under ``MultiWorkerMirroredStrategy`` the other
workers train and write nothing.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from pipelines.core import config as config_lib
from pipelines.core.backups import Backups
from pipelines.core.datasets import set_epoch, shard_by_data
from pipelines.core.keras_compat import patch_multi_worker
from pipelines.core.optimizers import OPTIMIZERS
from pipelines.core.recovery import (
    backup_fingerprint,
    history_text,
    holds_best,
    learned_files,
    recover,
    require_trained,
    sync_best,
    sync_history,
)
from pipelines.core.run_dir import (
    PipelineError,
    RunDir,
    remove_stale_partials,
    sha256,
    write_atomically,
    write_text,
)
from pipelines.core.run_guard import (
    check_run,
    finished,
    nothing_to_do,
    run_config,
    weights_sound,
)
from pipelines.core.strategy import is_chief, make_strategy, strategy_name
from pipelines.core.task import Task
from pipelines.core.warm_start import initialise_from


@contextlib.contextmanager
def dtype_policy(name: str | None):
    """Keras' global dtype policy set to ``name`` (float32 if None) inside."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name or "float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def save_weights(model: keras.Model, path: Path) -> Path:
    """``model.save_weights`` to a temporary name, then renamed into place;
    a failed write (a full disk) leaves no temporary behind."""
    return write_atomically(
        path, lambda tmp: model.save_weights(str(tmp)), ".weights.h5"
    )


def phase_bounds(starts, epochs: int) -> list[tuple[int, int]]:
    """``[(first epoch, end epoch), ...]`` of the training phases.

    ``starts`` are the epochs at which a later phase begins (`Task.phases`);
    those at or past ``epochs`` are dropped.
    """
    cuts = sorted({int(s) for s in starts if 0 < int(s) < epochs})
    edges = [0, *cuts, epochs]
    return list(zip(edges[:-1], edges[1:], strict=True))


class RunState(keras.callbacks.Callback):
    """Per epoch: history, best weights, early stopping, and a backup.

    The early stopping follows Keras' ``EarlyStopping(monitor="val_loss",
    restore_best_weights=True)``; unlike it, its state (best value, epochs
    without improvement) survives a restart, because it is saved with every
    backup. Both are per training phase (`Task.phases`): a new phase trains
    to a new objective, so its epochs compete only with each other, and an
    early stop ends the phase, not the run.

    With ``train.lr_reduce_factor < 1`` it also follows Keras'
    ``ReduceLROnPlateau(monitor="val_loss")`` (without its ``min_delta`` and
    ``cooldown``: any better loss resets the count): after
    ``lr_reduce_patience`` epochs without a better validation loss the
    learning rate is multiplied by the factor (not below
    ``min_learning_rate``). The reduced rate is saved with each backup and set
    again on resume; a new phase starts at the configured rate.

    With ``train.lr_step_epochs > 0`` the rate follows a step schedule
    instead: the configured rate times ``lr_reduce_factor`` to the power
    (epochs of the phase before this one) // ``lr_step_epochs``, not below
    ``min_learning_rate`` (MemN2N halves its rate every 25 epochs).
    """

    def __init__(
        self,
        run: RunDir,
        backups: Backups,
        state: dict,
        train: config_lib.TrainConfig,
        identity: dict | None = None,
        learned: tuple[str, ...] = (),
    ):
        super().__init__()
        self.run, self.backups, self.train = run, backups, train
        # What each backup records of the run: task, config, fingerprint,
        # and copies of the preprocessors' files (`Task.learned_files`).
        self.identity = dict(identity or {})
        self.learned = tuple(run / name for name in learned)
        self.patience = train.early_stopping_patience
        self.stale_best = False
        self.learning_rate = float(state.get("learning_rate", self.train.learning_rate))
        self.lr_wait = int(state.get("lr_wait", 0))
        self.history: list[dict] = list(state.get("history", []))
        self.best = state.get("best", math.inf)
        self.best_epoch = state.get("best_epoch")
        self.wait = state.get("wait", 0)
        self.stopped_early = bool(state.get("stopped_early", False))
        self.phase = int(state.get("phase", 0))
        self.phase_start = int(state.get("phase_start", 0))
        self.diverged_at: int | None = None
        self.last_phase = True  # whether an early stop ends the run (set by _fit)
        self.stop_line: str | None = None
        self.chief = is_chief()

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        current = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        if not math.isclose(current, self.learning_rate, rel_tol=1e-6):
            optimizer.learning_rate = self.learning_rate  # resumed, or a new phase

    def on_train_end(self, logs=None):
        if self.stop_line:
            print(self.stop_line)
        self.stop_line = None

    def on_epoch_begin(self, epoch, logs=None):
        set_epoch(epoch)  # the training order of this epoch
        if self.train.lr_step_epochs:
            self._step_learning_rate(epoch)

    def _step_learning_rate(self, epoch: int) -> None:
        steps = (epoch - self.phase_start) // self.train.lr_step_epochs
        rate = max(
            self.train.learning_rate * self.train.lr_reduce_factor**steps,
            self.train.min_learning_rate,
        )
        if not math.isclose(rate, self.learning_rate, rel_tol=1e-9):
            print(f"Epoch {epoch + 1}: learning rate {self.learning_rate:.3g} -> "
                  f"{rate:.3g} (every {self.train.lr_step_epochs} epochs)")  # fmt: skip
            self.learning_rate = rate
            self.model.optimizer.learning_rate = rate

    def on_epoch_end(self, epoch, logs=None):
        if self.stale_best and self.chief:
            self.run.best_weights.unlink(missing_ok=True)
        self.stale_best = False
        logs = {k: float(v) for k, v in (logs or {}).items()}
        if not all(math.isfinite(v) for v in logs.values()):
            # Never let a diverged epoch replace the last good state.
            self.diverged_at = epoch
            self.model.stop_training = True
            return
        self.history.append(
            {"epoch": epoch, **logs, "learning_rate": self.learning_rate}
        )
        current = logs.get("val_loss", logs.get("loss", math.inf))
        if current < self.best:
            self.best, self.best_epoch, self.wait, self.lr_wait = current, epoch, 0, 0
            if self.chief:
                self.run.checkpoints.mkdir(exist_ok=True)
                save_weights(self.model, self.run.best_weights)
        else:
            self.wait += 1
            self.lr_wait += 1
            if self.wait >= self.patience:
                self.stopped_early = True
                self.model.stop_training = True
                # Said when fit ends, after Keras' line of this epoch.
                self.stop_line = self.early_stop_line(epoch, "val_loss" in logs)
            elif (
                not self.train.lr_step_epochs
                and self.lr_wait >= self.train.lr_reduce_patience
            ):
                self._reduce_learning_rate(epoch)
        if self.chief:
            best = self.run.best_weights
            self.backups.save(
                self.model, self.state(epoch + 1), best=best, learned=self.learned
            )
            write_history(self.run.history, self.history)

    def early_stop_line(self, epoch: int, validated: bool = True) -> str:
        """Why training stops after ``epoch`` (0-based), and which epoch's
        weights are kept (the best of the phase)."""
        monitor = "val_loss" if validated else "loss"
        epochs = "epoch" if self.wait == 1 else "epochs"
        kept = "the last epoch"  # never: a finite loss improves on none
        if self.best_epoch is not None:
            kept = f"epoch {self.best_epoch + 1} ({monitor} {self.best:.4g})"
        if self.last_phase:
            ending, kept = f"after epoch {epoch + 1}", f"keeping {kept}"
        else:
            ending = f"phase {self.phase + 1} after epoch {epoch + 1}"
            kept = f"its best was {kept}; the next phase starts"
        return (
            f"Early stopping {ending}: {monitor} has not improved for "
            f"{self.wait} {epochs}; {kept}."
        )

    def _reduce_learning_rate(self, epoch: int) -> None:
        self.lr_wait = 0
        reduced = max(
            self.learning_rate * self.train.lr_reduce_factor,
            self.train.min_learning_rate,
        )
        if reduced < self.learning_rate:
            print(f"Epoch {epoch + 1}: learning rate {self.learning_rate:.3g} -> "
                  f"{reduced:.3g} (no better val_loss in "
                  f"{self.train.lr_reduce_patience} epochs)")  # fmt: skip
            self.learning_rate = reduced
            self.model.optimizer.learning_rate = reduced

    def begin_phase(self, phase: int, start: int = 0) -> None:
        """Forget the best epoch and the early-stopping count of the last phase,
        and start the new one, at epoch ``start``, at the configured rate."""
        self.phase, self.phase_start = phase, start
        self.best, self.best_epoch, self.wait = math.inf, None, 0
        self.stopped_early = False
        self.lr_wait = 0
        self.learning_rate = self.train.learning_rate  # set by on_train_begin

    def state(self, epochs: int) -> dict:
        best = self.run.best_weights
        return {
            **self.identity,
            "epoch": epochs,
            "iterations": int(
                keras.ops.convert_to_numpy(self.model.optimizer.iterations)
            ),
            "history": self.history,
            "best": self.best,
            "best_epoch": self.best_epoch,
            "best_sha256": sha256(best) if self.chief and best.exists() else None,
            "wait": self.wait,
            "stopped_early": self.stopped_early,
            "phase": self.phase,
            "phase_start": self.phase_start,
            "learning_rate": self.learning_rate,
            "lr_wait": self.lr_wait,
        }

    def forget_best_if_stale(self, restored: dict, quiet: bool = False) -> None:
        """The best weights must belong to the restored state: a kill after the
        best was saved but before its backup, or a fall-back past a damaged
        backup, leaves weights of an epoch that the resume replays.

        Every worker decides (from the shared run folder), so that all of
        them track the same best epoch, early stop and learning rate; the
        chief removes the file at the end of the next epoch, when every
        worker has long decided (the epoch's steps wait for all of them).
        ``quiet``: the fall-back past a damaged backup has said so already."""
        best = self.run.best_weights
        if not best.exists() or restored.get("best_sha256") == sha256(best):
            return
        if self.chief and not quiet:
            print(
                f"warning: {best} is not from the restored state (a backup of an "
                "older version holds no copy of it); it is set aside and the "
                "best epoch is tracked again from here."
            )
        self.best, self.best_epoch = math.inf, None
        self.stale_best = True


def write_history(path: Path, rows: list[dict]) -> None:
    """``history.csv``: one row per finished epoch, rewritten atomically."""
    write_text(path, history_text(rows))


def check_data(data) -> None:
    for split in ("train", "valid"):
        if not data.split(split):
            raise PipelineError(
                f"data: the {split} split is empty "
                f"({len(data.train)} train / {len(data.valid)} valid / "
                f"{len(data.test)} test examples); give more data or change "
                "data.valid_fraction / data.test_fraction."
            )


def build_compiled(task: Task, config, preprocessors, strategy) -> Any:
    """The task's model built and compiled under ``strategy``'s scope."""
    with strategy.scope():
        model = task.build_model(config, preprocessors)
        train = config.train
        optimizer = OPTIMIZERS[train.optimizer]
        model.trainer.compile(
            optimizer=optimizer(train.learning_rate, clipnorm=train.clipnorm),
            jit_compile=train.jit_compile,
            **task.compile_arguments(config),
        )
        if model.trainer.built:
            # Keras would build the optimizer inside the first traced train
            # step; a variable made while tracing makes tf.function trace the
            # step twice (3.5 s of an 8.3 s first step in docs/benchmarks.md).
            model.trainer.optimizer.build(model.trainer.trainable_variables)
    return model


def train(
    task: Task,
    config: config_lib.RunConfig,
    run_dir: str | Path,
    overwrite: bool = False,
) -> dict:
    """Train (or resume) ``config``'s model in ``run_dir``; returns ``run.json``."""
    run = RunDir(run_dir)
    chief = is_chief()
    with run.lock() if chief else contextlib.nullcontext():
        if chief:
            for folder in (run.root, run.checkpoints, run.backup):
                remove_stale_partials(folder)
            if not overwrite:
                recover(task, run)
        if chief or not overwrite:
            previous = check_run(task, config, run, overwrite, chief=chief)
        else:  # the chief clears the folder; this worker must not judge it now
            previous = None
        if chief:
            config_lib.save(config, run.config_path)
        if finished(previous, config):
            if weights_sound(run, previous):
                print(nothing_to_do(run, previous))
                return previous
            print(
                f"{run.weights} is missing or damaged; it is rebuilt from the "
                f"newest backup in {run.backup}."
            )
        if chief:
            run.write_state(
                task=task.name,
                fingerprint=config_lib.fingerprint(config),
                status="training",
            )
        return _train(task, config, run)


def _train(task: Task, config, run: RunDir) -> dict:
    """The stages of one training run: strategy, data, model, fit, weights."""
    t0 = time.time()
    strategy = _strategy(config.train)
    data, preprocessors = _data(task, config, run)
    print(f"Strategy: {strategy_name(strategy)} with "
          f"{strategy.num_replicas_in_sync} replica(s)")  # fmt: skip
    datasets = _datasets(task, config, data, preprocessors, strategy)
    with dtype_policy(config.train.mixed_precision):
        model, state, restored = _model(task, config, run, preprocessors, strategy)
        images = _attention_images(task, config, run, model, preprocessors, data)
        fitted = _fit(
            task, config, model, state, restored.get("epoch", 0), datasets, images
        )
        if images is not None and images.report():
            print(images.report())
        final = _finish(run, model, state, restored, fitted, t0)
    where = run.weights if is_chief() else "written by the chief worker"
    print(f"Trained in {time.time() - t0:.0f} s; weights: {where}")
    return final


def _strategy(train_config) -> tf.distribute.Strategy:
    """Seeds, determinism and the distribution strategy, made before any other
    TensorFlow op (collective ops are configured at start-up)."""
    keras.utils.set_random_seed(train_config.seed)
    if train_config.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = make_strategy(train_config.strategy, train_config.tpu)
    replicas = strategy.num_replicas_in_sync
    if train_config.batch_size < replicas:
        raise PipelineError(
            f"train.batch_size is the global batch, split over {replicas} replicas; "
            f"it must be at least {replicas}, received {train_config.batch_size}."
        )
    return strategy


def _data(task: Task, config, run: RunDir):
    """The splits and the preprocessors (learned and saved by the chief), and
    the data summary, printed and written to the run folder."""
    data = task.load_data(config)
    check_data(data)
    chief = is_chief()
    preprocessors = task.preprocessors(run, data, config, create=chief)
    summary = task.summary(data, preprocessors, config)
    print(summary)
    if chief:
        write_text(run.summary_path, summary + "\n")
    return data, preprocessors


def _datasets(task: Task, config, data, preprocessors, strategy):
    """``(train, valid)`` batches, sharded by data across workers."""
    replicas = strategy.num_replicas_in_sync
    train_data = task.make_dataset(data.train, preprocessors, config, True, replicas)
    valid_data = task.make_dataset(data.valid, preprocessors, config, False, replicas)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        train_data, valid_data = shard_by_data(train_data), shard_by_data(valid_data)
    if config.train.steps_per_epoch:
        train_data = train_data.repeat()
    return train_data, valid_data


def _model(task: Task, config, run: RunDir, preprocessors, strategy):
    """The compiled model, restored from the newest good backup (or started
    from ``train.init_from``), and the `RunState` callback over it; also the
    restored state (``{}`` for a new run)."""
    model = build_compiled(task, config, preprocessors, strategy)
    patch_multi_worker(model.trainer, strategy)
    backups = Backups(run.backup)
    with strategy.scope():  # variables restored or loaded per replica
        restored = backups.restore(model.trainer) or {}
        if not restored and config.train.init_from:
            initialise_from(task, model, config, config.train.init_from)
    fell_back = bool(backups.skipped)  # said so in one line
    fingerprint = config_lib.fingerprint(config)
    if restored and backup_fingerprint(task, restored) not in (None, fingerprint):
        raise PipelineError(
            f"{backups.restored} was made under another configuration than "
            f"{run.root}'s newest backup; rerun with --overwrite to start afresh."
        )
    if restored and not fell_back:
        print(
            f"Resuming after epoch {restored.get('epoch', 0)} (optimizer step "
            f"{restored.get('iterations')}) from {run.backup}"
        )
    identity = {"task": task.name, "fingerprint": fingerprint,
                "config": config_lib.to_dict(config)}  # fmt: skip
    learned = learned_files(task)
    state = RunState(run, backups, restored, config.train, identity, learned)
    # fit sets the model too; a rerun with no epoch left (killed after its
    # last backup, or `train.epochs` raised to where it stood) fits none.
    state.set_model(model.trainer)
    if restored or fell_back:
        # The chief puts the backup's copy of the best weights back; every
        # worker reads the same backup, so all agree without the file.
        if is_chief():
            matches = sync_best(run, backups.restored, restored)
        else:
            matches = holds_best(backups.restored, restored)
        if not matches:
            state.forget_best_if_stale(restored, quiet=fell_back)
    return model, state, restored


def _attention_images(task: Task, config, run: RunDir, model, preprocessors, data):
    """The callback that draws ``train.attention_images`` validation examples
    in TensorBoard each epoch (the chief's), or None."""
    count = config.train.attention_images
    own = getattr(type(task), "plot_attention", Task.plot_attention)
    draws = own is not Task.plot_attention
    tensorflow = keras.backend.backend() == "tensorflow"  # the export's graph
    if not count or not draws or not tensorflow or not is_chief() or not data.valid:
        return None
    from pipelines.core.attention_board import AttentionImages

    module = task.serving_module(model, preprocessors, config)
    examples = list(data.valid[:count])
    return AttentionImages(
        lambda folder: task.plot_attention(module, config, examples, folder),
        run.logs,
        budget=config.train.attention_budget,
    )


def _fit(
    task: Task, config, model, state, initial_epoch: int, datasets, images=None
) -> bool:
    """Fit the training phases left (`Task.phases`); whether any epoch ran."""
    train_data, valid_data = datasets
    callbacks = [state, keras.callbacks.TerminateOnNaN()]
    if is_chief():
        callbacks.append(keras.callbacks.TensorBoard(str(state.run.logs)))
    if images is not None:
        callbacks.append(images)
    bounds = phase_bounds(task.phases(config), config.train.epochs)
    fitted = False
    for phase, (start, end) in enumerate(bounds):
        if end <= initial_epoch or state.diverged_at is not None:
            continue  # done before a restart, or diverged
        state.last_phase = phase == len(bounds) - 1
        if phase > state.phase:
            state.begin_phase(phase, start)
        elif state.stopped_early:
            continue  # this phase stopped early before a restart
        if len(bounds) > 1:
            print(f"Training phase {phase + 1} of {len(bounds)}: epochs "
                  f"{max(start, initial_epoch) + 1}-{end}")  # fmt: skip
        task.start_phase(model, config, phase)
        model.trainer.fit(
            train_data,
            validation_data=valid_data,
            initial_epoch=max(start, initial_epoch),
            epochs=end,
            steps_per_epoch=config.train.steps_per_epoch,
            callbacks=callbacks,
            shuffle=False,  # the dataset shuffles itself
            verbose=1 if sys.stdout.isatty() else 2,
        )
        model.trainer.stop_training = False
        fitted = True
    return fitted


def _finish(run: RunDir, model, state, restored: dict, fitted: bool, t0: float):
    """The best weights kept as the run's weights, and the final ``run.json``;
    a diverged run fails here, its last good state kept."""
    if state.diverged_at is not None:
        raise PipelineError(
            f"training diverged in epoch {state.diverged_at + 1} (loss is not "
            f"finite); the last good state is kept in {run.backup}. To retry "
            "with a lower train.learning_rate, train in a new --run-dir (the "
            "learning rate is part of this run's fingerprint)."
        )
    chief = is_chief()
    if chief and run.best_weights.exists() and not state.stale_best:
        model.trainer.load_weights(str(run.best_weights))
    if chief and state.stale_best:
        run.best_weights.unlink(missing_ok=True)  # set aside, not from this run
    epochs = len(state.history)
    final = {
        "status": "finished",
        "epochs": epochs,
        "next_epoch": (
            state.history[-1]["epoch"] + 1 if epochs else restored.get("epoch", 0)
        ),
        "best_epoch": state.best_epoch,
        "stopped_early": state.stopped_early,
        "optimizer_iterations": (
            state.state(epochs)["iterations"]
            if fitted
            else restored.get("iterations", 0)
        ),
        "seconds": round(time.time() - t0, 1),
    }
    if chief:
        sync_history(run, state.history)  # a kill after the last backup
        save_weights(model.trainer, run.weights)
        final = run.write_state(**final, weights_sha256=sha256(run.weights))
    return final


def load_trained(
    task: Task,
    run_dir: str | Path,
    dtype: str | None = None,
    config: config_lib.RunConfig | None = None,
):
    """``(config, preprocessors, model)`` of a trained run, under ``dtype``.

    ``dtype`` (a Keras dtype policy) defaults to the run's ``export.dtype``;
    the model is built under it whatever the process's global policy is.
    ``config`` replaces the run's own (with the same fingerprint).
    """
    run = RunDir(run_dir)
    require_trained(task, run)
    config = config or run_config(task, run)
    preprocessors = task.preprocessors(run, None, config, create=False)
    with dtype_policy(dtype or config.export.dtype):
        model = task.build_model(config, preprocessors)
        try:
            model.trainer.load_weights(str(run.weights))
        except Exception as error:  # h5py and Keras raise many types
            raise PipelineError(
                f"{run.weights} cannot be read ({type(error).__name__}); "
                f"`attention-pipelines {task.name} train --run-dir {run.root}` "
                "rebuilds it from the backups."
            ) from error
    return config, preprocessors, model
