"""What the translation task adds to the pipeline contract (tests/pipelines).

The contract covers training, resuming, exporting and serving; here: the
translation metrics and files, the optional SignatureDef inputs through
``saved_model_cli`` (TF1's session loader), every architecture through the
export, the subword ops against TF Serving's list, and the CLI's verbs.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from tests.pipelines.contract import QUIET, cli

pytestmark = pytest.mark.tf_only

SAMPLES = ["9 de marzo de 1987", "montag, 9. märz 1987", "march 9, 1987"]


@pytest.fixture(scope="module")
def case(pipeline_case):
    return pipeline_case("translation")


def _main(*args):
    from pipelines.cli import main

    return main([str(a) for a in args])


def test_evaluate_scores_with_sacrebleu_and_keeps_every_decoding(case, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(case.run_dir, run, ignore=shutil.ignore_patterns("serving"))
    code = _main("translation", "evaluate", "--run-dir", run, "--limit", "16",
                 "--beam-width", "1", "--beam-width", "3")  # fmt: skip
    assert code == 0, capfd.readouterr().err[-2000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics["decoding"]) == {"greedy", "beam3"}
    lines = (run / "translations.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["source", "reference", "greedy", "beam3"]
    assert len(lines) == 17 and all(len(line.split("\t")) == 4 for line in lines)
    columns = list(zip(*(line.split("\t") for line in lines[1:]), strict=True))
    references = list(columns[1])
    for column, name in ((2, "greedy"), (3, "beam3")):
        scores, hypotheses = metrics["decoding"][name], list(columns[column])
        # The stored scores are sacrebleu's on the rows written for that decoding.
        bleu, chrf = BLEU(), CHRF()
        want = bleu.corpus_score(hypotheses, [references]).score
        assert scores["bleu"] == round(want, 2), name
        want = chrf.corpus_score(hypotheses, [references]).score
        assert scores["chrf"] == round(want, 2), name
        assert scores["bleu_signature"] == str(bleu.get_signature())
        exact = sum(h == r for h, r in zip(hypotheses, references, strict=True))
        assert scores["exact_match"] == round(exact / 16, 4), name
        assert scores["sentences"] == 16
        assert sum(r["sentences"] for r in scores["by_source_length"]) == 16
    assert len(metrics["heatmaps"]) == 3
    for path in metrics["heatmaps"]:
        assert Path(path).stat().st_size > 2000
    # The baselines, on the same 16 rows: copying the (lowercased) source,
    # and the training split's most common target.
    sources = [s.lower() for s in columns[0]]
    copy = metrics["baselines"]["copy_source"]
    assert copy["bleu"] == round(BLEU().corpus_score(sources, [references]).score, 2)
    data = case.task.load_data(case.config)
    targets = [t.lower() for _, t in data.train]
    common = metrics["baselines"]["most_common_target"]
    assert common["answer"] == max(targets, key=targets.count)
    want = CHRF().corpus_score([common["answer"]] * 16, [references]).score
    assert common["chrf"] == round(want, 2)
    # Printed beside the model's scores, one metric a row.
    out = capfd.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("  BLEU ")]
    model = [f"{metrics['decoding'][n]['bleu']:.2f}" for n in ("greedy", "beam3")]
    baseline = [f"{copy['bleu']:.2f}", f"{common['bleu']:.2f}"]
    assert row.split() == ["BLEU", *model, "|", *baseline]
    assert _main("translation", "evaluate", "--run-dir", run, "--beam-width", "9") == 2
    assert "--beam-width must be in [1, decode.beam_width=3]" in capfd.readouterr().err


def test_saved_model_cli_runs_with_the_default_inputs(case):
    export_dir = case.export_dir
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


def test_translate_is_an_alias_of_predict(case, tmp_path, capfd):
    png = tmp_path / "alignment.png"
    code = _main(
        "translation", "translate", "--base", case.export_dir.parent.parent,
        "--name", case.export_dir.parent.name, "--plot", png, "--beam-width", "2",
        *SAMPLES,
    )  # fmt: skip
    out = capfd.readouterr().out
    assert code == 0 and out.count("  -> ") == len(SAMPLES)
    assert png.stat().st_size > 2000


def test_a_refused_option_prints_the_graphs_own_message(case, capfd):
    """The served graph's assertion names the input and the range; the one
    line keeps that, not TensorFlow's node name (its last line)."""
    capfd.readouterr()
    code = _main("translation", "predict", "--export", case.export_dir,
                 "--beam-width", "9", SAMPLES[0])  # fmt: skip
    (line,) = [x for x in capfd.readouterr().err.splitlines() if x.startswith("error")]
    assert code == 2 and "{{node" not in line, line
    assert line.endswith("`beam_width` must be a number in [1, 3]; received 9"), line


def test_export_names_the_model_after_the_resolved_run_folder(
    case, tmp_path, capfd, monkeypatch
):
    """``--run-dir .`` names the model after the folder it is (not ""), so
    version 1 lands in ``<base>/<name>/``, never straight in ``--base``."""
    base = tmp_path / "serving"
    monkeypatch.chdir(case.run_dir)
    code = _main("translation", "export", "--run-dir", ".", "--base", base,
                 "--set", "export.warmup=false")  # fmt: skip
    assert code == 0, capfd.readouterr().err[-2000:]
    assert [p.relative_to(base) for p in base.glob("*/*")] == [
        Path(case.run_dir.name, "1")
    ]


def test_an_xla_export_serves_what_the_plain_one_does(case, tmp_path, capfd):
    """``export.jit_compile=true``: decoding compiled by XLA on padded shapes
    answers every request as the plain export does, through the C loader."""
    from pipelines import cloader

    base = tmp_path / "serving"
    code = _main("translation", "export", "--run-dir", case.run_dir, "--base", base,
                 "--name", "xla", "--set", "export.jit_compile=true")  # fmt: skip
    assert code == 0, capfd.readouterr().err[-2000:]
    texts = np.array(SAMPLES + ["", "9 mars"], dtype=object)  # 5 rows: padded to 8
    requests = [
        {"source": texts, "beam_width": np.int32(1)},
        {"source": texts, "beam_width": np.int32(3)},
        {"source": texts[:1], "beam_width": np.int32(1)},
        {"source": np.array([], dtype=object)},
    ]
    plain = cloader.serve(case.export_dir, requests, signature="with_options")
    compiled = cloader.serve(base / "xla" / "1", requests, signature="with_options")
    for want, got in zip(plain, compiled, strict=True):
        assert got.ok, got.message
        assert set(got.outputs) == set(want.outputs)
        for key, value in want.outputs.items():
            assert got.outputs[key].shape == value.shape, key
            if value.dtype == object:
                np.testing.assert_array_equal(got.outputs[key], value, err_msg=key)
            else:
                np.testing.assert_allclose(
                    got.outputs[key], value, atol=1e-4, err_msg=key
                )
    assert compiled[0].outputs["translation"][3] == b""
    graph = (base / "xla" / "1" / "saved_model.pb").read_bytes()
    assert b"_XlaMustCompile" in graph


def test_data_summary_counts_what_was_dropped_and_cut(tmp_path):
    from pipelines.translation.config import preset
    from pipelines.translation.data import load_data

    rows = [f"{i} mars 19{i:02d}\t19{i:02d}-03-0{i % 9 + 1}" for i in range(60)]
    rows += ["\t1999-01-01", "un deux trois quatre cinq six\t2000-01-01"]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(rows) + "\n")
    from pipelines.core.config import apply_overrides

    config = apply_overrides(
        preset("tiny"), [f"data.source=tsv:{path}", "data.max_source_words=5"]
    )
    data = load_data(config)
    assert data.notes == [
        f"read 62 pairs from tsv:{path}",
        "dropped 1 pairs with an empty side",
        "dropped 1 pairs over 5 source / 60 target words "
        "(data.max_source_words, data.max_target_words)",
    ]
    from pipelines.core.run_dir import RunDir
    from pipelines.translation.task import TASK

    config = apply_overrides(config, ["tokenizer.max_source_tokens=9"])
    tokenizers = TASK.preprocessors(RunDir(tmp_path / "r"), data, config, create=False)
    summary = TASK.summary(data, tokenizers, config)
    cut = sum(len(s) > 9 for s, _ in data.train + data.valid + data.test)
    assert f"cut {cut} sources longer than 9 tokens" in summary and cut > 0
    # a character model: its data counted in characters, as it reads them
    targets = {c for _, t in data.train for c in t}
    assert (
        "train target characters: mean 10.0, median 10, p95 10, max 10; "
        f"{len(targets)} distinct" in summary
    )


def test_help_lists_the_tasks_and_every_verb(capsys):
    from pipelines.cli import build_parser, task_parser
    from pipelines.translation.task import TASK

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "translation" in capsys.readouterr().out
    parser = task_parser(TASK)
    for command in ("train", "evaluate", "export", "predict", "translate", "demo"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([command, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: attention-pipelines translation {command}")


ARCHITECTURES = {
    "rnn_luong_general": ["model.attention=luong_general"],
    "rnn_luong_concat": ["model.attention=luong_concat"],
    "rnn_local_p": ["model.attention=local_p", "model.local_window=3"],
    "rnn_none": ["model.attention=none"],
    "rnn_no_input_feeding": ["model.input_feeding=false"],
    "rnn_mixed_bfloat16": ["train.mixed_precision=mixed_bfloat16"],
    "transformer": [
        "model.architecture=transformer",
        "model.embedding_dim=16",
        "model.num_heads=2",
        "model.intermediate_dim=32",
        "model.num_layers=1",
    ],
}


# The score layers are covered by the layer contract (Luong's general and
# concat scores export there; in the pipeline they change the cell's score
# only) and the default run exercises the pipeline with Bahdanau (the
# pipeline contract's run); each architecture's export (about a minute for
# the Transformer's) is slow.
@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [n for n in ARCHITECTURES if not n.startswith("rnn_luong")]
)
def test_every_architecture_trains_exports_and_translates(name, tmp_path):
    """Two training steps, then the export must translate like the Python model."""
    import tensorflow as tf

    from pipelines.core import config as config_lib
    from pipelines.core.export import publish
    from pipelines.core.trainer import load_trained, train
    from pipelines.translation.task import TASK

    config = config_lib.apply_overrides(
        TASK.presets()["tiny"](),
        ARCHITECTURES[name] + ["train.strategy=default", "train.steps_per_epoch=2"],
    )
    train(TASK, config, tmp_path / "run")
    _, tokenizers, model = load_trained(TASK, tmp_path / "run")
    translator = TASK.serving_module(model, tokenizers, config)
    path = publish(translator, translator.signatures(), tmp_path / "serving", name)
    served = tf.saved_model.load(str(path)).signatures["with_options"]
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


@pytest.mark.parametrize(
    "name", ["rnn_default", "rnn_local_p", "rnn_no_input_feeding", "transformer"]
)
def test_rows_of_padding_change_neither_the_loss_nor_the_gradients(name):
    """Training batches are filled up to `batch_size` with rows of padding
    (`bucket_batches(full_batches=True)`): each model must give such a row no
    loss, no gradient and no NaN."""
    import tensorflow as tf

    from pipelines.core import config as config_lib
    from pipelines.core.trainer import build_compiled
    from pipelines.translation.task import TASK

    config = config_lib.apply_overrides(
        TASK.presets()["tiny"](), ARCHITECTURES.get(name, [])
    )
    data = TASK.load_data(config)
    tokenizers = TASK.preprocessors(None, data, config, create=False)
    dataset = TASK.make_dataset(data.train, tokenizers, config, True)
    assert dataset.element_spec[1].shape[0] == config.train.batch_size
    filled = [b for b in dataset if not b[1][-1].numpy().any()]
    assert filled, "no bucket's last batch was filled"
    features, target = filled[0]
    rows = int(np.count_nonzero(target.numpy().any(-1)))
    real = ({k: v[:rows] for k, v in features.items()}, target[:rows])
    model = build_compiled(TASK, config, tokenizers, tf.distribute.get_strategy())
    loss_fn = TASK.compile_arguments(config)["loss"]

    def loss_and_gradients(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(batch[1], model.trainer(batch[0], training=False))
        return loss, tape.gradient(loss, model.trainer.trainable_variables)

    loss, grads = loss_and_gradients((features, target))
    want_loss, want_grads = loss_and_gradients(real)
    assert np.isfinite(loss.numpy())
    np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
    for g, want in zip(grads, want_grads, strict=True):
        if want is None:
            assert g is None
            continue
        g, want = tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(want).numpy()
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-7)


# Under XLA the architectures differ by their decoder loops: the default
# (Bahdanau with input feeding) compiles in the pipeline contract, the layer
# contract compiles every score layer, and these are the other loops: local-p's
# window, the decoder without input feeding (the attention after the loop) and
# the Transformer's. Each compile of a loop's gradient takes 40-50 s.
XLA_ARCHITECTURES = ("rnn_local_p", "rnn_no_input_feeding", "transformer")


@pytest.mark.slow
@pytest.mark.parametrize("name", XLA_ARCHITECTURES)
def test_every_decoder_loop_trains_with_xla(name):
    """Each decoder loop's train step compiles with XLA at a static bucket shape
    (one batch: one compile; the contract counts the shapes per bucket)."""
    import tensorflow as tf

    from pipelines.core import config as config_lib
    from pipelines.core.trainer import build_compiled
    from pipelines.translation.task import TASK

    config = config_lib.apply_overrides(
        TASK.presets()["tiny"](), ARCHITECTURES[name] + ["train.jit_compile=true"]
    )
    data = TASK.load_data(config)
    tokenizers = TASK.preprocessors(None, data, config, create=False)
    dataset = TASK.make_dataset(data.train, tokenizers, config, True)
    model = build_compiled(TASK, config, tokenizers, tf.distribute.get_strategy())
    model.trainer.fit(dataset.take(1), verbose=0, shuffle=False)
    assert model.trainer.jit_compile is True


@pytest.mark.slow  # learns a WordPiece vocabulary and trains: ~40 s
def test_subword_model_exports_only_serving_ops(tmp_path):
    """A subword (WordPiece) model: its tf-text ops are in TF Serving 2.20's list,
    and TF's C++ loader serves it with tensorflow-text's op libraries loaded."""
    from pipelines import cloader

    run = tmp_path / "bible"
    cli(
        "translation", "train", "--config", "bible", "--run-dir", run,
        "--set", "data.limit=400", "--set", "tokenizer.vocab_size=300",
        "--set", "model.units=8", "--set", "model.embedding_dim=8",
        "--set", "model.attention_units=8", "--set", "train.epochs=1",
        "--set", "train.steps_per_epoch=2", "--set", "train.batch_size=16",
    )  # fmt: skip
    proc = cli("translation", "export", "--run-dir", run, "--base", tmp_path,
               "--name", "bible")  # fmt: skip
    export = tmp_path / "bible" / "1"
    audit = json.loads((export / "assets.extra" / "op_audit.json").read_text())
    assert audit["unknown"] == [], proc.stdout
    assert "FastWordpieceTokenizeWithOffsets" in audit["tf_text"]
    assert "TFText>FastWordpieceDetokenize" in audit["tf_text"]
    [response] = cloader.serve(export, [{"source": np.array(["jesus wept."], object)}])
    assert response.ok, response.message
    assert response.outputs["translation"].shape == (1,)
