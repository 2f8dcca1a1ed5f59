"""Greedy and beam search of an encoder-decoder, served from one SavedModel.

An Embedding + bidirectional GRU encoder, an `AttentionRNNCell` (GRUCell,
BahdanauAttention) driven by `rnn_step_fn`, and a Dense projection (random
weights) are exported with ``keras.export.ExportArchive``: the
``serving_default`` signature takes the source token ids (and the GNMT length
penalty) and runs the encoder, `greedy_search` and `beam_search` inside the
graph. It is loaded in a fresh process where ``attention_layers`` cannot be
imported and must give what the library gives in Python.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from attention_layers.decoding import (
    beam_search,
    greedy_search,
    rnn_step_fn,
    tile_beams,
)
from examples.seq2seq import build_seq2seq

PAD, START, END = 0, 1, 2

SOURCE_VOCAB, TARGET_VOCAB = 20, 13
MAX_LENGTH, BEAM_WIDTH = 11, 3
OUTPUTS = (
    "greedy_tokens",
    "greedy_lengths",
    "greedy_alignments",
    "beam_tokens",
    "beam_scores",
    "beam_lengths",
    "beam_alignments",
)


def make_translate(encoder, target_embedding, decoder, projection):
    """``translate(source, length_penalty) -> dict`` of the named outputs."""
    from keras import ops

    def translate(source, length_penalty):
        memory, state = encoder(source)
        mask = ops.not_equal(source, PAD)
        batch = ops.shape(source)[0]
        start = ops.cast(ops.full((batch,), START), "int32")
        initial = decoder.initial_states(batch, [state])
        greedy = greedy_search(
            rnn_step_fn(target_embedding, decoder.cell, projection, memory, mask),
            initial,
            start,
            end_id=END,
            max_length=MAX_LENGTH,
        )
        beams = beam_search(
            rnn_step_fn(
                target_embedding,
                decoder.cell,
                projection,
                tile_beams(memory, BEAM_WIDTH),
                tile_beams(mask, BEAM_WIDTH),
            ),
            tile_beams(initial, BEAM_WIDTH),
            start,
            end_id=END,
            max_length=MAX_LENGTH,
            beam_width=BEAM_WIDTH,
            length_penalty=length_penalty,
        )
        return {
            **{f"greedy_{k}": greedy[k] for k in ("tokens", "lengths", "alignments")},
            **{
                f"beam_{k}": beams[k]
                for k in ("tokens", "scores", "lengths", "alignments")
            },
        }

    return translate


# Runs in a fresh process: loads the SavedModel with TensorFlow alone and
# calls serving_default once per feed file.
_SERVE_WITHOUT_LIBRARY = textwrap.dedent(
    """
    import sys
    sys.modules["attention_layers"] = None  # any import of it now fails
    import numpy as np
    import tensorflow as tf
    try:
        import attention_layers  # noqa: F401
        sys.exit("attention_layers was importable")
    except ImportError:
        pass
    export_dir, *paths = sys.argv[1:]
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    for feed_path, out_path in zip(paths[::2], paths[1::2]):
        feed = dict(np.load(feed_path))
        out = fn(**{k: tf.constant(v) for k, v in feed.items()})
        np.savez(out_path, **{k: v.numpy() for k, v in out.items()})
    """
)


def serve_without_library(export_dir, feeds, tmp_path):
    args = []
    for i, feed in enumerate(feeds):
        args += [str(tmp_path / f"feed{i}.npz"), str(tmp_path / f"out{i}.npz")]
        np.savez(args[-2], **feed)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE_WITHOUT_LIBRARY, str(export_dir), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [dict(np.load(path)) for path in args[1::2]]


def assert_same(got, expected):
    assert set(got) == set(OUTPUTS)
    for name in OUTPUTS:
        assert got[name].shape == expected[name].shape, name
        if "tokens" in name or "lengths" in name:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        else:
            np.testing.assert_allclose(
                got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name
            )


@pytest.mark.tf_only
def test_greedy_and_beam_search_served_without_the_library(tmp_path):
    import tensorflow as tf

    model, *parts = build_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, 16, 8, 8)
    translate = make_translate(*parts)
    rng = np.random.default_rng(0)
    # Sources of 3 to 9 tokens, padded with 0; a batch size and a source length
    # the export never saw.
    source = rng.integers(1, SOURCE_VOCAB, size=(4, 9)).astype("int32")
    for row, length in enumerate([9, 3, 6, 5]):
        source[row, length:] = PAD

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serving_default",
        fn=translate,
        input_signature=[
            tf.TensorSpec((None, None), tf.int32, name="source"),
            tf.TensorSpec((), tf.float32, name="length_penalty"),
        ],
    )
    export_dir = tmp_path / "export"
    archive.write_out(str(export_dir), verbose=False)

    alphas = [0.0, 1.5]
    expected = [
        {
            k: keras.ops.convert_to_numpy(v)
            for k, v in translate(source, np.float32(alpha)).items()
        }
        for alpha in alphas
    ]
    feeds = [
        {"source": source, "length_penalty": np.array(alpha, "float32")}
        for alpha in alphas
    ]
    served = serve_without_library(export_dir, feeds, tmp_path)
    for got, want in zip(served, expected, strict=True):
        assert_same(got, want)
        assert got["beam_tokens"].shape == (4, BEAM_WIDTH, MAX_LENGTH)
        assert got["beam_alignments"].shape == (4, BEAM_WIDTH, MAX_LENGTH, 9)
        assert got["greedy_alignments"].shape == (4, MAX_LENGTH, 9)
        # Padded source positions get no attention.
        assert (got["greedy_alignments"][1, :, 3:] == 0).all()
    # The length penalty given at serving time is used: alpha = 1.5 divides
    # the log-probabilities by lp(|Y|) > 1.
    assert not np.allclose(served[0]["beam_scores"], served[1]["beam_scores"])

    cli = shutil.which("saved_model_cli", path=str(pathlib.Path(sys.executable).parent))
    if cli is None:
        return  # the signature was checked by loading it; the CLI is optional
    proc = subprocess.run(
        [
            cli,
            "show",
            "--dir",
            str(export_dir),
            "--tag_set",
            "serve",
            "--signature_def",
            "serving_default",
        ],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("source", "length_penalty", *OUTPUTS):
        assert f"['{name}']" in proc.stdout, (name, proc.stdout)
