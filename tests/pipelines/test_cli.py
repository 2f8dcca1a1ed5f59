"""The console script's own behaviour: where runs go, what it prints.

The pipeline contract (test_contract.py) drives every verb on every task;
these are the command line's defaults.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import registry
from pipelines.cli import _run_dir
from pipelines.core.config import load

pytestmark = pytest.mark.tf_only

# What TensorFlow's C++ side prints at start-up, before absl's logging starts.
NATIVE = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl)", re.M)


def _args(run_dir=None):
    return argparse.Namespace(run_dir=run_dir)


def test_runs_go_to_one_folder_per_task(tmp_path, monkeypatch, capsys):
    """Without --run-dir, ``runs/<task>/<preset>``: two tasks' tiny runs
    never share a folder; a run where runs went before is named once."""
    monkeypatch.chdir(tmp_path)
    folders = set()
    for name in ("translation", "captioning", "extractive"):
        task = registry.get(name)
        config = load("tiny", task.presets(), task.default_preset)
        folders.add(_run_dir(task, _args(), config))
    assert folders == {Path("runs", n, "tiny") for n in
                       ("translation", "captioning", "extractive")}  # fmt: skip
    assert capsys.readouterr().out == ""
    task = registry.get("translation")
    config = load("tiny", task.presets(), task.default_preset)
    assert _run_dir(task, _args("elsewhere"), config) == Path("elsewhere")
    Path("runs/tiny").mkdir(parents=True)
    Path("runs/tiny/run.json").write_text(json.dumps({"task": "captioning"}))
    assert _run_dir(task, _args(), config) == Path("runs/translation/tiny")
    assert capsys.readouterr().out == ""  # another task's run: nothing to say
    Path("runs/tiny/run.json").write_text(json.dumps({"task": "translation"}))
    assert _run_dir(task, _args(), config) == Path("runs/translation/tiny")
    (line,) = capsys.readouterr().out.splitlines()
    assert "runs/tiny holds a translation run" in line
    assert "--run-dir runs/tiny" in line


def test_tensorflow_start_up_lines_are_hidden_unless_verbose(tmp_path):
    """One clear line of error, not TensorFlow's C++ start-up lines above it;
    ``--verbose`` shows them."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(
        Path(__file__).resolve().parents[2])}  # fmt: skip
    missing = str(tmp_path / "no-export")

    def run(*extra):
        return subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "translation", "predict",
             "--export", missing, *extra, "hola"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip

    verbose = run("--verbose")
    if not NATIVE.search(verbose.stderr):
        pytest.skip("this TensorFlow build printed no start-up lines")
    quiet = run()
    assert quiet.returncode == verbose.returncode == 2
    assert not NATIVE.search(quiet.stderr), quiet.stderr
    (line,) = quiet.stderr.splitlines()
    assert line.startswith("error: no such export folder"), line
    log = tmp_path / ".cache" / "attention-pipelines" / "tensorflow-native.log"
    assert NATIVE.search(log.read_text())


def test_an_export_from_before_with_options_still_takes_options(tmp_path):
    """Exports made before ``with_options`` took the options in
    ``serving_default``: a request with options is sent there, the options
    left out take the SignatureDef's defaults."""
    import numpy as np
    import tensorflow as tf

    from pipelines.core.client import options_signature
    from pipelines.core.serving import call_export

    four = tf.constant(4)  # a tensor default: recorded in the SignatureDef

    class Old(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec(None, tf.string, name="source"),
                tf.TensorSpec(None, tf.int32, name="beam_width"),
            ]
        )
        def serve(self, source, beam_width=four):
            return {"width": tf.fill(tf.shape(source), beam_width)}

    old = Old()
    tf.saved_model.save(old, str(tmp_path), signatures={"serving_default": old.serve})
    feed = {"source": np.array([b"a", b"b"], object)}
    assert call_export(tmp_path, feed)["width"].tolist() == [4, 4]
    options = {"beam_width": np.int32(2)}
    out = call_export(tmp_path, {**feed, **options}, options_signature(options))
    assert out["width"].tolist() == [2, 2]


def test_tiny_says_it_is_a_smoke_test(tmp_path, monkeypatch, capsys):
    """``train`` and ``demo`` with ``--config tiny`` say first, in one line,
    that it learns nothing and which command does; only the tiny presets
    say it."""
    from pipelines import cli
    from pipelines.core import trainer

    class StopBeforeTrainingError(Exception):
        pass

    def stop(*args, **kwargs):
        raise StopBeforeTrainingError  # no training: the line comes before it

    monkeypatch.setattr(trainer, "train", stop)
    for name in registry.names():
        task = registry.get(name)
        for verb in ("train", "demo"):
            argv = [verb, "--config", "tiny", "--run-dir", str(tmp_path / name)]
            args = cli.task_parser(task).parse_args(argv)
            args.argv = [name, *argv]
            with pytest.raises(StopBeforeTrainingError):
                args.func(task, args)
            first = capsys.readouterr().out.splitlines()[0]
            assert first == (
                "tiny is a smoke test: too small and too short to learn the task; "
                f"`attention-pipelines {name} demo` (no --config) gives a "
                "meaningful result."
            )
        for preset in task.presets():  # tiny-generative too; no other preset
            config = load(preset, task.presets(), task.default_preset)
            smoke = preset == "tiny" or preset.startswith("tiny-")
            assert (cli.smoke_test_note(task, config) is not None) == smoke, preset
