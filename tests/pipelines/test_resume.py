"""Kill a training run mid-way and rerun it: it resumes, nothing finished is lost."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]

ROOT = Path(__file__).resolve().parents[2]


def train_command(run_dir):
    return [
        sys.executable, "-m", "pipelines.cli", "translation", "train",
        "--config", "tiny", "--run-dir", str(run_dir),
        "--set", "train.epochs=4", "--set", "train.early_stopping_patience=10",
        "--set", "data.corpus=dates:1500",
    ]  # fmt: skip


def epochs_logged(run_dir):
    path = run_dir / "history.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def test_killed_run_resumes_from_its_last_epoch(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen(
        train_command(run_dir), cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 600
    while len(epochs_logged(run_dir)) < 2 and time.time() < deadline:
        assert proc.poll() is None, "training ended before it could be killed"
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)  # no clean-up, like a lost machine
    proc.wait()
    done = epochs_logged(run_dir)
    assert done[:2] == [0, 1], done
    assert not (run_dir / "model.weights.h5").exists()  # the run did not finish
    best = run_dir / "checkpoints" / "best.weights.h5"
    assert best.exists()

    finished = subprocess.run(
        train_command(run_dir), cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-3000:]
    logged = epochs_logged(run_dir)
    # The second run starts after the last finished epoch (an epoch that was
    # running when killed is replayed), and the run ends at epoch 4.
    second = logged[len(done) :]
    assert second and second[0] >= 2 and second[-1] == 3, logged
    assert (run_dir / "model.weights.h5").exists()
