"""The README's main job (examples/dates_demo.py) runs end to end."""

import json
import os
import subprocess
import sys

import pytest

DEMO = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "dates_demo.py")


def run_demo(tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, DEMO, "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(tmp_path / "metrics.json") as f:
        return json.load(f), proc.stdout


@pytest.mark.tf_only
def test_demo_trains_exports_and_serves(tmp_path):
    metrics, out = run_demo(tmp_path, "--train", "600", "--test", "50", "--epochs", "1")
    assert (tmp_path / "dates.keras").exists()
    assert (tmp_path / "export" / "1" / "saved_model.pb").exists()
    assert not (tmp_path / "export" / "1.partial").exists()
    assert (tmp_path / "alignment.png").stat().st_size > 1000
    assert "library not importable" in out
    assert 0.0 <= metrics["exact_match"] <= 1.0


@pytest.mark.slow
@pytest.mark.tf_only
def test_demo_reaches_99_percent_exact_match(tmp_path):
    metrics, _ = run_demo(tmp_path)
    assert metrics["exact_match"] >= 0.99, metrics
