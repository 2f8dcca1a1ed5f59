"""The translation pipeline on tiny configs: train, evaluate, export, reload, translate.

Training runs through the console script in a subprocess (as a user runs it,
over two logical CPU devices with MirroredStrategy); the export is loaded in
a process where neither ``attention_layers`` nor ``pipelines`` can be
imported, by TF2's loader and by TF1's session loader (``saved_model_cli``,
the loader TF Serving uses).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

ROOT = Path(__file__).resolve().parents[2]
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
SAMPLES = ["9 de marzo de 1987", "montag, 9. märz 1987", "march 9, 1987"]


def cli(*args, env=None, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**QUIET, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny dates model trained under MirroredStrategy over 2 CPU devices."""
    run = tmp_path_factory.mktemp("run") / "tiny"
    proc = cli(
        "translation", "train", "--config", "tiny", "--run-dir", str(run),
        "--set", "train.strategy=mirrored",
        env={"ATTENTION_PIPELINES_CPU_DEVICES": "2"},
    )  # fmt: skip
    assert "MirroredStrategy with 2 replica(s)" in proc.stdout
    return run


@pytest.fixture(scope="module")
def export_dir(run_dir):
    base = run_dir.parent / "serving"
    proc = cli(
        "translation", "export", "--run-dir", str(run_dir), "--base", str(base),
        "--name", "dates",
    )  # fmt: skip
    assert "unknown []" in proc.stdout
    return base / "dates" / "1"


def test_train_writes_the_run_folder(run_dir):
    import yaml

    from pipelines.core import config as config_lib

    for name in ("model.weights.h5", "history.csv", "data_summary.txt"):
        assert (run_dir / name).stat().st_size > 0, name
    assert (run_dir / "checkpoints" / "best.weights.h5").exists()
    assert list((run_dir / "logs").rglob("events.out.tfevents*"))
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    expected = config_lib.apply_overrides(
        config_lib.preset("tiny"), ["train.strategy=mirrored"]
    )
    assert saved == config_lib.to_dict(expected)
    assert not list(run_dir.rglob("*.partial*"))


def test_evaluate_scores_with_sacrebleu_and_draws_heatmaps(run_dir):
    cli("translation", "evaluate", "--run-dir", str(run_dir), "--limit", "16")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(metrics["decoding"]) == {"greedy", "beam2"}
    for scores in metrics["decoding"].values():
        assert 0.0 <= scores["bleu"] <= 100.0
        assert 0.0 <= scores["chrf"] <= 100.0
        assert scores["sentences"] == 16
        assert "nrefs:1" in scores["bleu_signature"]
        assert sum(r["sentences"] for r in scores["by_source_length"]) == 16
    lines = (run_dir / "translations.tsv").read_text().splitlines()
    assert len(lines) == 17
    for path in metrics["heatmaps"]:
        assert Path(path).stat().st_size > 2000


def test_export_has_the_tf_serving_layout(export_dir):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    assert (export_dir / "saved_model.pb").exists()
    assert (export_dir / "variables" / "variables.index").exists()
    warmup = export_dir / "assets.extra" / "tf_serving_warmup_requests"
    logs = [
        prediction_log_pb2.PredictionLog.FromString(r.numpy())
        for r in tf.data.TFRecordDataset(str(warmup))
    ]
    assert len(logs) == 2
    request = logs[0].predict_log.request
    assert request.model_spec.signature_name == "serving_default"
    assert len(tf.make_ndarray(request.inputs["source"])) == 3
    audit = json.loads((export_dir / "assets.extra" / "op_audit.json").read_text())
    assert audit["unknown"] == []
    assert "StringLower" in audit["core"] and "While" in audit["core"]
    # Nothing half-written next to the version.
    assert [p.name for p in export_dir.parent.iterdir()] == ["1"]


def test_export_never_overwrites_a_version(export_dir, run_dir):
    before = (export_dir / "saved_model.pb").stat().st_mtime_ns
    proc = cli(
        "translation", "export", "--run-dir", str(run_dir),
        "--base", str(export_dir.parent.parent), "--name", "dates", "--version", "1",
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "already exists" in proc.stderr
    assert (export_dir / "saved_model.pb").stat().st_mtime_ns == before


def test_a_failed_export_leaves_nothing(tmp_path):
    import tensorflow as tf

    from pipelines.core.export import export_for_serving

    class Tiny(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x + 1.0}

    module = Tiny()
    with pytest.raises(ValueError, match="warmup"):
        export_for_serving(
            module, {"serving_default": module.serve}, tmp_path, "m", warmup=("s", [])
        )
    assert list((tmp_path / "m").iterdir()) == []
    path = export_for_serving(module, {"serving_default": module.serve}, tmp_path, "m")
    assert path == tmp_path / "m" / "1"
    path = export_for_serving(module, {"serving_default": module.serve}, tmp_path, "m")
    assert path == tmp_path / "m" / "2"


# Runs in a fresh process where this project cannot be imported: TensorFlow
# (and tensorflow-text, for the tokenizer ops of subword models) only.
_SERVE = textwrap.dedent(
    """
    import json, sys
    sys.modules["attention_layers"] = None
    sys.modules["pipelines"] = None
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    export_dir, texts, out_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    results = {}
    for beams in (1, 2):
        out = fn(source=tf.constant(texts), beam_width=tf.constant(beams),
                 length_penalty=tf.constant(0.0))
        for k, v in out.items():
            results[f"{k}_{beams}"] = v.numpy()
    np.savez(out_path, **results)
    """
)


def test_served_model_translates_like_the_pipeline(export_dir, run_dir, tmp_path):
    from pipelines.translation.run import load_translator

    out_path = tmp_path / "served.npz"
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, str(export_dir), json.dumps(SAMPLES), out_path],
        cwd=tmp_path,
        env={k: v for k, v in QUIET.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = dict(np.load(out_path, allow_pickle=True))
    translator, _ = load_translator(run_dir)
    for beams in (1, 2):
        expected = translator.translate(SAMPLES, beams, 0.0)
        np.testing.assert_array_equal(
            served[f"translation_{beams}"], expected["translation"].numpy()
        )
        np.testing.assert_allclose(
            served[f"score_{beams}"], expected["score"].numpy(), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(
            served[f"alignment_{beams}"], expected["alignment"].numpy(), atol=1e-5
        )
        alignment = served[f"alignment_{beams}"]
        lengths = served[f"length_{beams}"]
        for row, length in enumerate(lengths):  # rows of real steps sum to 1
            np.testing.assert_allclose(alignment[row, :length].sum(-1), 1.0, atol=1e-4)


def test_saved_model_cli_runs_with_the_default_inputs(export_dir):
    cli_path = shutil.which("saved_model_cli", path=str(Path(sys.executable).parent))
    assert cli_path, "saved_model_cli ships with tensorflow"
    proc = subprocess.run(
        [
            cli_path, "run", "--dir", str(export_dir), "--tag_set", "serve",
            "--signature_def", "serving_default",
            "--input_exprs", f"source={SAMPLES[:2]!r}",
        ],
        env=QUIET, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for key in ("translation", "score", "alignment", "source_tokens", "target_tokens"):
        assert f"Result for output key {key}:" in proc.stdout, key
    shown = subprocess.run(
        [cli_path, "show", "--dir", str(export_dir), "--all"],
        env=QUIET, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "signature_def['translate_ids']" in shown.stdout
    for name in ("source_ids", "beam_width", "length_penalty", "target_ids"):
        assert f"['{name}']" in shown.stdout, name


def test_translate_command_uses_the_export_alone(export_dir, tmp_path):
    png = tmp_path / "alignment.png"
    proc = cli(
        "translation", "translate", "--export", str(export_dir.parent),
        "--plot", str(png), "--beam-width", "2", *SAMPLES,
    )  # fmt: skip
    assert proc.stdout.count("  -> ") == len(SAMPLES)
    assert png.stat().st_size > 2000


@pytest.mark.slow  # learns a WordPiece vocabulary and trains: ~40 s
def test_subword_model_exports_only_serving_ops(tmp_path):
    """A subword (WordPiece) model: its tf-text ops are in TF Serving 2.20's list."""
    run = tmp_path / "bible"
    cli(
        "translation", "train", "--config", "bible", "--run-dir", str(run),
        "--set", "data.limit=400", "--set", "tokenizer.vocab_size=300",
        "--set", "model.units=8", "--set", "model.embedding_dim=8",
        "--set", "model.attention_units=8", "--set", "train.epochs=1",
        "--set", "train.steps_per_epoch=2", "--set", "train.batch_size=16",
    )  # fmt: skip
    proc = cli(
        "translation", "export", "--run-dir", str(run), "--base", str(tmp_path),
        "--name", "bible",
    )  # fmt: skip
    audit = json.loads(
        (tmp_path / "bible" / "1" / "assets.extra" / "op_audit.json").read_text()
    )
    assert audit["unknown"] == [], proc.stdout
    assert "FastWordpieceTokenizeWithOffsets" in audit["tf_text"]
    assert "TFText>FastWordpieceDetokenize" in audit["tf_text"]


def test_resume_refuses_a_different_configuration(run_dir, tmp_path):
    other = tmp_path / "interrupted"
    shutil.copytree(run_dir, other)
    (other / "backup").mkdir(exist_ok=True)  # as left by a killed run
    proc = cli(
        "translation", "train", "--config", "tiny", "--run-dir", str(other),
        "--set", "model.units=16", check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "interrupted run with another configuration" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "model.attention=cosine"], "`model.attention` must be one of"),
        (["--set", "model.nope=1"], "unknown key `model.nope`"),
        (["--config", "no-such-preset"], "unknown preset"),
    ],
)
def test_bad_configuration_is_named(args, message, tmp_path):
    proc = cli(
        "translation", "train", "--run-dir", str(tmp_path / "r"), *args, check=False
    )
    assert proc.returncode == 2
    assert message in proc.stderr


def test_every_command_has_help():
    from pipelines.cli import build_parser

    parser = build_parser()
    for command in ("train", "evaluate", "export", "translate", "demo"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["translation", command, "--help"])
        assert exit_info.value.code == 0


ARCHITECTURES = {
    "rnn_luong_general": ["model.attention=luong_general"],
    "rnn_luong_concat": ["model.attention=luong_concat"],
    "rnn_local_p": ["model.attention=local_p", "model.local_window=3"],
    "rnn_none": ["model.attention=none"],
    "rnn_mixed_bfloat16": ["train.mixed_precision=mixed_bfloat16"],
    "transformer": [
        "model.architecture=transformer",
        "model.embedding_dim=16",
        "model.num_heads=2",
        "model.intermediate_dim=32",
        "model.num_layers=1",
    ],
}


# The score layers are covered by the contract already; in the default run
# the pipeline is exercised with Bahdanau (the module fixture), none and the
# Transformer.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=SLOW)
        if n.startswith(("rnn_luong", "rnn_local", "rnn_mixed"))
        else n
        for n in sorted(ARCHITECTURES)
    ],
)
def test_every_architecture_trains_exports_and_translates(name, tmp_path):
    """Two training steps, then the export must translate like the Python model."""
    import tensorflow as tf

    from pipelines.core import config as config_lib
    from pipelines.core.export import export_for_serving
    from pipelines.translation.run import load_translator, train
    from pipelines.translation.translator import export_signatures

    config = config_lib.apply_overrides(
        config_lib.preset("tiny"),
        ARCHITECTURES[name] + ["train.strategy=default", "train.steps_per_epoch=2"],
    )
    train(config, tmp_path / "run")
    translator, _ = load_translator(tmp_path / "run")
    path = export_for_serving(
        translator, export_signatures(translator), tmp_path / "serving", name
    )
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    for beams in (1, 3):
        expected = translator.translate(SAMPLES, beams, 0.5)
        got = served(
            source=tf.constant(SAMPLES),
            beam_width=tf.constant(beams),
            length_penalty=tf.constant(0.5),
        )
        np.testing.assert_array_equal(
            got["translation"].numpy(), expected["translation"].numpy()
        )
        np.testing.assert_allclose(
            got["score"].numpy(), expected["score"].numpy(), rtol=1e-4, atol=1e-5
        )
        alignment = got["alignment"].numpy()
        assert alignment.shape[:2] == (len(SAMPLES), 12)
        if name == "rnn_none":  # no attention, no alignment
            assert not alignment.any()
        elif name == "rnn_local_p":  # softmax times a Gaussian: (0, 1]
            assert (alignment[:, 0].sum(-1) > 0).all()
            assert (alignment[:, 0].sum(-1) <= 1.0 + 1e-5).all()
        else:  # bfloat16 keeps 8 bits of mantissa: a sum is good to ~2**-8
            tolerance = 4e-3 if "bfloat16" in name else 1e-4
            np.testing.assert_allclose(alignment[:, 0].sum(-1), 1.0, atol=tolerance)
