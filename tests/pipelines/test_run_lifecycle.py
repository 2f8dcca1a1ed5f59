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


# -- the newest sound backup is the run's source of truth ---------------------------


def _one_line_refusal(error: PipelineError) -> str:
    message = str(error)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.mark.slow  # trains on: make test-slow
def test_a_run_without_its_records_refuses_another_config(trained, tmp_path, capsys):
    """A killed ``--overwrite`` of old used to remove run.json and config.yaml
    first: the next run of a new configuration resumed the old backups and
    trained on at the old rate. The backups name their configuration: the
    records are rebuilt from them, and the new configuration is refused in
    one line that names the difference and the fix."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    _, other = _task_config("train.epochs=2", "train.learning_rate=0.003")
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    (run / "run.json").unlink()
    (run / "config.yaml").unlink()
    capsys.readouterr()
    with pytest.raises(PipelineError) as refused:
        train(task, other, run)
    message = _one_line_refusal(refused.value)
    assert "trained with another configuration" in message
    rate = f"train.learning_rate: {config.train.learning_rate!r} -> 0.003"
    assert rate in message and "--overwrite" in message
    out = capsys.readouterr().out
    assert "Resuming" not in out
    assert "rebuilt config.yaml and run.json from backup epoch-000002" in out
    # The same configuration is the same run: it finishes, nothing retrained.
    state = train(task, config, run)
    assert state["status"] == "finished" and history_epochs(run) == [0, 1]
    assert "Resuming after epoch 2" in capsys.readouterr().out


def test_an_interrupted_overwrite_never_mixes_two_configs(trained, tmp_path, capsys):
    """``--overwrite`` interrupted at each of its steps (the process stops
    where `commit_point` is called): the next run of the new configuration,
    without ``--overwrite``, either finds the old run whole and refuses it
    in one line, or finishes the clear and starts afresh: never a resume."""
    from pipelines.core import run_dir as run_dir_lib
    from pipelines.core.run_guard import check_run

    task, other = _task_config("train.learning_rate=0.003")

    class Killed(BaseException):
        pass

    outcomes, step = [], 0
    while True:
        step += 1
        run = RunDir(tmp_path / f"run-{step}")
        shutil.copytree(trained, run.root)
        calls = 0

        def stop(label, at=step):
            nonlocal calls
            calls += 1
            if calls == at:
                raise Killed(label)

        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(run_dir_lib, "commit_point", stop)
                check_run(task, other, run, overwrite=True)
        except Killed:
            pass
        else:
            break  # every step passed: the clear is complete
        try:
            fresh = check_run(task, other, run) is None
        except PipelineError as error:
            assert "--overwrite" in _one_line_refusal(error)
            outcomes.append("refused")
            assert (run.backup / "epoch-000002").is_dir()  # the old run, whole
            continue
        assert fresh and not run.trained(), sorted(p.name for p in run.root.iterdir())
        outcomes.append("cleared")
    assert outcomes[0] == "refused" and outcomes[-1] == "cleared", outcomes
    assert outcomes.count("refused") == 1  # the first step marks the folder
    assert step > 8  # one step per file or folder removed, and the mark


@pytest.mark.slow  # trains on: make test-slow
def test_a_kill_before_the_history_write_is_mended(trained, tmp_path):
    """Killed between the last backup and the write of ``history.csv``: the
    file missed its last row forever; the rerun writes it from the backup."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    run = _killed_copy(trained, tmp_path)
    full = (run / "history.csv").read_text()
    (run / "history.csv").write_text("".join(full.splitlines(True)[:-1]))
    assert history_epochs(run) == [0]
    train(task, config, run)
    assert (run / "history.csv").read_text() == full


@pytest.mark.slow  # trains on: make test-slow
def test_a_damaged_best_weights_file_is_put_back_from_the_backup(
    trained, tmp_path, capsys
):
    """Killed at the last backup, with ``best.weights.h5`` damaged: every
    rerun failed on it (after a warning that it "is removed"); the backup
    holds a copy of the best weights, and the rerun puts it back."""
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    run = _killed_copy(trained, tmp_path)
    best = run / "checkpoints" / "best.weights.h5"
    _truncate(best)
    capsys.readouterr()
    state = train(task, config, run)
    out = capsys.readouterr().out
    assert f"{best} did not belong to backup epoch-000002" in out
    newest = read_json(run / "backup" / "epoch-000002" / "state.json")
    assert hashlib.sha256(best.read_bytes()).hexdigest() == newest["best_sha256"]
    assert state["status"] == "finished"
    assert (run / "model.weights.h5").read_bytes() == (
        trained / "model.weights.h5"
    ).read_bytes() or _same_weights(run, trained)


def _same_weights(a: Path, b: Path) -> bool:
    import h5py

    def arrays(path: Path) -> list[np.ndarray]:
        out = []
        with h5py.File(path / "model.weights.h5") as f:
            f.visititems(
                lambda name, item: out.append(np.array(item))
                if isinstance(item, h5py.Dataset) else None
            )  # fmt: skip
        return out

    return all(np.array_equal(x, y) for x, y in zip(arrays(a), arrays(b), strict=True))


def test_a_damaged_run_json_no_longer_blocks_the_export(trained, tmp_path, capsys):
    """A damaged ``run.json`` blocked every verb, and its only advice,
    ``--overwrite``, deleted the intact backups: it is rebuilt from the
    newest backup, and the trained model loads."""
    from pipelines.core.trainer import load_trained

    task, _ = _task_config()
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    _truncate(run / "run.json")
    capsys.readouterr()
    _, _, model = load_trained(task, run)
    assert "rebuilt run.json from backup epoch-000002" in capsys.readouterr().out
    assert read_json(run / "run.json")["task"] == TASK and model is not None


@pytest.mark.slow  # trains on: make test-slow
def test_damaged_final_weights_are_named_and_rebuilt(trained, tmp_path, capsys):
    """A damaged ``model.weights.h5``: export's error named no file and train
    said "already trained". The checksum in run.json names it; train
    rebuilds it from the backups."""
    from pipelines.core.trainer import load_trained, train

    task, config = _task_config("train.epochs=2")
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    weights = run / "model.weights.h5"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: h5py may still read it
    weights.write_bytes(bytes(data))
    with pytest.raises(PipelineError) as refused:
        load_trained(task, run)
    message = _one_line_refusal(refused.value)
    assert message.startswith(f"{weights} is damaged") and "train" in message
    capsys.readouterr()
    train(task, config, run)
    out = capsys.readouterr().out
    assert "already trained" not in out and f"{weights} is missing or damaged" in out
    assert weights.read_bytes() == (trained / "model.weights.h5").read_bytes() or (
        _same_weights(run, trained)
    )
    load_trained(task, run)


@pytest.mark.slow  # trains on: make test-slow
def test_a_backup_state_of_the_wrong_types_counts_as_damaged(trained, tmp_path, capsys):
    """``"epoch": null`` in the newest backup's state.json raised a
    TypeError (unexpected); a state that parses but holds a mistyped value
    is damaged, and the run falls back to the generation before."""
    from pipelines.core.backups import Backups
    from pipelines.core.trainer import train

    task, config = _task_config("train.epochs=2")
    run = _killed_copy(trained, tmp_path)
    victim = run / "backup" / "epoch-000002" / "state.json"
    sound = read_json(victim)
    for key, value in (("history", "x"), ("iterations", True), ("best", "0.5"),
                       ("fingerprint", 7), ("files", {})):  # fmt: skip
        write_json(victim, {**sound, key: value})
        problem = Backups(run / "backup").problem(victim.parent)
        said = "it lists no checksummed weights" if key == "files" else key
        assert problem.startswith(f"{victim} is damaged ({said}"), problem
    write_json(victim, {**sound, "epoch": None})
    capsys.readouterr()
    state = train(task, config, run)
    notes = _notes(capsys.readouterr().out)
    assert len(notes) == 1 and notes[0].startswith(
        "Resuming from epoch-000001 (after epoch 1): backup epoch-000002 "
        f"cannot be used, {victim} is damaged (epoch is None, expected 2"
    ), notes
    assert state["status"] == "finished" and history_epochs(run) == [0, 1]


def test_damaged_or_missing_learned_files_are_put_back(trained, tmp_path, capsys):
    """A tokenizer is learned once, before the first epoch; every backup
    holds a copy. A damaged one stopped every verb ("is damaged", no way
    out but --overwrite); a missing one made train learn it again (over
    weights trained with the old one's ids). Both are put back."""
    from pipelines.core.trainer import load_trained

    task, _ = _task_config()
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    source, target = (run / name for name in task.learned_files)
    expected = source.read_bytes(), target.read_bytes()
    _truncate(source)
    target.unlink()
    capsys.readouterr()
    load_trained(task, run)
    out = capsys.readouterr().out
    assert f"rebuilt {source.name} and {target.name} from backup epoch-000002" in out
    assert (source.read_bytes(), target.read_bytes()) == expected
