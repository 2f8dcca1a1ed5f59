"""benchmarks/bench_gpu.py stays runnable: its ``--smoke`` mode on a CPU."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import keras
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow  # about 40 s: every point compiles its candidates
@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="starts its own JAX process: run once, from the TensorFlow half",
)
def test_bench_gpu_smoke_measures_every_point(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "benchmarks.bench_gpu", "--smoke"]
    command += ["--rounds", "2", "--out", str(tmp_path)]
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert (tmp_path / "bench_gpu.md").read_text().count("| mha_") == 4
    errors = [
        r for r in results if "error" in r or any(k.startswith("error_") for k in r)
    ]
    assert not errors, errors
    points = {r["point"] for r in results}
    passes = {(r["point"], r["pass"]) for r in results if "pass" in r}
    assert {"matmul_256_bfloat16", "matmul_256_float32"} <= points
    for name in ("mha_mixed_bfloat16_T64_B2", "mha_float32_T64_B2"):
        assert {(name, "fwd"), (name, "fwd+bwd")} <= passes
    mha = next(r for r in results if r["point"] == "mha_float32_T64_B2")
    # Every candidate timed and its memory read; Pallas interpreted on a CPU.
    assert set(mha["temp_MiB"]) == {"ours", "keras", "ours_tiled", "ours_pallas"}
    assert len(mha["ratio_keras"]) == 3
    bahdanau = [
        r for r in results if r["point"].startswith("bahdanau_") and "pass" in r
    ]
    assert len(bahdanau) == 4 and all("ratio_keras" in r for r in bahdanau)
    checks = [r for r in results if r["point"].endswith("_check")]
    assert all(r["max_abs_diff"] < 1e-2 for r in checks), checks
    if importlib.util.find_spec("keras_hub") is None:
        assert any("skipped" in r for r in results if r["point"] == "decoding")
    else:
        decoding = {
            r["point"]: r for r in results if r["point"].startswith("decoding_")
        }
        assert decoding["decoding_greedy"]["identical_tokens"] == 1.0
        assert "ratio_hub" in decoding["decoding_beam"]
