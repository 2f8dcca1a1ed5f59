"""The question-answering task's encoder-decoder (``model.architecture=
encoder_decoder``): its batches, its export's in-graph source against the
training encoding, the attention summed per sentence, and a short run."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from pipelines.core.config import apply_overrides
from pipelines.core.errors import ConfigError
from pipelines.core.text import END, PAD, RESERVED, START
from pipelines.qa import data as qa_data
from pipelines.qa.babi import format_story
from pipelines.qa.config import preset
from pipelines.qa.serving import sentence_of_words
from pipelines.qa.task import TASK

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def setup():
    """Tasks 1 and 8 (lists), an untrained encoder-decoder and its export."""
    config = apply_overrides(
        preset("tiny-generative"), ["data.source=babi:1,8@100", "train.batch_size=8"]
    )
    data = TASK.load_data(config)
    preprocessors = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, preprocessors)
    module = TASK.serving_module(model, preprocessors, config)
    return config, data, preprocessors, model, module


def _serve(module, examples):
    fn = module.signatures()["serving_default"]
    out = fn(
        story=tf.constant([format_story(e) for e in examples]),
        question=tf.constant([e.question for e in examples]),
    )
    return {k: v.numpy() for k, v in out.items()}


def test_memory_options_are_refused_with_the_encoder_decoder():
    with pytest.raises(ConfigError, match="model.linear_start_epochs"):
        apply_overrides(preset("tiny-generative"), ["model.linear_start_epochs=5"])
    with pytest.raises(ConfigError, match="model.supervision_weight"):
        apply_overrides(preset("tiny-generative"), ["model.supervision_weight=1"])


def test_batches_are_story_words_then_question_words(setup):
    config, data, preprocessors, _, _ = setup
    examples = data.train[:8]
    one = apply_overrides(config, ["train.batch_size=1"])  # batches in order
    batches = list(TASK.make_dataset(examples, preprocessors, one, training=False))
    tokenize = preprocessors.tokenizer.tokenize
    words = config.tokenizer.max_words
    index = {w: len(RESERVED) + k for k, w in enumerate(preprocessors.answer_words)}
    for row, example in enumerate(examples):
        story, _ = qa_data.kept_story(example, config.model.max_memories)
        expected = []
        for sentence in [*story, example.question]:
            expected += tokenize(tf.constant([sentence]))[0, :words].numpy().tolist()
        features, target_out = batches[row]
        assert features["source"][0].numpy().tolist() == expected
        answer = [index[w] for w in example.answer.split(",")]
        assert features["target_in"][0].numpy().tolist() == [START, *answer]
        assert target_out[0].numpy().tolist() == [*answer, END]
    assert any("," in e.answer for e in data.train)  # task 8's lists are words


def test_sentence_index_of_every_word_by_hand():
    words = tf.ragged.constant([[[7, 8], [9]], [[5, 6, 4]]])
    assert sentence_of_words(words).to_list() == [[0, 0, 1], [0, 0, 0]]


def test_served_answers_follow_the_model_on_the_training_encoding(setup):
    """The export's greedy words are the argmax of the trained model fed the
    training batches' source and the words before: the export builds the
    source the way training does."""
    config, data, preprocessors, model, module = setup
    examples = data.test[:6]
    out = _serve(module, examples)
    one = apply_overrides(config, ["train.batch_size=1"])  # batches in order
    batches = list(TASK.make_dataset(examples, preprocessors, one, training=False))
    vocab = RESERVED + preprocessors.answer_words
    ids = {w: k for k, w in enumerate(vocab)}
    steps = [[ids[w.decode()] for w in row if w] for row in out["steps"]]
    for row, tokens in enumerate(steps):
        words = [vocab[t] for t in tokens if t >= len(RESERVED)]  # reserved: left out
        assert out["answer"][row].decode() == ",".join(words)
        # Teacher forcing masks a [PAD] input (mask_zero) where decoding feeds
        # it: compare the steps up to the first [PAD] an untrained model wrote.
        cut = tokens.index(PAD) + 1 if PAD in tokens else len(tokens)
        target_in = tf.constant([[START, *tokens[: cut - 1]]], tf.int32)
        source = batches[row][0]["source"]
        logits = model.trainer({"source": source, "target_in": target_in})[0]
        assert np.argmax(logits, -1).tolist() == tokens[:cut]
        # The score: the probability of every written token, [END] included,
        # one decoding step at a time.
        encoded = model.encode(source)
        step, state = model.step_fn(encoded), model.initial_state(encoded)
        probability, previous = 1.0, START
        for token in tokens:
            step_logits, state, _ = step(tf.constant([previous]), state)
            probability *= float(tf.nn.softmax(step_logits[0])[token])
            previous = token
        np.testing.assert_allclose(out["score"][row], probability, rtol=1e-4)


def test_attention_is_per_step_and_per_sentence(setup):
    config, data, _, _, module = setup
    examples = data.test[:4]
    out = _serve(module, examples)
    attention = out["attention"]
    longest = max(len(e.story) for e in examples)
    assert attention.shape == (4, config.model.max_answer_words + 1, longest)
    written = out["steps"] != b""
    assert (attention.sum(-1) <= 1.0 + 1e-5).all()
    assert (attention.sum(-1)[written] > 0.0).all()  # the question takes the rest
    assert not attention[~written].any()
    for row, example in enumerate(examples):
        assert not attention[row, :, len(example.story) :].any()


@pytest.mark.slow
def test_a_short_run_learns_and_evaluates(tmp_path, capsys):
    from pipelines.core.trainer import load_trained, train

    config = apply_overrides(
        preset("tiny-generative"),
        [
            "data.source=babi:1@1000",
            "train.epochs=6",
            "model.units=32",
            "model.embed_dim=16",
            "train.learning_rate=5e-3",
            # Not "auto": a MirroredStrategy over the test process's two
            # logical CPUs would clash with the layer contract's own
            # MirroredStrategy in the same xdist worker (collective keys).
            "train.strategy=default",
        ],
    )
    train(TASK, config, tmp_path)
    config, preprocessors, model = load_trained(TASK, tmp_path)
    from pipelines.qa.evaluate import evaluate

    module = TASK.serving_module(model, preprocessors, config)
    data = TASK.load_data(config)
    metrics = evaluate(tmp_path, module, config, data.test, "test", 1)
    assert metrics["attention_rows"] == "step"
    assert len(metrics["attention_hit"]) == config.model.max_answer_words + 1
    assert metrics["accuracy"] > 0.3  # six places: chance is 1/6 (measured: 0.45)
    assert (tmp_path / "plots" / "attention_0.png").exists()
    # One peak per written step: the place and [END], none after.
    rows = (tmp_path / "answers.tsv").read_text().splitlines()[1:]
    peaks = [row.split("\t")[7] for row in rows]
    assert all(0 < len(p.split(",")) <= 2 for p in peaks)
    assert "per step" in capsys.readouterr().out
