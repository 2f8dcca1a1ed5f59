"""The question-answering task's own pieces: answer ids, batches, the export's
in-graph story handling (against the training encoding), evaluation.

The pipeline contract (tests/pipelines/test_contract.py) runs on the task too.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import tensorflow as tf

from pipelines.core.config import apply_overrides
from pipelines.core.errors import PipelineError
from pipelines.qa import data as qa_data
from pipelines.qa.babi import QAExample, format_story, split_story
from pipelines.qa.client import split_input
from pipelines.qa.config import PRESETS, preset
from pipelines.qa.evaluate import attention_hits, evaluate
from pipelines.qa.task import TASK

pytestmark = pytest.mark.tf_only  # a TensorFlow pipeline: its tests run once


@pytest.fixture(scope="module")
def setup():
    """The tiny preset's data, preprocessors and an untrained model."""
    config = apply_overrides(preset("tiny"), ["data.source=babi:1,6@100"])
    data = TASK.load_data(config)
    preprocessors = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, preprocessors)
    module = TASK.serving_module(model, preprocessors, config)
    return config, data, preprocessors, model, module


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_builds(name):
    """Each preset passes its own validation and builds a model of its
    sizes (on the tiny data)."""
    config = apply_overrides(preset(name), ["data.source=babi:1@60"])
    data = TASK.load_data(config)
    preprocessors = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, preprocessors)
    assert model.trainer.count_params() > 0


def _serve(module, stories, questions):
    fn = module.signatures()["serving_default"]
    out = fn(story=tf.constant(stories), question=tf.constant(questions))
    return {k: v.numpy() for k, v in out.items()}


def test_a_story_on_one_line_is_answered_as_one_sentence_per_line(setup):
    """The export splits a story's sentences in the graph as ``predict``
    does: one line, one sentence per line and ``split_input``'s pieces give
    the same memories, answer, score and attention."""
    *_, module = setup
    text = "Mary moved to the bathroom. John went to the hallway! Is it?  No.\n"
    lines = "Mary moved to the bathroom.\nJohn went to the hallway!\nIs it?\nNo."
    story, question = split_input(text + " Where is Mary?")
    assert story == lines
    one, many = (_serve(module, [s], ["where is mary?"]) for s in (text, lines))
    assert one["sentences"][0].tolist() == [
        b"Mary moved to the bathroom.",
        b"John went to the hallway!",
        b"Is it?",
        b"No.",
    ]
    for key, value in many.items():
        np.testing.assert_array_equal(one[key], value, err_msg=key)


def test_answer_ids_share_word_ids_and_extend_the_vocabulary():
    ids = qa_data.answer_ids(["the", "kitchen"], ["kitchen", "no", "milk,apple", "yes"])
    assert ids == [5, 6, 7, 8]  # "kitchen" is word 1 (+4 reserved)


def test_preprocessors_cover_train_and_valid_answers(setup):
    config, data, preprocessors, _, _ = setup
    assert set(preprocessors.answers) == {e.answer for e in data.train + data.valid}
    assert {"yes", "no", "kitchen"} <= set(preprocessors.answers)
    ids = preprocessors.answer_ids
    assert len(set(ids)) == len(ids) and max(ids) < preprocessors.vocab_size
    words = preprocessors.tokenizer.words
    assert ids[preprocessors.answers.index("kitchen")] == 4 + words.index("kitchen")


def test_kept_story_keeps_the_last_sentences_and_reindexes_the_facts():
    example = QAExample(tuple(f"s{i}." for i in range(6)), "q?", "a", (1, 4), 1)
    story, facts = qa_data.kept_story(example, 3)
    assert story == ["s3.", "s4.", "s5."] and facts == [1]


def test_batches_hold_each_story_as_its_tokenized_sentences(setup):
    config, data, preprocessors, _, _ = setup
    examples = data.train[:40]
    batches = list(TASK.make_dataset(examples, preprocessors, config, False))
    assert sum(int(b[1].shape[0]) for b in batches) == len(examples)
    tok = preprocessors.tokenizer
    first = batches[0]
    features, answers = first
    story, question = features["story"].numpy(), features["question"].numpy()
    # Evaluation order is the examples' order within a bucket: find the
    # first example of the first batch by its sentence count.
    n = int((story[0] != 0).any(-1).sum())
    example = next(e for e in examples if len(e.story) == n)
    expected = tok.tokenize(tf.constant(list(example.story))).to_tensor().numpy()
    np.testing.assert_array_equal(story[0, :n, : expected.shape[1]], expected)
    assert not story[0, :n, expected.shape[1] :].any()
    q = tok.tokenize(tf.constant([example.question])).to_tensor().numpy()[0]
    np.testing.assert_array_equal(question[0, : len(q)], q)
    answer = preprocessors.answer_ids[preprocessors.answers.index(example.answer)]
    assert int(answers[0]) == answer


def test_static_shapes_and_supervision_inputs(setup):
    config, data, preprocessors, _, _ = setup
    config = apply_overrides(
        config, ["train.jit_compile=true", "model.supervision_weight=0.5"]
    )
    batches = list(TASK.make_dataset(data.train, preprocessors, config, True))
    shapes = {tuple(b[0]["story"].shape[1:]) for b in batches}
    words = config.tokenizer.max_words
    assert all(w == words for _, w in shapes) and len(shapes) <= 7, shapes
    for features, target in batches[:3]:
        supporting = features["supporting"].numpy()
        assert supporting.dtype == bool and supporting.any(axis=1).all()
        assert set(target) == {"answer"}
        real = (features["story"].numpy() != 0).any(-1)
        assert not (supporting & ~real).any()  # facts are real sentences


def test_supervised_model_adds_the_attention_loss(setup):
    import keras

    config, data, preprocessors, _, _ = setup
    config = apply_overrides(config, ["model.supervision_weight=1.0"])
    model = TASK.build_model(config, preprocessors)
    model.trainer.compile("adam", **TASK.compile_arguments(config))
    dataset = TASK.make_dataset(data.train[:64], preprocessors, config, True)
    features, target = next(iter(dataset))
    outputs = model.trainer(features)
    assert set(outputs) == {"answer", "attention"}
    assert len(model.trainer.losses) == 1 and float(model.trainer.losses[0]) > 0
    history = model.trainer.fit(dataset, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    del keras


def test_served_answers_equal_the_trained_encoding(setup):
    """The export splits and tokenizes the story in the graph; it must read
    what training read, and answer with the best of the known answers."""
    config, data, preprocessors, model, module = setup
    examples = data.test[:24]
    out = _serve(
        module, [format_story(e) for e in examples], [e.question for e in examples]
    )
    story, question, _, _, _ = qa_data.encode(examples, preprocessors, config)
    logits, attention = model.scorer([story.to_tensor(), question.to_tensor()])
    candidates = tf.gather(logits, preprocessors.answer_ids, axis=1)
    probabilities = tf.nn.softmax(candidates).numpy()
    best = [preprocessors.answers[i] for i in probabilities.argmax(1)]
    assert [a.decode() for a in out["answer"]] == best
    np.testing.assert_allclose(out["score"], probabilities.max(1), rtol=1e-5)
    for i, e in enumerate(examples):
        n = len(e.story)
        np.testing.assert_allclose(
            out["attention"][i, :, :n], attention.numpy()[i, :, :n], atol=1e-6
        )
        assert [s.decode() for s in out["sentences"][i, :n]] == list(e.story)


def test_served_sentences_are_the_sentences_training_reads(setup):
    """One sentence, one memory, as in training: a line break or ``.``,
    ``!``, ``?`` before white space ends one; blank lines are no memory."""
    *_, module = setup
    story = ("Mary went to the garden. John moved to the office.\n\n  Mary went "
             "back to the kitchen.  ")  # fmt: skip
    out = _serve(module, [story], ["Where is Mary?"])
    expected = [
        "Mary went to the garden.",
        "John moved to the office.",
        "Mary went back to the kitchen.",
    ]
    assert [s.decode() for s in out["sentences"][0]] == expected
    assert split_story(story) == expected
    np.testing.assert_allclose(out["attention"][0].sum(-1), 1.0, rtol=1e-5)


def test_a_cut_story_reads_what_training_reads(setup):
    """With 4 memories, the export reads each story's last 4 sentences, in the
    places training put them, and spreads the attention back over the story."""
    config, data, preprocessors, _, _ = setup
    config = apply_overrides(config, ["model.max_memories=4"])
    model = TASK.build_model(config, preprocessors)
    module = TASK.serving_module(model, preprocessors, config)
    examples = [e for e in data.test if len(e.story) > 4][:12]
    assert len(examples) == 12
    out = _serve(
        module, [format_story(e) for e in examples], [e.question for e in examples]
    )
    story, question, _, _, _ = qa_data.encode(examples, preprocessors, config)
    _, attention = model.scorer([story.to_tensor(), question.to_tensor()])
    for i, e in enumerate(examples):
        n = len(e.story)
        assert not out["attention"][i, :, : n - 4].any()
        np.testing.assert_allclose(
            out["attention"][i, :, n - 4 : n], attention.numpy()[i], atol=1e-6
        )


def test_a_story_longer_than_the_memory_reads_its_last_sentences(setup):
    config, *_, module = setup
    limit = config.model.max_memories
    sentences = [f"Mary went to the {p}." for p in ["garden", "office"] * limit]
    out = _serve(module, ["\n".join(sentences[: limit + 3])], ["Where is Mary?"])
    attention = out["attention"][0]
    assert attention.shape == (config.model.hops, limit + 3)
    assert not attention[:, :3].any()
    np.testing.assert_allclose(attention[:, 3:].sum(-1), 1.0, rtol=1e-5)


def test_unanswerable_rows_and_mismatched_batches(setup):
    *_, module = setup
    out = _serve(
        module, ["", "Mary went to the garden.", "Mary went to the garden."],
        ["Where is Mary?", "", "Where is Mary?"],
    )  # fmt: skip
    assert out["answer"].tolist()[:2] == [b"", b""] and out["answer"][2] != b""
    assert out["score"][:2].tolist() == [0.0, 0.0] and not out["attention"][:2].any()
    with pytest.raises(tf.errors.InvalidArgumentError, match="same batch size"):
        _serve(module, ["Mary went to the garden."] * 2, ["Where is Mary?"])


def test_split_input_takes_the_last_sentence_as_the_question():
    assert split_input("A went to the b.\nC moved to the d. Where is A?") == (
        "A went to the b.\nC moved to the d.",
        "Where is A?",
    )
    with pytest.raises(PipelineError, match="ending in '\\?'"):
        split_input("Mary went to the garden.")


def test_attention_hits_by_hand():
    attention = np.array(
        [
            [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]],
            [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]],
            [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]],
        ]
    )
    hits = attention_hits(attention, [(1,), (0, 2), ()])
    assert hits.tolist() == [[True, False], [True, True], [False, False]]


def test_evaluate_scores_per_task_and_writes_its_files(setup, tmp_path, capsys):
    config, data, preprocessors, model, module = setup
    examples = data.test[:30] + data.test[-30:]
    metrics = evaluate(tmp_path, module, config, examples, "test", heatmaps=2)
    assert set(metrics["tasks"]) == {"1", "6"}
    assert metrics["tasks"]["1"]["memn2n_1k_error"] == 0.1
    rows = (tmp_path / "answers.tsv").read_text().splitlines()
    assert len(rows) == len(examples) + 1
    predicted = [r.split("\t")[4] for r in rows[1:]]
    correct = np.mean([p == e.answer for p, e in zip(predicted, examples, strict=True)])
    assert metrics["accuracy"] == pytest.approx(correct)
    for task in ("1", "6"):
        entry = metrics["tasks"][task]
        assert entry["questions"] == 30 and len(entry["attention_hit"]) == 2
    assert (tmp_path / "plots" / "attention_1.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "single supporting fact" in out
    # The baseline: the training split's most common answer, for every question.
    answers = [e.answer for e in data.train]
    baseline = metrics["baselines"]["most_common_answer"]
    assert baseline["answer"] == max(answers, key=answers.count)
    right = [e.answer == baseline["answer"] for e in examples]
    assert baseline["accuracy"] == pytest.approx(np.mean(right))
    for task in ("1", "6"):
        rows = [e for e in examples if str(e.task) == task]
        share = np.mean([e.answer == baseline["answer"] for e in rows])
        entry = metrics["tasks"][task]["baselines"]["most_common_answer"]
        assert entry["accuracy"] == pytest.approx(share)
    # Printed beside the model's accuracy.
    assert "Scores on the 60 test questions, beside a trivial baseline:" in out
    (row,) = [line for line in out.splitlines() if line.startswith("all ")]
    assert row.split()[1:4] == [
        "60",
        f"{metrics['accuracy']:.1%}",
        f"{baseline['accuracy']:.1%}",
    ]


def test_qa_evaluate_arguments():
    parser = argparse.ArgumentParser()
    TASK.client.add_evaluate_arguments(parser)
    assert parser.parse_args([]).heatmaps == 3


def test_linear_start_is_the_first_phase(setup, capsys):
    config, _, preprocessors, _, _ = setup
    config = apply_overrides(config, ["model.linear_start_epochs=3", "train.epochs=10"])
    assert TASK.phases(config) == (3,)
    model = TASK.build_model(config, preprocessors)
    TASK.start_phase(model, config, 0)
    assert float(model.memory.linear.numpy()) == 1.0
    TASK.start_phase(model, config, 1)
    assert float(model.memory.linear.numpy()) == 0.0
    assert "Softmax on" in capsys.readouterr().out
    longer = apply_overrides(config, ["model.linear_start_epochs=10"])
    assert TASK.phases(longer) == ()  # the whole run is linear
    assert TASK.phases(apply_overrides(config, ["model.linear_start_epochs=0"])) == ()
