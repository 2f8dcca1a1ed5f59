"""Crash-point testing: ``train`` and ``export`` killed at every durable write.

Every commit of a file or folder into place, and every removal, first calls
`pipelines.core.run_dir.commit_point`; ``ATTENTION_PIPELINES_CRASH_AT=N``
makes the N-th call kill its process with SIGKILL (no clean-up, as when a
machine is lost). For every N until a command runs to its end, a process is
killed at the N-th point, the same command is run again, and the run folder
(final weights, history, ``run.json``) and the export (its variables,
signatures and files) must equal those of an uninterrupted run with the same
seed. Run on two tasks: translation (the default pipeline) and question
answering (another model, preprocessors and data), in ``make test-slow``.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.core import config as config_lib
from pipelines.core.run_dir import CRASH_AT, CRASH_LOG
from tests.pipelines.contract import QUIET, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]

TASKS = ("translation", "qa")
# Two epochs (two backups, the second replacing nothing), one device, no
# attention images (TensorBoard's files are not part of what must match).
SETTINGS = [
    "train.epochs=2",
    "train.strategy=default",
    "train.attention_images=0",
    "train.early_stopping_patience=5",
]


def _config(name: str):
    from pipelines import registry

    task = registry.get(name)
    config = config_lib.load("tiny", task.presets(), task.default_preset)
    return task, config_lib.apply_overrides(config, SETTINGS)


def _killed_at(point: int, command: list[str], log: Path, env=None) -> bool:
    """Run ``command`` set to die at commit point ``point``; whether it
    died there (False: it ran to its end, having fewer points)."""
    env = {**QUIET, **(env or {}), CRASH_AT: str(point), CRASH_LOG: str(log)}
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode == -signal.SIGKILL:
        return True
    assert proc.returncode == 0, proc.stderr[-3000:]
    return False


def _weights(path: Path) -> list[np.ndarray]:
    import h5py

    arrays: list[np.ndarray] = []
    with h5py.File(path) as f:
        f.visititems(
            lambda name, item: arrays.append(np.array(item))
            if isinstance(item, h5py.Dataset) else None
        )  # fmt: skip
    return arrays


def _history(run: Path) -> list[dict]:
    with open(run / "history.csv") as f:
        return list(csv.DictReader(f))


def _assert_same_run(run: Path, reference: Path, where: str) -> None:
    state, expected = (
        json.loads((p / "run.json").read_text()) for p in (run, reference)
    )
    for key in ("status", "epochs", "best_epoch", "optimizer_iterations"):
        assert state[key] == expected[key], f"{where}: run.json {key}"
    assert _history(run) == _history(reference), f"{where}: history.csv"
    for a, b in zip(
        _weights(run / "model.weights.h5"),
        _weights(reference / "model.weights.h5"),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b, err_msg=f"{where}: model.weights.h5")
    left = sorted(p.name for p in run.rglob(".*partial*"))
    assert not left, f"{where}: temporaries left: {left}"


def _warmup_feeds(export: Path) -> list[dict]:
    """The requests of an export's warmup file, as feed dicts."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = export / "assets.extra" / "tf_serving_warmup_requests"
    feeds = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        inputs = log.predict_log.request.inputs
        feeds.append({k: tf.make_ndarray(v) for k, v in inputs.items()})
    return feeds


def _assert_same_export(version: Path, reference: Path, where: str) -> None:
    """The same files, the same float variables and the same answers to the
    warmup requests. (Integer variables are Keras seed generators' states,
    drawn per process for dropout, which serving never runs.)"""
    import tensorflow as tf

    from pipelines.core.serving import call_export

    def files(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    assert files(version) == files(reference), where
    a = tf.train.load_checkpoint(str(version / "variables" / "variables"))
    b = tf.train.load_checkpoint(str(reference / "variables" / "variables"))
    dtypes = a.get_variable_to_dtype_map()
    assert dtypes == b.get_variable_to_dtype_map(), where
    for name, dtype in sorted(dtypes.items()):
        if dtype.is_floating:
            np.testing.assert_array_equal(
                a.get_tensor(name), b.get_tensor(name), f"{where}: {name}"
            )
    for extra in ("tf_serving_warmup_requests", "op_audit.json"):
        path, expected = version / "assets.extra" / extra, reference / "assets.extra"
        if path.exists():
            assert path.read_bytes() == (expected / extra).read_bytes(), where
    feeds = _warmup_feeds(reference)
    assert feeds, where
    for feed in feeds:
        got, want = call_export(version, feed), call_export(reference, feed)
        assert got.keys() == want.keys(), where
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], f"{where}: {key}")


# The points of a train run in two halves, so that the two test workers
# share one task's kills; the second half runs on to the command's end.
FIRST_HALF = 8


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("half", ["first", "rest"])
def test_train_killed_at_every_write_point_ends_as_an_uninterrupted_run(
    name, half, tmp_path, capsys
):
    """The reference trains in this process; each killed ``train`` is a CLI
    process, and its rerun (here) must end with the same final weights (bit
    for bit), history and ``run.json``. ``first``: points 1 to
    `FIRST_HALF`; ``rest``: every point after them, until a run ends
    unkilled."""
    from pipelines.core.trainer import train

    task, config = _config(name)
    reference = tmp_path / "reference"
    train(task, config, reference)
    command = [sys.executable, "-m", "pipelines.cli", name, "train",
               "--config", "tiny", *[f"--set={s}" for s in SETTINGS]]  # fmt: skip
    point = 0 if half == "first" else FIRST_HALF
    while half == "rest" or point < FIRST_HALF:
        point += 1
        run = tmp_path / f"killed-{point}"
        log = tmp_path / f"points-{point}.log"
        if not _killed_at(point, [*command, "--run-dir", str(run)], log):
            break
        labels = log.read_text().splitlines()
        assert len(labels) == point, labels
        train(task, config, run)
        _assert_same_run(run, reference, f"killed at point {labels[-1]}")
    else:
        return  # the first half: all its points were reached and survived
    points = point - 1
    print(f"{name}: train has {points} write points: all survived")
    assert points >= 12  # config, run.json, preprocessors, per epoch and final


@pytest.mark.parametrize("name", TASKS)
def test_export_killed_at_every_write_point_publishes_one_whole_version(
    name, tmp_path, capsys
):
    """Each killed ``export`` (with an empty cache folder, so that the op
    list's cache is one of its writes) leaves no version; the rerun
    publishes version 1, equal to an uninterrupted export of the same run."""
    from pipelines.cli import export_run
    from pipelines.core.trainer import train

    task, config = _config(name)
    run = tmp_path / "run"
    train(task, config, run)
    expected = export_run(task, run, tmp_path / "reference", "m", None, [])
    command = [sys.executable, "-m", "pipelines.cli", name, "export",
               "--run-dir", str(run), "--name", "m"]  # fmt: skip
    point = 0
    while True:
        point += 1
        base = tmp_path / f"killed-{point}"
        log = tmp_path / f"points-{point}.log"
        # An empty cache folder: the op list's cache is written too.
        cache = {"XDG_CACHE_HOME": str(tmp_path / f"cache-{point}")}
        if not _killed_at(point, [*command, "--base", str(base)], log, cache):
            break
        assert not any(p.name.isdigit() for p in (base / "m").iterdir())
        version = export_run(task, run, base, "m", None, [])
        assert sorted(p.name for p in (base / "m").iterdir()) == ["1"]
        _assert_same_export(version, expected, f"export killed at point {point}")
    print(f"{name}: export has {point - 1} write points: all survived")
    assert point - 1 >= 2  # the op list's cache, the version's rename
