"""A run folder's life past the happy path: a damaged backup, a run that failed
before training, an early stop; each said in one line.

One tiny translation run of two epochs (backups ``epoch-000001`` and
``epoch-000002``) is shared by the module; the tests train copies of it.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

from pipelines.core import config as config_lib
from pipelines.core.errors import PipelineError
from pipelines.core.run_dir import RunDir, read_json, write_json
from tests.pipelines.contract import history_epochs

pytestmark = pytest.mark.tf_only  # a TensorFlow pipeline: its tests run once

TASK = "translation"
# How the trainer's lines about backups start (matched by their start: other
# lines may hold a test's folder, named after the test).
NOTES = ("Resuming", "Starting afresh", "warning", "error")


def _task_config(*overrides: str):
    from pipelines import registry

    task = registry.get(TASK)
    config = config_lib.load("tiny", task.presets(), task.default_preset)
    # One replica (not the tests' two CPU devices): as fast as it gets.
    overrides = ["train.strategy=default", *overrides]
    return task, config_lib.apply_overrides(config, overrides)


def _notes(out: str) -> list[str]:
    """The lines of ``out`` about backups and the run folder (not Keras')."""
    return [
        line
        for line in out.splitlines()
        if line.startswith(NOTES) or "earlier configuration is replaced" in line
    ]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # as a full disk leaves it


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny run of two epochs; the tests copy it."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    root = tmp_path_factory.mktemp("lifecycle") / "run"
    train(task, config, root)
    assert sorted(p.name for p in (root / "backup").iterdir()) == [
        "epoch-000001",
        "epoch-000002",
    ]
    return root


def _killed_copy(trained: Path, tmp_path: Path) -> Path:
    """The shared run as a kill after its last backup leaves it: no final
    weights, ``run.json`` still training."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    state = read_json(run / "run.json")
    write_json(run / "run.json", {k: state[k] for k in ("task", "fingerprint")}
               | {"status": "training"})  # fmt: skip
    (run / "model.weights.h5").unlink()
    return run


# -- a damaged newest backup -------------------------------------------------------


def test_a_damaged_newest_backup_falls_back_in_one_line(trained, tmp_path, capsys):
    """The same command resumes from the generation before, replays one epoch
    and finishes; one line names the damaged generation, why, and the one
    resumed from (no warning, no second resume line)."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    steps = read_json(trained / "run.json")["optimizer_iterations"] // 2
    run = _killed_copy(trained, tmp_path)
    victim = run / "backup" / "epoch-000002" / "state.json"
    _truncate(victim)
    capsys.readouterr()
    state = train(task, config, run)
    notes = _notes(capsys.readouterr().out)
    assert len(notes) == 1, notes
    assert notes[0].startswith("Resuming from epoch-000001 (after epoch 1): ")
    assert "backup epoch-000002 cannot be used" in notes[0]
    assert f"{victim} is damaged" in notes[0]
    assert notes[0].endswith("; epoch 2 is trained again.")
    assert history_epochs(run) == [0, 1]
    assert state["status"] == "finished" and state["optimizer_iterations"] == 2 * steps


def test_a_damaged_only_backup_of_the_first_epoch_starts_afresh(
    trained, tmp_path, capsys
):
    """The reported refusal ("every backup ... is damaged"): a run killed in
    its second epoch (or the tiny preset's one-epoch run, trained on) has a
    single generation; the one before it is the start, so the rerun starts
    afresh, losing that one epoch, in one line."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    run = _killed_copy(trained, tmp_path)
    shutil.rmtree(run / "backup" / "epoch-000002")
    victim = run / "backup" / "epoch-000001" / "state.json"
    _truncate(victim)
    capsys.readouterr()
    state = train(task, config, run)
    notes = _notes(capsys.readouterr().out)
    assert len(notes) == 1, notes
    assert notes[0].startswith(
        f"Starting afresh: backup epoch-000001 cannot be used, {victim} is damaged ("
    )
    assert notes[0].endswith("; epoch 1 is trained again.")
    assert history_epochs(run) == [0, 1] and state["status"] == "finished"
    assert read_json(victim)["epoch"] == 1  # trained again, saved whole


def _toy_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    return model


def test_backups_refuse_when_more_than_the_first_epoch_would_be_lost(tmp_path):
    """Every generation damaged past epoch 1, or a first epoch whose weights
    passed their checks but failed to load (the model may hold some of
    them): refused, naming each, never a silent fresh start."""
    from pipelines.core.backups import Backups

    model = _toy_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), epochs=1, verbose=0)
    logged: list[str] = []
    store = Backups(tmp_path / "two", log=logged.append)
    for epoch in (1, 2):
        _truncate(store.save(model, {"epoch": epoch}) / "state.json")
    with pytest.raises(PipelineError, match="every backup in .* is damaged"):
        store.restore(_toy_model())
    assert logged == [] and len(store.skipped) == 2

    store = Backups(tmp_path / "one", log=logged.append)
    first = store.save(model, {"epoch": 1})
    (first / "model.weights.h5").write_bytes(b"not hdf5")
    state = read_json(first / "state.json")  # checksums of the bad bytes
    files = state["files"]["model.weights.h5"]
    files["bytes"] = 8
    files["sha256"] = hashlib.sha256(b"not hdf5").hexdigest()
    write_json(first / "state.json", state)
    with pytest.raises(PipelineError, match="model.weights.h5 cannot be read"):
        store.restore(_toy_model())


# -- a run that failed before training ---------------------------------------------


def test_a_run_that_failed_before_training_takes_a_corrected_config(tmp_path, capsys):
    """A wrong data path fails the run before any epoch; the rerun with the
    path fixed replaces the configuration (one line) instead of refusing it,
    and the old run's files (a tokenizer, say) go with it."""
    from pipelines.core.run_guard import check_run
    from pipelines.core.trainer import train

    task, good = _task_config()
    _, bad = _task_config(f"data.source=tsv:{tmp_path / 'missing.tsv'}")

    run = RunDir(tmp_path / "run")
    with pytest.raises(PipelineError, match="missing.tsv: no such file"):
        train(task, bad, run)
    assert read_json(run.state_path)["status"] == "training"
    (run / "source_tokenizer.json").write_text("{}")  # as a later failure leaves
    capsys.readouterr()
    assert check_run(task, good, run) is None  # a new run
    notes = _notes(capsys.readouterr().out)
    assert len(notes) == 1, notes
    assert notes[0] == (
        f"{run.root}: the earlier configuration is replaced (data.source: "
        f"'tsv:{tmp_path / 'missing.tsv'}' -> 'dates:600'); its run saved no "
        "trained epoch, so nothing is lost."
    )
    assert not run.config_path.exists() and not run.state_path.exists()
    assert not (run / "source_tokenizer.json").exists()


def test_a_folder_with_anything_trained_refuses_another_config(trained, tmp_path):
    """A backup (even a damaged one), the best or the final weights: the folder
    holds trained steps and a different configuration is refused, whatever
    else it holds; another worker than the chief changes nothing."""
    from pipelines.core.run_guard import check_run

    task, other = _task_config("train.seed=7")
    with pytest.raises(PipelineError, match="trained with another configuration"):
        check_run(task, other, RunDir(trained))
    for kept in ("backup/epoch-000001/state.json", "checkpoints/best.weights.h5"):
        run = RunDir(tmp_path / kept.split("/")[0])
        run.root.mkdir()
        for name in ("run.json", "config.yaml"):
            shutil.copy(trained / name, run / name)
        (run / kept).parent.mkdir(parents=True)
        (run / kept).write_text("{")
        with pytest.raises(PipelineError, match="trained with another config"):
            check_run(task, other, run)
        shutil.rmtree(run / kept.split("/")[0])
        assert check_run(task, other, run, chief=False) is None
        assert run.config_path.exists()  # the chief clears it, not a worker


# -- early stopping ----------------------------------------------------------------


def test_early_stopping_names_the_epoch_kept_and_why(tmp_path, capsys):
    """Once fit ends (after Keras' line of the epoch): after which epoch,
    how long the monitored loss has not improved, and the epoch kept; in a
    phase that is not the last, that the next phase starts."""
    from pipelines.core.backups import Backups
    from pipelines.core.trainer import RunState

    train = config_lib.TrainConfig(early_stopping_patience=3)
    state = RunState(RunDir(tmp_path), Backups(tmp_path / "backup"), {}, train)
    model = _toy_model()
    state.set_model(model)
    for epoch, loss in enumerate([2.0, 1.234, 1.5, 1.6]):
        state.on_epoch_end(epoch, {"loss": 0.5, "val_loss": loss})
    assert not model.stop_training
    state.on_epoch_end(4, {"loss": 0.5, "val_loss": 1.7})
    assert model.stop_training and capsys.readouterr().out == ""
    state.on_train_end()
    assert capsys.readouterr().out == (
        "Early stopping after epoch 5: val_loss has not improved for 3 epochs; "
        "keeping epoch 2 (val_loss 1.234).\n"
    )
    state.last_phase = False
    assert state.early_stop_line(4) == (
        "Early stopping phase 1 after epoch 5: val_loss has not improved for 3 "
        "epochs; its best was epoch 2 (val_loss 1.234); the next phase starts."
    )


def test_a_run_that_stops_early_says_so(tmp_path, capsys):
    """A real run with a learning rate of 0: epoch 2 is no better than epoch 1
    (the tiny preset's patience is 1); the rerun names the epoch kept."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=3", "train.learning_rate=0")
    run = tmp_path / "run"
    state = train(task, config, run)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "Early stopping" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "Early stopping after epoch 2: val_loss has not improved for 1 epoch; "
        "keeping epoch 1 (val_loss "
    ), out[-2000:]
    assert state["stopped_early"] and state["best_epoch"] == 0
    train(task, config, run)
    out = capsys.readouterr().out
    assert "stopped early after 2 epochs" in out and "keeping epoch 1;" in out
