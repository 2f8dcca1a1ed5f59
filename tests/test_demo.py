"""The README's main job (`make demo`) and the dates example run end to end."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "dates_demo.py"
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_example(tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=1500,
        env=QUIET,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(tmp_path / "metrics.json") as f:
        return json.load(f), proc.stdout


@pytest.mark.tf_only
@pytest.mark.slow  # a training run in a subprocess; make test has the tiny pipeline run
def test_dates_example_trains_exports_and_serves(tmp_path):
    metrics, out = run_example(
        tmp_path, "--train", "600", "--test", "50", "--epochs", "1"
    )
    assert (tmp_path / "dates.keras").exists()
    assert (tmp_path / "export" / "1" / "saved_model.pb").exists()
    assert not (tmp_path / "export" / "1.partial").exists()
    assert (tmp_path / "alignment.png").stat().st_size > 1000
    assert "library not importable" in out
    assert metrics["test_size"] == 50
    assert f"Held-out exact match: {metrics['exact_match']:.2%} (50 dates)" in out
    # The five sample dates, decoded by the export alone: the target
    # vocabulary is digits and "-", the special tokens stripped.
    served = [line.split(" -> ", 1)[1] for line in out.splitlines() if " -> " in line]
    assert len(served) == 5, out[-2000:]
    assert all(set(text) <= set("0123456789-") for text in served), served


@pytest.mark.slow
@pytest.mark.tf_only
def test_make_demo_reaches_99_percent_exact_match(tmp_path):
    """What `make demo` runs: the translation pipeline on the dates preset."""
    run_dir = tmp_path / "dates"
    proc = subprocess.run(
        [
            sys.executable, "-m", "pipelines.cli", "translation", "demo",
            "--config", "dates", "--run-dir", str(run_dir),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, env=QUIET,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for name, scores in metrics["decoding"].items():
        assert scores["exact_match"] >= 0.99, (name, scores)
    assert (run_dir / "alignment.png").stat().st_size > 2000
    assert (run_dir / "serving" / "dates" / "1" / "saved_model.pb").exists()
    assert proc.stdout.count("  -> ") == 3  # sample dates through the export
    assert "Demo done" in proc.stdout
    # A few test dates, truth beside prediction, and the range it knows.
    shown = proc.stdout.split("Examples from the test split")[1]
    assert shown.count("  truth       ") == 4 and shown.count("  prediction  ") == 4
    assert "The model was trained on dates from 1950 to 2049: a year outside " in shown
    assert "target characters:" in proc.stdout  # not whitespace "words"
    images = next(line for line in proc.stdout.splitlines()
                  if line.startswith("Attention images for TensorBoard:"))  # fmt: skip
    share = re.search(r"drawing took [\d.]+ s, ([\d.]+)% of", images)
    assert share and float(share[1]) <= 5.0, images
