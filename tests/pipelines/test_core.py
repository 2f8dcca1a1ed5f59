"""The pipeline core on its own: config, backups, publication, batches, registry."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Literal

import keras
import numpy as np
import pytest

from pipelines.core import config as config_lib
from pipelines.core.config import RunConfig
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.run_dir import RunDir, read_json, write_text

pytestmark = pytest.mark.tf_only


# -- typed configuration -----------------------------------------------------------


@dataclass
class Section:
    units: int = field(default=8, metadata={"range": (1, 64)})
    rate: float = 0.5
    kind: Literal["a", "b"] = "a"
    limit: int | None = None
    flag: bool = False
    sizes: tuple[int, ...] = (1, 2)


@dataclass
class ToyConfig(RunConfig):
    name: str = "toy"
    section: Section = field(default_factory=Section)


PRESETS = {
    "toy": ToyConfig,
    "big": lambda: ToyConfig(name="big", section=Section(units=32)),
}


@pytest.mark.parametrize(
    "override, value",
    [
        ("section.units=16", 16),
        ("section.rate=3e-3", 0.003),  # YAML 1.1 reads this as a string
        ("section.rate=2", 2.0),
        ("section.kind=b", "b"),
        ("section.limit=null", None),
        ("section.limit=5", 5),
        ("section.flag=true", True),
        ("section.sizes=[3, 4]", (3, 4)),
        ("name=2024", "2024"),
    ],
)
def test_values_are_converted_to_their_field_type(override, value):
    config = config_lib.apply_overrides(ToyConfig(), [override])
    key = override.split("=")[0].split(".")[-1]
    got = getattr(config.section if "section" in override else config, key)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("section.units=two", "`section.units` must be an int, received 'two' (str)"),
        ("section.units=2.5", "`section.units` must be an int, received 2.5 (float)"),
        ("section.units=true", "`section.units` must be an int, received True (bool)"),
        ("section.units=0", "`section.units` must be in [1, 64], received 0"),
        ("section.rate=fast", "`section.rate` must be a float, received 'fast'"),
        ("section.rate=.nan", "`section.rate` must be a finite number, received nan"),
        ("section.rate=-.inf", "`section.rate` must be a finite number"),
        ("section.kind=c", "`section.kind` must be one of ['a', 'b'], received 'c'"),
        ("section.flag=maybe", "`section.flag` must be true or false"),
        ("section.limit=x", "`section.limit` must be an int or null"),
        ("section.sizes=[1, x]", "`section.sizes` must be a list of an int"),
        ("section=3", "`section` must be a mapping"),
        ("section.nope=1", "unknown key `section.nope`"),
        ("nodots", "must look like section.key=value"),
    ],
)
def test_bad_values_name_the_key_type_and_value(override, message):
    with pytest.raises(ConfigError) as error:
        config_lib.apply_overrides(ToyConfig(), [override])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_yaml_files_start_from_a_preset(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: big\nsection:\n  rate: 1e-4\n")
    config = config_lib.load(str(path), PRESETS)
    assert (config.name, config.section.units, config.section.rate) == ("big", 32, 1e-4)
    path.write_text("section:\n  units: 4\n")  # no preset: the default one
    assert config_lib.load(str(path), PRESETS, default="toy").section.units == 4
    with pytest.raises(ConfigError, match="names no `preset:`"):
        config_lib.load(str(path), PRESETS)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        config_lib.load(str(path), PRESETS)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        config_lib.load("nope", PRESETS)
    with pytest.raises(ConfigError, match="no such file"):
        config_lib.load(str(tmp_path / "missing.yaml"), PRESETS)


def test_saved_config_loads_back_equal(tmp_path):
    config = config_lib.apply_overrides(
        ToyConfig(), ["section.sizes=[5]", "train.seed=3"]
    )
    config_lib.save(config, tmp_path / "config.yaml")
    again = config_lib.load(str(tmp_path / "config.yaml"), PRESETS, default="toy")
    assert config_lib.to_dict(again) == config_lib.to_dict(config)
    assert list(config_lib.to_dict(config)) == ["name", "section", "train", "export"]


def test_fingerprint_ignores_what_may_change_between_runs():
    base = ToyConfig()
    changes = ["train.epochs=20", "train.strategy=mirrored", "name=other"]
    same = config_lib.apply_overrides(base, changes + ["export.dtype=mixed_bfloat16"])
    assert config_lib.fingerprint(same) == config_lib.fingerprint(base)
    for override in ("section.units=9", "train.seed=1", "train.learning_rate=0.1"):
        other = config_lib.apply_overrides(base, [override])
        assert config_lib.fingerprint(other) != config_lib.fingerprint(base), override
    other = config_lib.apply_overrides(base, ["section.units=9", "train.seed=1"])
    assert (
        config_lib.differences(base, other)
        == "section.units: 8 -> 9; train.seed: 0 -> 1"
    )


def test_determinism_and_xla_together_are_refused():
    with pytest.raises(ConfigError, match="turns XLA off"):
        config_lib.apply_overrides(
            ToyConfig(), ["train.deterministic=true", "train.jit_compile=true"]
        )


# -- the run folder ------------------------------------------------------------------


def test_atomic_writes_and_damaged_json(tmp_path):
    path = write_text(tmp_path / "a.json", '{"x": 1}')
    assert read_json(path) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary left
    path.write_text('{"x": ')
    with pytest.raises(PipelineError, match=r"a\.json is damaged"):
        read_json(path)


def test_a_second_trainer_is_locked_out(tmp_path):
    run = RunDir(tmp_path / "run")
    with run.lock():
        with pytest.raises(PipelineError, match="another process is training"):
            with RunDir(tmp_path / "run").lock():
                pass
    with run.lock():  # released
        pass


def test_clear_removes_training_files_only(tmp_path):
    run = RunDir(tmp_path)
    for name in ("run.json", "history.csv", "tokens.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "backup" / "epoch-000001").mkdir(parents=True)
    (tmp_path / "serving" / "m" / "1").mkdir(parents=True)
    # The backups (the run's source of truth) first, run.json last.
    assert run.clear(("tokens.json",)) == [
        "backup",
        "history.csv",
        "tokens.json",
        "run.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "serving"]


def test_killed_processes_temporaries_are_removed(tmp_path):
    import socket
    import subprocess
    import sys

    from pipelines.core.run_dir import partial_name, remove_stale_partials

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    names = {
        "stale_file": f".history.csv.partial-{host}-{dead.pid}",
        "stale_weights": f".best.weights.h5.partial-{host}-{dead.pid}.weights.h5",
        "stale_folder": f".epoch-000002.partial-{host}-{dead.pid}",
        "live": partial_name("run.json"),  # this process's
        "other_host": f".run.json.partial-elsewhere-{dead.pid}",
    }
    for key, name in names.items():
        if key == "stale_folder":
            (tmp_path / name).mkdir()
            (tmp_path / name / "model.weights.h5").write_text("x")
        else:
            (tmp_path / name).write_text("x")
    removed = remove_stale_partials(tmp_path)
    assert sorted(removed) == sorted(
        names[k] for k in ("stale_file", "stale_weights", "stale_folder")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [names["live"], names["other_host"]]
    )
    assert remove_stale_partials(tmp_path / "missing") == []


def test_run_guard_keeps_tasks_apart_and_names_what_is_done(tmp_path):
    from pipelines import registry
    from pipelines.core.run_dir import write_json
    from pipelines.core.run_guard import check_run, nothing_to_do

    task = registry.get("translation")
    config = config_lib.preset(task.presets(), "tiny")
    run = RunDir(tmp_path)
    write_json(run.state_path, {"task": "locale", "fingerprint": "x"})
    for overwrite in (False, True):
        with pytest.raises(PipelineError, match="holds a locale run, not a transl"):
            check_run(task, config, run, overwrite=overwrite)
    assert run.state_path.exists()  # --overwrite removed nothing
    run.state_path.write_text("{")
    with pytest.raises(PipelineError, match="run.json is damaged.*--overwrite"):
        check_run(task, config, run)
    assert check_run(task, config, run, overwrite=True) is None
    assert not run.state_path.exists()
    message = nothing_to_do(run, {"epochs": 3, "stopped_early": True})
    assert "stopped early after 3 epochs" in message and "--overwrite" in message
    assert "Raise train.epochs" in nothing_to_do(run, {"epochs": 3})


def test_best_weights_of_a_replayed_epoch_are_forgotten(tmp_path, capsys):
    """Every worker forgets a stale best (so all track the same best epoch and
    early stop); the chief removes its file at the end of the next epoch."""
    from pipelines.core.backups import Backups
    from pipelines.core.run_dir import sha256
    from pipelines.core.trainer import RunState

    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    run.best_weights.write_bytes(b"weights of epoch 2")
    kept = {"best": 0.5, "best_epoch": 1, "best_sha256": sha256(run.best_weights)}
    train = ToyConfig().train
    state = RunState(run, None, kept, train)
    state.forget_best_if_stale(kept)
    assert run.best_weights.exists() and state.best == 0.5
    stale = {**kept, "best_sha256": "0" * 64}  # saved before the newer best
    worker = RunState(run, None, stale, train)
    worker.chief = False
    worker.forget_best_if_stale(stale)
    assert worker.best == float("inf") and run.best_weights.exists()
    assert "is not from the restored state" not in capsys.readouterr().out
    state = RunState(run, Backups(tmp_path / "b"), stale, train)
    state.forget_best_if_stale(stale)
    assert state.best == float("inf") and state.best_epoch is None
    assert "is not from the restored state" in capsys.readouterr().out
    assert (
        run.best_weights.read_bytes() == b"weights of epoch 2"
    )  # until the epoch ends
    state.set_model(_fresh_model())
    state.on_epoch_end(2, {"loss": 9.0, "val_loss": 9.0})  # the new best
    assert run.best_weights.read_bytes() != b"weights of epoch 2"
    assert state.best == 9.0 and state.best_epoch == 2


# -- training phases -------------------------------------------------------------------


class PhasedTask:
    """A two-phase toy task: y = x, learned by one Dense unit; from phase 1
    on an offset of 3 is added to the output (a new objective, worse in
    validation loss than anything phase 0 reached)."""

    name = "phased"
    default_preset = "toy"

    def __init__(self, starts):
        self.starts, self.started = starts, []

    def presets(self):
        return PRESETS

    def phases(self, config):
        return self.starts

    def start_phase(self, model, config, phase):
        self.started.append(phase)
        model.offset.assign(3.0 if phase else 0.0)

    def load_data(self, config):
        from pipelines.core.task import Data

        x = np.linspace(-1, 1, 32, dtype="float32")[:, None]
        return Data(list(zip(x, x, strict=True)), list(zip(x, x, strict=True)), [])

    def preprocessors(self, run, data, config, create):
        return None

    def summary(self, data, preprocessors, config):
        return "toy data"

    def make_dataset(self, examples, preprocessors, config, training, replicas=1):
        import tensorflow as tf

        x = np.stack([e[0] for e in examples])
        y = np.stack([e[1] for e in examples])
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    def build_model(self, config, preprocessors):
        class Offset(keras.layers.Layer):
            def build(self, shape):
                self.value = self.add_weight(
                    shape=(), initializer="zeros", trainable=False, name="offset"
                )

            def call(self, x):
                return x + self.value

        inputs = keras.Input((1,))
        offset = Offset(name="offset")
        dense = keras.layers.Dense(1, name="dense")
        trainer = keras.Model(inputs, offset(dense(inputs)))
        return type("Model", (), {"trainer": trainer, "offset": offset.value})()

    def compile_arguments(self, config):
        return {"loss": "mse"}


def test_phases_have_their_own_best_epoch_and_early_stop(tmp_path):
    """Epochs 0-2 are phase 0, 3-5 phase 1 (patience 1). With a learning rate
    of 0 the loss never improves: each phase stops after its second epoch, and
    the early stop of phase 0 moves on to phase 1 instead of ending the run.
    Phase 1's loss is worse (the offset) yet its best epoch is the one kept."""
    from pipelines.core.trainer import phase_bounds, train

    assert phase_bounds((3, 9, 0), 6) == [(0, 3), (3, 6)]
    task = PhasedTask((3,))
    config = ToyConfig()
    config.train.epochs, config.train.early_stopping_patience = 6, 1
    config.train.learning_rate, config.train.strategy = 0.0, "default"
    state = train(task, config, tmp_path / "run")
    history = (tmp_path / "run" / "history.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in history] == [0, 1, 3, 4]
    assert task.started == [0, 1]
    assert state["best_epoch"] == 3 and state["next_epoch"] == 5
    assert state["stopped_early"]
    again = train(task, config, tmp_path / "run")  # finished: nothing to do
    assert again["best_epoch"] == 3 and task.started == [0, 1]


def test_a_fresh_run_starts_from_another_runs_weights(tmp_path, capsys, monkeypatch):
    """``train.init_from``: a fresh run loads the finished run's weights (at
    a learning rate of 0 they stay as loaded); a resumed run keeps its own;
    a folder with no trained run, or one made from other data, is refused."""
    from pipelines.core import warm_start
    from pipelines.core.trainer import load_trained, train

    task = PhasedTask(())
    first = ToyConfig()
    first.train.epochs, first.train.strategy = 2, "default"
    train(task, first, tmp_path / "a")
    _, _, trained = load_trained(task, tmp_path / "a")
    second = config_lib.apply_overrides(first, [
        f"train.init_from={tmp_path / 'a'}", "train.learning_rate=0.0",
        "train.epochs=1"])  # fmt: skip
    capsys.readouterr()
    train(task, second, tmp_path / "b")
    assert "Initialised 2 of 3 weights" in capsys.readouterr().out  # not the offset
    # The optimizer started afresh: its steps are this run's one epoch only.
    steps = [json.loads((tmp_path / r / "run.json").read_text())["optimizer_iterations"]
             for r in ("a", "b")]  # fmt: skip
    assert steps[0] == 2 * steps[1] > 0
    _, _, started = load_trained(task, tmp_path / "b")
    for mine, theirs in zip(
        started.trainer.weights, trained.trainer.weights, strict=True
    ):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    second.train.epochs = 2  # resumed: its own backup, not the other run
    train(task, second, tmp_path / "b")
    assert "Initialised" not in capsys.readouterr().out
    model = task.build_model(second, None)
    with pytest.raises(PipelineError, match="is not a run folder"):
        warm_start.initialise_from(task, model, second, tmp_path / "none")
    with pytest.raises(PipelineError, match="model.weights.h5 not found"):
        warm_start.initialise_from(task, model, second, tmp_path)
    monkeypatch.setattr(warm_start, "SECTIONS", ("section",))
    other = config_lib.apply_overrides(second, ["section.units=16"])
    with pytest.raises(PipelineError, match="another `section` section"):
        warm_start.initialise_from(task, model, other, tmp_path / "a")


def test_train_optimizer_is_adam_or_plain_sgd(tmp_path):
    """``train.optimizer=sgd`` compiles plain SGD (no momentum) with the
    configured rate and clipnorm, and trains; another name is refused."""
    from pipelines.core.trainer import train

    config = config_lib.apply_overrides(ToyConfig(), [
        "train.optimizer=sgd", "train.clipnorm=40", "train.learning_rate=0.01",
        "train.epochs=1", "train.strategy=default"])  # fmt: skip
    task = PhasedTask(())
    optimizer = _compiled(task, config).trainer.optimizer
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum == 0.0
    assert optimizer.clipnorm == 40.0
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.01)
    adam = _compiled(task, ToyConfig()).trainer.optimizer
    assert isinstance(adam, keras.optimizers.Adam) and adam.clipnorm == 1.0
    assert train(task, config, tmp_path / "run")["optimizer_iterations"] > 0
    with pytest.raises(ConfigError, match="optimizer.*rmsprop"):
        config_lib.apply_overrides(ToyConfig(), ["train.optimizer=rmsprop"])


@pytest.mark.parametrize("jit", [False, True])
def test_clipnorm_bounds_the_update_of_an_embedding_table(jit):
    """An id 50 times and another 10 times in a batch: the table's gradient
    is 60 rows, the update their sums. The trainer's SGD (rate 1, clipnorm 1)
    moves the table by exactly the clipped dense gradient, norm 1, also in
    an XLA step; Keras' own SGD moves it by more (it clips the 60 rows)."""
    import tensorflow as tf

    from pipelines.core.optimizers import OPTIMIZERS

    def step(optimizer_class):
        table = keras.layers.Embedding(4, 2, embeddings_initializer="zeros")
        table.build((None,))
        optimizer = optimizer_class(1.0, clipnorm=1.0)
        optimizer.build(table.trainable_variables)

        @tf.function(jit_compile=jit)
        def apply(ids):
            with tf.GradientTape() as tape:
                loss = -tf.reduce_sum(table(ids))
            weights = table.trainable_variables
            grads = tape.gradient(loss, weights)
            optimizer.apply_gradients(zip(grads, weights, strict=True))

        apply(tf.constant([1] * 50 + [2] * 10))
        return table.embeddings.numpy()

    dense = np.array([[0, 0], [50, 50], [10, 10], [0, 0]], "float32")
    np.testing.assert_allclose(
        step(OPTIMIZERS["sgd"]), dense / np.linalg.norm(dense), rtol=1e-5
    )
    assert np.linalg.norm(step(keras.optimizers.SGD)) > 2.0, (
        "Keras' own clipnorm now holds for IndexedSlices gradients: "
        "pipelines.core.optimizers may no longer be needed"
    )


def _compiled(task, config):
    import tensorflow as tf

    from pipelines.core.trainer import build_compiled

    return build_compiled(task, config, None, tf.distribute.get_strategy())


def test_learning_rate_is_reduced_on_a_plateau_and_resumed(tmp_path, capsys):
    """Factor 0.5 after 2 epochs without a better val_loss, floor 0.3: the
    rate goes 1 -> 0.5 -> 0.3, the count restarts at each reduction and at a
    better epoch; a resumed state sets its reduced rate on the optimizer; a
    new phase starts at the configured rate."""
    from pipelines.core.backups import Backups
    from pipelines.core.trainer import RunState

    train = ToyConfig().train
    train.learning_rate, train.lr_reduce_factor = 1.0, 0.5
    train.lr_reduce_patience, train.min_learning_rate = 2, 0.3
    train.early_stopping_patience = 10
    model = _fresh_model()
    state = RunState(RunDir(tmp_path), Backups(tmp_path / "b"), {}, train)
    state.set_model(model)
    state.on_train_begin()
    rates = []
    for epoch, loss in enumerate([1.0, 2.0, 2.0, 0.9, 2.0, 2.0, 2.0, 2.0, 2.0]):
        state.on_epoch_end(epoch, {"loss": loss, "val_loss": loss})
        rates.append(float(model.optimizer.learning_rate.numpy()))
    np.testing.assert_allclose(rates, [1, 1, 0.5, 0.5, 0.5] + [0.3] * 4)
    assert [row["learning_rate"] for row in state.history][:4] == [1, 1, 1, 0.5]
    assert "learning rate 1 -> 0.5 (no better val_loss in 2 epochs)" in (
        capsys.readouterr().out
    )
    saved = state.state(9)
    assert saved["learning_rate"] == 0.3 and not saved["stopped_early"]
    resumed = _fresh_model()  # the configured rate, as a restart compiles it
    again = RunState(RunDir(tmp_path), None, saved, train)
    again.set_model(resumed)
    again.on_train_begin()
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(0.3)
    again.begin_phase(1)
    again.on_train_begin()
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(1.0)


def test_learning_rate_follows_a_step_schedule_per_phase(tmp_path, capsys):
    """Every 2 epochs times 0.5, floor 0.2: 1, 1, 0.5, 0.5, 0.25, 0.25 on a
    flat validation loss (no plateau rule, no early stop); a phase begun at
    epoch 6 starts at 1 again; a resumed state keeps the phase's start."""
    from pipelines.core.backups import Backups
    from pipelines.core.trainer import RunState

    train = ToyConfig().train
    train.learning_rate, train.lr_reduce_factor = 1.0, 0.5
    train.lr_step_epochs, train.lr_reduce_patience = 2, 1
    train.min_learning_rate, train.early_stopping_patience = 0.2, 20
    model = _fresh_model()
    state = RunState(RunDir(tmp_path), Backups(tmp_path / "b"), {}, train)
    state.set_model(model)
    state.on_train_begin()

    def rates(epochs):
        out = []
        for epoch in epochs:
            state.on_epoch_begin(epoch)
            out.append(float(model.optimizer.learning_rate.numpy()))
            state.on_epoch_end(epoch, {"loss": 2.0, "val_loss": 2.0})
        return out

    np.testing.assert_allclose(rates(range(8)), [1, 1, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2])
    assert "learning rate 1 -> 0.5 (every 2 epochs)" in capsys.readouterr().out
    state.begin_phase(1, start=8)
    state.on_train_begin()
    np.testing.assert_allclose(rates(range(8, 11)), [1, 1, 0.5])
    assert not state.stopped_early
    resumed = _fresh_model()
    again = RunState(RunDir(tmp_path), None, state.state(11), train)
    again.set_model(resumed)
    again.on_train_begin()
    again.on_epoch_begin(11)
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(0.5)
    again.on_epoch_begin(12)
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lr_reduce_factor=0"], "must be in \\(0, 1\\]"),
        (
            ["train.lr_reduce_factor=0.5", "train.lr_reduce_patience=3"],
            "would never be reduced.*received 3 and 3",
        ),
        (
            ["train.lr_reduce_factor=0.5", "train.min_learning_rate=0.01"],
            "would never be reduced.*0.01 and 0.002",
        ),
        (["train.lr_step_epochs=25"], "lr_step_epochs.*must then be below 1"),
    ],
)
def test_a_learning_rate_schedule_that_cannot_act_is_refused(overrides, message):
    from pipelines.core.config import apply_overrides
    from pipelines.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        apply_overrides(ToyConfig(), ["train.lr_reduce_patience=1", *overrides])


def test_the_reduced_rate_reaches_every_replica():
    """Under MirroredStrategy (two logical CPUs) the optimizer's rate is a
    mirrored variable: the reduction sets every replica's copy."""
    import tensorflow as tf

    from pipelines.core.trainer import RunState

    train = ToyConfig().train
    train.learning_rate, train.lr_reduce_factor = 0.1, 0.5
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _fresh_model()
        model.optimizer.build(model.trainable_variables)
    state = RunState(RunDir("unused"), None, {}, train)
    state.set_model(model)
    state._reduce_learning_rate(0)
    variable = model.optimizer._learning_rate.value  # the backend tf.Variable
    copies = strategy.experimental_local_results(variable)
    assert len(copies) == 2
    assert [float(c.numpy()) for c in copies] == pytest.approx([0.05, 0.05])


# -- backups ---------------------------------------------------------------------------


@pytest.fixture
def fitted():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=1, verbose=0, batch_size=4)
    return model


def _fresh_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    return model


def test_backups_restore_weights_optimizer_and_state(fitted, tmp_path):
    from pipelines.core.backups import Backups

    store = Backups(tmp_path, keep=2)
    for epoch in (1, 2, 3):
        store.save(fitted, {"epoch": epoch, "history": [{"epoch": epoch}]})
    assert [p.name for p in store.generations()] == ["epoch-000003", "epoch-000002"]
    model = _fresh_model()
    state = store.restore(model)
    assert state["epoch"] == 3 and state["history"] == [{"epoch": 3}]
    assert int(model.optimizer.iterations.numpy()) == 2  # the step count
    for a, b in zip(model.get_weights(), fitted.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate", "is truncated"),
        ("empty", "is truncated (0 of"),
        ("flip", "does not match its checksum"),
        ("state", "state.json is damaged"),
        ("no-state", "state.json is missing"),
        ("no-files", "state.json is damaged (it lists no checksummed weights)"),
    ],
)
def test_a_damaged_generation_is_named_and_skipped(fitted, tmp_path, damage, message):
    from pipelines.core.backups import Backups

    logged = []
    store = Backups(tmp_path, log=logged.append)
    store.save(fitted, {"epoch": 1})
    newest = store.save(fitted, {"epoch": 2})
    weights, state = newest / "model.weights.h5", newest / "state.json"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        weights.write_bytes(b"")
    elif damage == "flip":
        weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "state":
        state.write_text(state.read_text()[:10])
    elif damage == "no-files":
        state.write_text('{"epoch": 2, "files": {"model.weights.h5": {}}}')
    else:
        state.unlink()
    assert store.restore(_fresh_model())["epoch"] == 1
    assert message in logged[0] and str(newest) in logged[0]
    assert len(logged) == 1 and logged[0].startswith("Resuming from epoch-000001")


def test_no_sound_generation_is_an_error_not_a_fresh_start(fitted, tmp_path):
    from pipelines.core.backups import Backups

    store = Backups(tmp_path, log=lambda _: None)
    for epoch in (1, 2):
        (store.save(fitted, {"epoch": epoch}) / "model.weights.h5").write_bytes(b"")
    with pytest.raises(
        PipelineError, match="every backup in .* is damaged.*--overwrite"
    ):
        store.restore(_fresh_model())
    assert Backups(tmp_path / "none").restore(_fresh_model()) is None  # nothing yet


# -- publication -----------------------------------------------------------------------


def _module():
    import tensorflow as tf

    class AddOne(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x + 1.0}

    return AddOne()


def test_concurrent_claims_take_distinct_versions(tmp_path):
    from pipelines.core.export import claim_version

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    tmps = []
    for i in range(16):
        tmp = model_dir / f".partial-{i}"
        tmp.mkdir()
        (tmp / "saved_model.pb").write_text(str(i))
        tmps.append(tmp)
    claimed, barrier = [], threading.Barrier(len(tmps))

    def claim(tmp):
        barrier.wait()
        claimed.append(claim_version(tmp, model_dir, None).name)

    threads = [threading.Thread(target=claim, args=(t,)) for t in tmps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed, key=int) == [str(i) for i in range(1, 17)]
    contents = {(model_dir / v / "saved_model.pb").read_text() for v in claimed}
    assert len(contents) == 16  # no version was overwritten
    extra = model_dir / ".partial-x"
    extra.mkdir()
    (extra / "f").write_text("x")
    with pytest.raises(FileExistsError, match="never overwritten"):
        claim_version(extra, model_dir, 3)


def test_killed_exports_leave_no_hidden_folder_behind(tmp_path):
    import socket
    import time

    from pipelines.core.export import clean_partials, publish

    model_dir = tmp_path / "m"
    host = socket.gethostname()
    dead = model_dir / f".partial-{host}-999999999-abcd1234"
    alive = model_dir / f".partial-{host}-{os.getpid()}-abcd1234"
    elsewhere = model_dir / ".partial-otherhost-1-abcd1234"
    legacy = model_dir / ".3.partial-k2j3h4"
    for path in (dead, alive, elsewhere, legacy):
        path.mkdir(parents=True)
    old = time.time() - 7200
    os.utime(legacy, (old, old))
    assert sorted(clean_partials(model_dir)) == sorted([dead.name, legacy.name])
    assert alive.exists() and elsewhere.exists()
    module = _module()
    path = publish(
        module, {"serving_default": module.serve}, tmp_path, "m", audit=False
    )
    assert path.name == "1"


def test_jit_compile_is_refused_where_no_decoding_compiles(tmp_path, monkeypatch):
    """``export.jit_compile=true`` on a task whose module sets no
    `compiles_decoding` stops the export before anything is written."""
    import types

    from pipelines import cli
    from pipelines.core import trainer
    from pipelines.core.serving import ServingModule

    config = config_lib.apply_overrides(ToyConfig(), ["export.jit_compile=true"])
    monkeypatch.setattr(cli, "_trained_config", lambda *a: config)
    monkeypatch.setattr(trainer, "load_trained", lambda *a, **k: (config, None, None))
    task = types.SimpleNamespace(
        name="toy", serving_module=lambda *a: ServingModule(_Trainer(), "toy")
    )
    with pytest.raises(PipelineError, match="the toy task's export has none"):
        cli.export_run(task, tmp_path / "run", tmp_path / "serving", None, None, [])
    assert not (tmp_path / "serving").exists()


class _Trainer:
    variables = ()


def test_a_failed_export_leaves_nothing(tmp_path):
    from pipelines.core.export import publish

    module = _module()
    signatures = {"serving_default": module.serve}
    with pytest.raises(ValueError, match="warmup"):
        publish(module, signatures, tmp_path, "m", warmup=("s", []), audit=False)
    assert list((tmp_path / "m").iterdir()) == []
    assert publish(module, signatures, tmp_path, "m", audit=False).name == "1"
    assert publish(module, signatures, tmp_path, "m", audit=False).name == "2"
    with pytest.raises(FileExistsError, match="already exists"):
        publish(module, signatures, tmp_path, "m", version=2, audit=False)
    with pytest.raises(ValueError, match="positive int"):
        publish(module, signatures, tmp_path, "m", version=0, audit=False)


def test_core_ops_are_listed_once_per_tensorflow_version(tmp_path, monkeypatch):
    from pipelines.core import export

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ops = export.core_ops()
    assert {"MatMul", "While", "StringLower"} <= ops
    assert "FastWordpieceTokenizeWithOffsets" not in ops  # tf-text is not core
    cached = list((tmp_path / "attention-pipelines").glob("core-ops-tf-*.txt"))
    assert len(cached) == 1
    monkeypatch.setattr(export.subprocess, "run", None)  # no second process now
    assert export.core_ops() == ops


# -- batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("static", [False, True])
def test_bucket_batches_know_their_count(replicas, static):
    import tensorflow as tf

    from pipelines.core.datasets import bucket_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 203)
    rows = tf.ragged.constant([[1] * n for n in lengths])
    data = tf.data.Dataset.from_tensor_slices(rows).shuffle(203, seed=1)
    batches = bucket_batches(
        data, lengths, [8, 16, 24], 16, 29, replicas=replicas, static=static
    )
    seen = [b.shape for b in batches]
    assert len(seen) == int(batches.cardinality())
    assert all(shape[0] % replicas == 0 and shape[0] > 0 for shape in seen)
    if static:
        assert {shape[1] for shape in seen} <= {7, 15, 23, 29}
    # A batch loses fewer than `replicas` rows, a bucket's last one too.
    assert sum(shape[0] for shape in seen) >= 203 - (replicas - 1) * (len(seen) + 4)


@pytest.mark.parametrize("static", [False, True])
def test_full_batches_fill_the_last_batch_of_a_bucket_with_padding(static):
    import tensorflow as tf

    from pipelines.core.datasets import bucket_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 203)
    rows = tf.ragged.constant([[i + 1] * n for i, n in enumerate(lengths)])
    data = tf.data.Dataset.from_tensor_slices((rows, rows))
    plain, full = (
        bucket_batches(
            data, lengths, [8, 16, 24], 16, 29, static=static, full_batches=fill
        )
        for fill in (False, True)
    )
    assert full.element_spec[0].shape[0] == 16  # static: one shape to trace
    assert plain.element_spec[0].shape[0] is None
    assert int(full.cardinality()) == int(plain.cardinality())
    for (a, _), (b, b2) in zip(plain, full, strict=True):
        a, b = a.numpy(), b.numpy()
        assert b.shape[0] == 16 and (b == b2.numpy()).all()
        np.testing.assert_array_equal(b[: len(a)], a)  # the same rows, in order
        assert not b[len(a) :].any()  # then padding only
    with pytest.raises(ValueError, match="one device only; received replicas=2"):
        bucket_batches(data, lengths, [8], 16, 29, replicas=2, full_batches=True)


# -- registry, strategy ----------------------------------------------------------------


def test_tasks_register_by_path_or_environment(monkeypatch):
    from pipelines import registry

    monkeypatch.setenv(registry.ENVIRONMENT, "locale=examples.locale_task:TASK")
    assert "locale" in registry.names() and "translation" in registry.names()
    assert registry.get("locale").name == "locale"
    monkeypatch.setenv(registry.ENVIRONMENT, "broken")
    with pytest.raises(ValueError, match="name=module:attribute"):
        registry.names()
    monkeypatch.delenv(registry.ENVIRONMENT)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        registry.get("nope")
    with pytest.raises(ValueError, match="a task name is a word"):
        registry.register("bad name", "x:y")
    monkeypatch.setenv(registry.ENVIRONMENT, "my task=examples.locale_task:TASK")
    with pytest.raises(ValueError, match="a task name is a word.*'my task'"):
        registry.names()
    monkeypatch.setenv(registry.ENVIRONMENT, "odd=examples.locale_task:PRESETS")
    with pytest.raises(ValueError, match="'odd' is dict, not a pipelines.core.task"):
        registry.get("odd")


def test_tpu_strategy_is_built_from_an_address(monkeypatch):
    import tensorflow as tf

    from pipelines.core import strategy

    calls = []

    class Resolver:
        def __init__(self, tpu):
            calls.append(("resolver", tpu))

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    monkeypatch.setattr(
        tf.config, "experimental_connect_to_cluster", lambda r: calls.append("connect")
    )
    monkeypatch.setattr(
        tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append("init")
    )
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r))
    built = strategy.make_strategy("auto", tpu="grpc://10.0.0.2:8470")
    assert built[0] == "TPUStrategy" and isinstance(built[1], Resolver)
    assert calls == [("resolver", "grpc://10.0.0.2:8470"), "connect", "init"]
    with pytest.raises(ValueError, match="needs a TPU address"):
        strategy.make_strategy("tpu")


def test_chief_and_multi_worker_settings(monkeypatch):
    import json

    from pipelines.core import launcher, strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert strategy.is_chief()
    with pytest.raises(ValueError, match="needs the TF_CONFIG"):
        strategy.make_strategy("multi_worker")
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    for index, chief in ((0, True), (1, False)):
        spec = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(spec))
        assert strategy.is_chief() is chief
    assert len(launcher.free_ports(3)) == 3


# -- serving checks --------------------------------------------------------------------


def test_serving_checks_name_the_input():
    import tensorflow as tf

    from pipelines.core.serving import checked_ids, checked_scalar, checked_strings

    assert checked_strings("text", ["a", "b"]).shape == (2,)
    assert checked_strings("text", tf.constant([], tf.string)).shape == (0,)
    for bad, message in (
        (tf.constant([b"ok", b"\xc3"]), "`text` must be valid UTF-8; row 1 is not"),
        (tf.constant([["a"]]), "`text` must be a vector of strings"),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            checked_strings("text", bad)
        assert message in error.value.message
    assert float(checked_scalar("alpha", 0.5, tf.float32, 0.0)) == 0.5
    for value in (float("nan"), float("inf"), -1.0):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="`alpha` must be a finite"
        ):
            checked_scalar("alpha", value, tf.float32, 0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`ids` must hold ids in"):
        checked_ids("ids", [[1, 9]], 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`ids` must be a matrix"):
        checked_ids("ids", [1, 2], 5)


def test_cli_errors_are_one_line():
    import tensorflow as tf

    from pipelines.cli import _without_workers, describe

    error = tf.errors.InvalidArgumentError(None, None, "in user code:\n\n  x\n  bad: y")
    assert describe(error) == "TensorFlow InvalidArgumentError: bad: y"
    assert describe(PipelineError("fix this")) == "fix this"
    assert "unexpected" in describe(KeyError("k"))
    assert "permissions" in describe(PermissionError(13, "denied", "/x"))
    assert _without_workers(["t", "train", "--workers", "2", "--overwrite", "--x"]) == [
        "t", "train", "--x",
    ]  # fmt: skip


def test_cli_flags_are_whole_words_and_counts_positive(monkeypatch, capsys):
    from pipelines.cli import main, parse

    for argv, message in (
        (["translation", "train", "--work", "2"], "unrecognized arguments: --work"),
        (["translation", "train", "--workers", "0"], "expected a positive integer"),
        (["translation", "evaluate", "--run-dir", "r", "--limit", "-1"], "positive"),
        (["translation", "export", "--run-dir", "r", "--base", "b", "--version", "x"],
         "expected a positive integer, got 'x'"),
    ):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    assert main(["translation", "train", "--config", "tiny", "--workers", "2"]) == 2
    assert "cannot be given where TF_CONFIG is set" in capsys.readouterr().err
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.setenv("ATTENTION_PIPELINES_CPU_DEVICES", "two")
    assert main(["translation", "train", "--config", "tiny"]) == 2
    assert "must be a positive integer, received 'two'" in capsys.readouterr().err


def test_next_version_passes_files_named_as_versions(tmp_path):
    from pipelines.core.export import next_version

    (tmp_path / "1").mkdir()
    (tmp_path / "2").write_text("not a version, but a rename onto it would fail")
    assert next_version(tmp_path) == 3
