"""The summarization task's parts: data, batches, phases, serving, metrics.

The task as a whole is proven by the pipeline contract (test_contract.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from pipelines.core.config import apply_overrides
from pipelines.core.errors import PipelineError
from pipelines.core.text import END, START, UNK, WordTokenizer
from pipelines.data.user_files import read_jsonl
from pipelines.summarization import data as summarization_data
from pipelines.summarization.blurbs import generate_blurbs
from pipelines.summarization.config import preset
from pipelines.summarization.evaluate import oov_shares
from pipelines.summarization.model import PointerSeq2Seq
from pipelines.summarization.serving import Summarizer
from pipelines.summarization.task import TASK

pytestmark = pytest.mark.tf_only


def test_blurbs_are_deterministic_with_names_seen_once():
    pairs = generate_blurbs(200, seed=1)
    assert pairs == generate_blurbs(200, seed=1) != generate_blurbs(200, seed=2)
    names = [synopsis.split(" - ")[0] for _, synopsis in pairs]
    assert len(set(names)) == 200
    # The name is in its document and in no other: only a copy can write it.
    for (document, _), name in zip(pairs, names, strict=True):
        assert name in document.replace(",", " ").split()
    documents = " ".join(document for document, _ in pairs).replace(",", " ").split()
    assert all(documents.count(name) == 1 for name in names[:20])


def test_jsonl_pairs_and_errors_that_name_the_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"document": " a long text ", "summary": "short"}, {"document": "b"}]
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    with pytest.raises(
        PipelineError, match=r'pairs.jsonl, line 3: field "summary": expected a string'
    ):
        read_jsonl(path)
    path.write_text(json.dumps(rows[0]) + "\n[1]\n")
    with pytest.raises(PipelineError, match="line 2: expected a JSON object"):
        read_jsonl(path)
    path.write_text(json.dumps(rows[0]) + "\n")
    assert read_jsonl(path) == [("a long text", "short")]


def test_data_filters_are_reported_and_unknown_corpora_named(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("one two three\tone\n\tempty\nfour five six seven\tfour five\n")
    config = apply_overrides(
        preset("tiny"),
        [f"data.source=tsv:{path}", "data.max_source_words=3", "data.test_fraction=0"],
    )
    data = summarization_data.load_data(config)
    assert data.train + data.valid == [("one two three", "one")]
    assert "dropped 1 pairs with an empty side" in data.notes
    assert any("dropped 1 pairs over 3 document" in note for note in data.notes)
    config = apply_overrides(preset("tiny"), ["data.source=news"])
    with pytest.raises(PipelineError, match="unknown corpus 'news'; valid forms: de"):
        summarization_data.load_data(config)


@pytest.mark.parametrize("variant", ["baseline", "pointer"])
def test_batches_give_oov_summary_words_their_copy_ids(variant):
    tokenizer = WordTokenizer.learn(["the cat sat on the mat ."], vocab_size=10)
    vocab = tokenizer.vocab_size
    ids = dict(zip(tokenizer.words, range(4, vocab), strict=True))
    config = apply_overrides(preset("tiny"), [f"model.variant={variant}"])
    # zorp is OOV, copied as V + its position; blix is OOV and not copyable.
    pairs = [("the zorp sat .", "zorp sat blix")]
    data = summarization_data.make_dataset(pairs, tokenizer, config, training=False)
    features, target = next(iter(data))
    the, sat, dot = ids["the"], ids["sat"], ids["."]
    assert features["source"].numpy().tolist() == [[the, UNK, sat, dot]]
    assert features["source_ext"].numpy().tolist() == [[the, vocab + 1, sat, dot]]
    assert features["target_in"].numpy().tolist() == [[START, UNK, sat, UNK]]
    copy = vocab + 1 if variant == "pointer" else UNK  # the baseline cannot copy
    assert target.numpy().tolist() == [[copy, sat, UNK, END]]


def test_the_coverage_phase_is_the_last_coverage_epochs():
    class Recorder:
        weights: list = []

        def set_coverage_weight(self, weight):
            self.weights.append(weight)

    def phases_and_weights(*overrides):
        config = apply_overrides(preset("tiny"), list(overrides))
        model = Recorder()
        model.weights = []
        phases = TASK.phases(config)
        for phase in range(len(phases) + 1):
            TASK.start_phase(model, config, phase)
        return phases, model.weights

    settings = ["train.epochs=5", "coverage.epochs=2", "coverage.weight=0.5"]
    assert phases_and_weights(*settings) == ((3,), [0.0, 0.5])
    assert phases_and_weights(*settings, "coverage.epochs=5") == ((), [0.5])
    assert phases_and_weights(*settings, "coverage.epochs=0") == ((), [0.0])
    assert phases_and_weights(*settings, "model.variant=pointer") == ((), [])


def test_oov_shares_count_reference_words_outside_the_vocabulary():
    tokenizer = WordTokenizer.learn(["a b c"], vocab_size=7)
    # OOV reference words: zorp (in the source, produced), blix (in the
    # source, missed) and quux (not in the source).
    shares = oov_shares(
        tokenizer,
        ["a zorp blix", "c"],
        ["zorp blix a", "quux"],
        [{"a", "zorp"}, {"c"}],
    )
    assert shares == {
        "oov_reference_words": 3,
        "oov_copied": round(1 / 3, 4),
        "oov_in_source": round(2 / 3, 4),
    }


def test_summarizer_defines_empty_texts_and_honours_min_length():
    config = apply_overrides(preset("tiny"), ["decode.beam_width=2"])
    tokenizer = WordTokenizer.learn(["the cat sat on the mat ."], vocab_size=10)
    model = PointerSeq2Seq(tokenizer.vocab_size, 4, 4, 4, pointer=True, coverage=True)
    summarizer = Summarizer(model, tokenizer, config)
    fn = summarizer.traced_summarize()
    for min_length in (0, 5):
        out = fn(
            tf.constant(["", "the zorp sat .", " \t "]),
            tf.constant(2),
            tf.constant(0.0),
            tf.constant(min_length),
        )
        lengths = out["length"].numpy()
        assert lengths[0] == lengths[2] == 0 and out["summary"][0] == b""
        assert not out["attention"].numpy()[[0, 2]].any()
        assert not out["p_gen"].numpy()[[0, 2]].any()
        assert lengths[1] >= min_length + 1  # the tokens, then [END]
        p_gen = out["p_gen"].numpy()[1, : lengths[1]]
        assert ((p_gen > 0) & (p_gen < 1)).all()
        np.testing.assert_allclose(
            out["attention"].numpy()[1, : lengths[1]].sum(-1), 1.0, rtol=1e-5
        )


def test_aclsum_is_read_from_the_installed_wheel_or_named(tmp_path, monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    from pipelines.core.errors import MissingDataError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDataError, match="pip install aclsum"):
        summarization_data.read_aclsum()
    folder = tmp_path / "aclsum" / "dataset"
    folder.mkdir(parents=True)
    paper = {
        "sentences": {"abstract": ["We study x .", "It works ."]},
        "summary": {"challenge": "x is hard.", "approach": "a", "outcome": "o"},
    }
    for split in ("train", "val", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps(paper) + "\n")
    found = SimpleNamespace(submodule_search_locations=[str(folder.parent)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: found)
    assert (
        summarization_data.read_aclsum("outcome")
        == [("We study x . It works .", "o")] * 3
    )
    with pytest.raises(ValueError, match="one of challenge, approach, outcome"):
        summarization_data.read_aclsum("method")


def test_the_transformer_takes_no_coverage():
    from pipelines.core.errors import ConfigError

    with pytest.raises(ConfigError, match="variant` coverage is the RNN's"):
        apply_overrides(preset("tiny"), ["model.architecture=transformer"]).validate()


# About 30 s on two cores: make test-slow.
@pytest.mark.slow
def test_the_transformer_pointer_trains_and_summarizes_in_the_task():
    import keras

    config = apply_overrides(
        preset("tiny"),
        ["model.architecture=transformer", "model.variant=pointer",
         "model.num_heads=2", "train.steps_per_epoch=3"],
    )  # fmt: skip
    config.validate()
    data = summarization_data.load_data(config)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, tokenizer)
    model.trainer.compile(keras.optimizers.Adam(3e-3), **TASK.compile_arguments(config))
    batches = TASK.make_dataset(data.train, tokenizer, config, training=True)
    history = model.trainer.fit(batches, epochs=2, steps_per_epoch=3, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][1] < history.history["loss"][0]
    out = TASK.serving_module(model, tokenizer, config).traced_summarize()(
        tf.constant([data.test[0][0], ""]), tf.constant(2), tf.constant(1.0),
        tf.constant(2),
    )  # fmt: skip
    length = int(out["length"][0])
    assert length >= 3 and out["length"][1] == 0
    p_gen = out["p_gen"].numpy()[0, :length]
    assert ((p_gen > 0) & (p_gen < 1)).all()
