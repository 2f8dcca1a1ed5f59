"""The pointer-generator model: teacher forcing and step decoding agree."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops

import attention_layers as al
from attention_layers.decoding import beam_search, tile_beams
from pipelines.core.metrics import SequenceNLL
from pipelines.core.text import END, START, UNK
from pipelines.summarization.model import PointerSeq2Seq, split_p_gen
from pipelines.summarization.transformer import TransformerPointer

# The pipelines are TensorFlow programs: their tests run in the TF half.
pytestmark = pytest.mark.tf_only

V = 11
# Two sources; word 1 ([UNK]) stands for OOV words: "zorp" (key 50) at
# positions 1 and 3 of the first, "blix" (key 60) at 0 of the second.
SOURCE = np.array([[5, UNK, 6, UNK, 7], [UNK, 8, 9, 0, 0]])
KEYS = np.array([[5, 50, 6, 50, 7], [60, 8, 9, 0, 0]])
TARGET_IN = np.array([[START, 6, UNK, 7], [START, UNK, 9, 0]])
VARIANTS = {
    "baseline": {"pointer": False},
    "pointer": {"pointer": True},
    "coverage": {"pointer": True, "coverage": True, "coverage_weight": 1.0},
}


# The Transformer with the copy layer, and without it.
TRANSFORMERS = {"transformer": True, "transformer_baseline": False}


def build(variant):
    keras.utils.set_random_seed(3)
    if variant in TRANSFORMERS:
        return TransformerPointer(V, 8, 2, 2, 16, 5, pointer=TRANSFORMERS[variant])
    return PointerSeq2Seq(V, 6, 5, 4, **VARIANTS[variant])


def source_ext():
    ids = al.extended_source_ids(SOURCE, KEYS, UNK, V, mask=SOURCE != 0)
    return np.asarray(ids)


@pytest.mark.parametrize("variant", sorted(VARIANTS) + sorted(TRANSFORMERS))
def test_teacher_forcing_equals_decoding_step_by_step(variant):
    model = build(variant)
    ext = source_ext()
    forced = model.trainer(
        {"source": SOURCE, "source_ext": ext, "target_in": TARGET_IN}
    )
    width = V + SOURCE.shape[1] if model.pointer else V
    assert tuple(forced.shape) == (2, 4, width)
    encoded = model.encode(SOURCE, ext)
    step = model.step_fn(encoded)
    state = model.initial_state(encoded)
    # The step is fed extended ids: the copied "zorp" as its id V + 1.
    fed = np.where(TARGET_IN == UNK, np.array([[V + 1], [V]]), TARGET_IN)
    for t in range(3):  # the last row of the second example is padding
        scores, state, alignment = step(ops.array(fed[:, t]), state)
        np.testing.assert_allclose(
            ops.log_softmax(scores, -1),
            ops.log_softmax(forced[:, t], -1),
            atol=1e-5,
        )
        attention, p_gen = split_p_gen(np.asarray(alignment))
        np.testing.assert_allclose(attention.sum(-1), 1.0, rtol=1e-5)
        assert not attention[1, 3:].any()  # padded source positions
        if model.pointer:
            assert ((p_gen > 0) & (p_gen < 1)).all()
        else:
            assert (p_gen == 1).all()


def test_the_coverage_loss_is_weighted_per_phase_and_added_in_training_only():
    ext = source_ext()
    feed = {"source": SOURCE, "source_ext": ext, "target_in": TARGET_IN}
    model = build("coverage")  # weight 1
    model.trainer(feed)
    assert not model.trainer.losses  # not in inference: the validation loss
    # By hand: the attention of each step, decoded step by step.
    encoded = model.encode(SOURCE, ext)
    step, state = model.step_fn(encoded), model.initial_state(encoded)
    fed = np.where(TARGET_IN == UNK, np.array([[V + 1], [V]]), TARGET_IN)
    steps = []
    for t in range(4):
        _, state, alignment = step(ops.array(fed[:, t]), state)
        steps.append(split_p_gen(np.asarray(alignment))[0])
    expected = np.mean(al.coverage_loss(np.stack(steps, 1), TARGET_IN != 0))
    for weight in (1.0, 2.5, 0.0):
        model.set_coverage_weight(weight)
        model.trainer(feed, training=True)
        (loss,) = model.trainer.losses
        np.testing.assert_allclose(float(loss), weight * expected, rtol=1e-4)
    assert expected > 0
    with pytest.raises(ValueError, match="coverage=True needs pointer=True"):
        PointerSeq2Seq(V, 6, 5, 4, pointer=False, coverage=True)
    with pytest.raises(ValueError, match="has no coverage"):
        build("pointer").set_coverage_weight(1.0)


def test_beam_search_keeps_p_gen_and_coverage_per_hypothesis():
    model = build("coverage")
    k = 3
    encoded = tile_beams(model.encode(SOURCE, source_ext()), k)
    out = beam_search(
        model.step_fn(encoded),
        model.initial_state(encoded),
        ops.array([START, START]),
        end_id=END,
        max_length=6,
        beam_width=k,
        min_length=2,
    )
    attention, p_gen = split_p_gen(np.asarray(out["alignments"]))
    assert attention.shape == (2, k, 6, SOURCE.shape[1])
    assert (np.asarray(out["lengths"]) > 2).all()
    tokens = np.asarray(out["tokens"])
    assert tokens.max() < V + SOURCE.shape[1]
    steps = np.arange(6) < np.asarray(out["lengths"])[..., None]  # [B, K, L]
    assert ((p_gen > 0) & (p_gen < 1))[steps].all()
    assert not p_gen[~steps].any()  # zeros after the end, like the attention


# About 13 s each on two cores (tracing and saving a beam search): make test-slow.
@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["rnn", "transformer"])
def test_a_saved_model_writes_copied_words_as_the_source_strings(
    tmp_path, architecture
):
    import tensorflow as tf

    from pipelines.core.serving import ServingModule
    from pipelines.core.text import WordTokenizer
    from pipelines.summarization.decode import summarize

    tok = WordTokenizer.learn(["the cat sat on the mat ."], vocab_size=10)
    keras.utils.set_random_seed(1)
    if architecture == "rnn":
        model = PointerSeq2Seq(tok.vocab_size, 6, 5, 4, pointer=True)
    else:
        model = TransformerPointer(tok.vocab_size, 8, 1, 2, 16, max_length=4)
    v = tok.vocab_size
    model.trainer(  # builds the layers
        {
            "source": np.array([[4, UNK]]),
            "source_ext": np.array([[4, v + 1]]),
            "target_in": np.array([[START]]),
        }
    )
    # p_gen = sigmoid(-30): every word is copied, so the summary holds source
    # words only; "zorp" and "blix" are out of the vocabulary.
    model.copy.gate.bias.assign([-30.0])

    class Summarizer(ServingModule):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.string),
                tf.TensorSpec([], tf.int32),
            ]
        )
        def serve(self, text, beam_width):
            return summarize(
                model, tok, text, max_source_tokens=6, max_length=4,
                max_beam_width=3, beam_width=beam_width, min_length=1,
            )  # fmt: skip

    module = Summarizer(model.trainer, name="summarizer")
    module.tokenizer = tok  # tracks its lookup table
    tf.saved_model.save(module, str(tmp_path / "export"))
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    texts = ["zorp blix zorp", "the cat blix ."]
    for beams in (1, 3):
        out = loaded.serve(tf.constant(texts), tf.constant(beams))
        for text, summary, tokens in zip(
            texts, out["summary"].numpy(), out["summary_tokens"].numpy(), strict=True
        ):
            words = summary.decode().replace(".", " .").split()
            assert len(words) == 4, summary  # no end token: it has no copy mass
            assert set(words) <= set(text.split()), (text, summary)
            assert [t.decode() for t in tokens] == words
        assert set(out["summary"].numpy()[0].decode().split()) & {"zorp", "blix"}
        p_gen = out["p_gen"].numpy()
        assert (p_gen < 1e-6).all() and out["attention"].shape[1:] == (4, 4)


# About 35 s on two cores (three compiled train steps, one of them a
# step-by-step coverage loop): make test-slow.
@pytest.mark.slow
def test_each_variant_trains_on_extended_targets():
    """One fit step per variant (in a compiled train step, coverage loss on):
    the loss is finite and the coverage model's includes the coverage term."""
    ext = source_ext()
    feed = {"source": SOURCE, "source_ext": ext, "target_in": TARGET_IN}
    # Targets: "sat zorp ." for the first (zorp copied: V + 1), "blix 9".
    targets = {
        "baseline": np.array([[6, UNK, 7, END], [UNK, 9, END, 0]]),
        "pointer": np.array([[6, V + 1, 7, END], [V, 9, END, 0]]),
    }
    targets["coverage"] = targets["pointer"]
    for variant in sorted(VARIANTS):
        model = build(variant)
        model.trainer.compile(
            "adam",
            keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=0
            ),
        )
        history = model.trainer.fit(feed, targets[variant], epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all(), variant


def test_the_sequence_loss_averages_each_summary_then_the_summaries():
    """See et al.'s loss: 1/T_b sum_t -log P(w*_t) per summary, then the mean;
    a mean over the batch's tokens would weigh the longer summary more."""
    log_p = np.log(np.full((2, 3, 4), 0.25))
    log_p[0, 0] = np.log([0.1, 0.2, 0.3, 0.4])
    y = np.array([[3, 2, 1], [1, 0, 0]])  # 3 tokens, then 1 token
    first = -(np.log(0.4) + 2 * np.log(0.25)) / 3
    second = -np.log(0.25)
    loss = float(SequenceNLL()(y, log_p))
    np.testing.assert_allclose(loss, (first + second) / 2, rtol=1e-6)
