"""The extractive task's own pieces: offsets, hashed ids, the match feature,
answer spans in batches, and the export's span to text (against hand-made
logits).

The pipeline contract (tests/pipelines/test_contract.py) runs on the task too.
"""

from __future__ import annotations

import json

import keras
import pytest
import tensorflow as tf

from pipelines.core.config import apply_overrides
from pipelines.core.errors import PipelineError
from pipelines.extractive import data as span_data
from pipelines.extractive.client import split_input
from pipelines.extractive.config import PRESETS, preset
from pipelines.extractive.countries import SpanExample
from pipelines.extractive.data import Preprocessors, token_span
from pipelines.extractive.serving import SpanAnswerer
from pipelines.extractive.task import TASK
from pipelines.extractive.tokenizer import SpanTokenizer

pytestmark = pytest.mark.tf_only  # a TensorFlow pipeline: its tests run once

CONTEXT = "Zürich’s lake is cold. The capital of Switzerland is Bern, a city."


def _example(context, answer, occurrence=0, question="What is the capital?"):
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return SpanExample(context, question, (answer,), start)


def test_offsets_are_bytes_of_the_original_text():
    tokens, begins, ends = SpanTokenizer.split([CONTEXT])
    raw = CONTEXT.encode("utf-8")
    for token, b, e in zip(
        tokens[0].numpy(), begins[0].numpy(), ends[0].numpy(), strict=True
    ):
        assert raw[b:e] == token
    assert [t.decode() for t in tokens[0].numpy()[:4]] == ["Zürich", "’", "s", "lake"]


def test_an_unknown_word_gets_one_hashed_id_in_passage_and_question():
    tok = SpanTokenizer.learn(["the capital is bern ."], vocab_size=20, oov_buckets=8)
    encoded = tok.encode(
        tf.constant(["Tuvalu: the capital is Funafuti."]),
        tf.constant(["What is the capital of TUVALU?"]), 64, 16,
    )  # fmt: skip
    context = encoded["context"][0].numpy()
    question = encoded["question"][0].numpy()
    known = 4 + len(tok.words)
    assert context[0] >= known and context[0] == question[-2]  # tuvalu, any case
    assert known <= context.max() < tok.vocab_size
    # match: tuvalu, the, capital, is; not ":", "funafuti" or "."
    assert encoded["match"][0].numpy().tolist() == [1, 0, 1, 1, 1, 0, 0]


def test_tokenizer_round_trips_and_refuses_another_kind(tmp_path):
    tok = SpanTokenizer.learn([CONTEXT], vocab_size=10, oov_buckets=3)
    tok.save(tmp_path / "t.json")
    again = SpanTokenizer.load(tmp_path / "t.json")
    assert again.words == tok.words and again.vocab_size == 4 + 6 + 3
    (tmp_path / "w.json").write_text(json.dumps({"kind": "word", "words": []}))
    with pytest.raises(ValueError, match="expected a span_words tokenizer"):
        SpanTokenizer.load(tmp_path / "w.json")


def test_token_span_uses_answer_start_not_the_first_occurrence():
    context = "Southern Europe is a subregion. It lies in Europe."
    tokens, begins, ends = SpanTokenizer.split([context])
    second = _example(context, "Europe", occurrence=1)
    assert token_span(second, begins[0].numpy(), ends[0].numpy()) == (9, 9)
    first = _example(context, "Southern Europe")
    assert token_span(first, begins[0].numpy(), ends[0].numpy()) == (0, 1)
    # Past a cut passage, or across the cut: not all of it is read.
    assert token_span(second, begins[0].numpy()[:5], ends[0].numpy()[:5]) == (-1, -1)
    assert token_span(first, begins[0].numpy()[:1], ends[0].numpy()[:1]) == (-1, -1)


def test_batches_point_at_the_answer_and_leave_out_answers_past_the_cut():
    config = apply_overrides(
        preset("tiny"),
        ["tokenizer.max_context_tokens=13", "train.batch_size=4"],
    )
    examples = [
        _example(CONTEXT, "Bern"),  # token 12: the last one read
        _example(CONTEXT, "Zürich"),
        _example("A b c d e f g h i j k l m n o p Quito.", "Quito"),  # past 13
    ]
    tok = SpanTokenizer.learn([e.context for e in examples], 50, 4)
    pre = Preprocessors(tok)
    encoded = span_data.encode(examples, pre, config)
    assert encoded["start"].tolist() == [12, 0, -1]
    ((features, targets),) = list(TASK.make_dataset(examples, pre, config, False))
    assert features["context"].shape == (2, 13)
    assert targets["start"].numpy().tolist() == [12, 0]
    assert targets["end"].numpy().tolist() == [12, 0]
    only_past = [examples[2]]
    with pytest.raises(PipelineError, match="none of the 1 answers lies within"):
        TASK.make_dataset(only_past, pre, config, False)


class _Pointer:
    """A stand-in SpanQA: start and end logits peak on passage words that the
    question asks about (the match feature), the rest of a span is pointed at
    by ``width`` more tokens for the end."""

    def __init__(self, width=0):
        inputs = {
            "context": keras.Input((None,), dtype="int32", name="context"),
            "match": keras.Input((None,), dtype="float32", name="match"),
            "question": keras.Input((None,), dtype="int32", name="question"),
        }
        padding = keras.ops.cast(keras.ops.equal(inputs["context"], 0), "float32")
        start = inputs["match"] * 10.0 - padding * 1e9
        end = keras.ops.roll(inputs["match"], width, axis=1) * 10.0 - padding * 1e9
        self.trainer = keras.Model(inputs, {"start": start, "end": end})
        self.attention = self.trainer


def _answerer(width=0, max_span=12):
    config = apply_overrides(preset("tiny"), [f"model.max_span_length={max_span}"])
    tok = SpanTokenizer.learn([CONTEXT], vocab_size=50, oov_buckets=4)
    return SpanAnswerer(_Pointer(width), Preprocessors(tok), config, [])


def _serve(module, contexts, questions):
    fn = module.signatures()["serving_default"]
    out = fn(context=tf.constant(contexts), question=tf.constant(questions))
    return {k: v.numpy() for k, v in out.items()}


def test_served_offsets_are_characters_and_cover_the_answer_text():
    out = _serve(_answerer(width=2), [CONTEXT], ["bern?"])
    answer = out["answer"][0].decode()
    assert answer == "Bern, a"  # start on "Bern", end two tokens on
    assert CONTEXT[out["start"][0] : out["end"][0]] == answer
    assert 0.0 < out["score"][0] <= 1.0


def test_the_span_length_is_capped():
    out = _serve(_answerer(width=2, max_span=1), [CONTEXT], ["bern?"])
    assert out["answer"][0] == b"Bern"  # one token; its end is two tokens on
    assert CONTEXT[out["start"][0] : out["end"][0]] == "Bern"


def test_empty_inputs_get_no_answer_and_others_are_answered():
    out = _serve(_answerer(), ["", CONTEXT, CONTEXT], ["bern?", "  ", "bern?"])
    assert out["answer"].tolist() == [b"", b"", b"Bern"]
    assert out["start"].tolist()[:2] == [0, 0] and out["score"][1] == 0.0
    alone = _serve(_answerer(), [" \n "], ["bern?"])  # no passage has a token
    assert alone["answer"].tolist() == [b""] and alone["score"].tolist() == [0.0]
    assert alone["start"].tolist() == [0] and alone["end"].tolist() == [0]


def test_split_input_needs_a_question_and_a_passage():
    assert split_input("Bern is a city. Where?") == ("Bern is a city.", "Where?")
    for text in ("Bern is a city.", "Where is Bern?"):
        with pytest.raises(PipelineError, match="a passage then a question"):
            split_input(text)


def test_jsonl_data_is_split_by_passage_and_limited(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [
        {
            "context": f"Passage {i}. The answer is w{i}.",
            "question": q,
            "answer": f"w{i}",
        }
        for i in range(40)
        for q in ("What is it?", "Which word?")
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    config = apply_overrides(
        preset("tiny"), [f"data.source=jsonl:{path}", "data.limit=10000"]
    )
    data = TASK.load_data(config)
    splits = [data.train, data.valid, data.test]
    assert sum(map(len, splits)) == 80 and all(splits)
    passages = [{e.context for e in split} for split in splits]
    assert not (passages[0] & passages[1]) and not (passages[0] & passages[2])
    limited = apply_overrides(config, ["data.limit=3"])
    assert len(TASK.load_data(limited).train) == 3


@pytest.mark.parametrize("encoder", ["gru", "transformer"])
def test_the_model_scores_real_words_only(encoder):
    """Start and end logits over the passage, -1e9 on its padding whatever the
    padding ids hold; BiDAF's attention over the real question words only."""
    from pipelines.extractive.model import SpanQA

    config = apply_overrides(preset("tiny"), [f"model.encoder={encoder}"])
    model = SpanQA(config, vocab_size=40)
    features = {
        "context": tf.constant([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]),
        "match": tf.constant([[0.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0, 0, 0, 1]]),
        "question": tf.constant([[6, 9, 0], [8, 12, 30]]),
    }
    out = model.attention(features, training=False)
    for key in ("start", "end"):
        logits = out[key].numpy()
        assert logits.shape == (2, 5)
        assert (logits[0, 3:] == -1e9).all() and (logits[0, :3] > -1e3).all()
        assert (logits[1] > -1e3).all()
    attention = out["attention"].numpy()
    assert attention.shape == (2, 5, 3)
    assert (attention[0, :3, 2] == 0).all()  # the padded question word
    assert abs(attention[0, :3].sum(-1) - 1).max() < 1e-5
    assert (attention[0, 3:] == 0).all()  # padded passage words attend nowhere


@pytest.mark.parametrize(
    ("gold", "boxed"),
    [(None, []), ((1, 2), ["capital", "is"]), ((5, 6), [])],
    ids=["no-gold", "gold", "gold-past-the-cut"],
)
def test_span_plot_names_the_gold_box_only_when_it_draws_one(
    monkeypatch, tmp_path, gold, boxed
):
    """``predict`` has no gold answer and a cut passage may have lost it:
    the legend promises a green box only when a token has one."""
    from matplotlib.colors import to_rgba

    from pipelines.core import plots
    from pipelines.extractive.evaluate import span_heatmap

    figures, save = [], plots._save

    def keep(plt, fig, path):
        figures.append(fig)
        return save(plt, fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    tokens = [b"the", b"capital", b"is", b"Bern"]
    path = span_heatmap(
        tokens, [0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1], tmp_path / "span.png",
        gold=gold, title="What is the capital?",
    )  # fmt: skip
    assert path.is_file()
    (fig,) = figures
    legend = fig._suptitle.get_text()
    assert legend.startswith("What is the capital?\nshade: p(start) + p(end)")
    assert ("green box: the gold answer" in legend) == bool(boxed)
    green = [
        text.get_text()
        for text in fig.texts
        if text.get_bbox_patch() is not None
        and text.get_bbox_patch().get_edgecolor() == to_rgba("green")
    ]
    assert green == boxed


# -- presets --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_builds(name):
    """Each preset passes its own validation and builds a model of its sizes
    that scores a batch of the tiny data (a vocabulary learned from it)."""
    data = TASK.load_data(preset("tiny"))
    config = preset(name).validate()
    preprocessors = TASK.preprocessors(None, data, config, create=False)
    model = TASK.build_model(config, preprocessors)
    batches = TASK.make_dataset(data.test, preprocessors, config, training=False)
    features, _ = next(iter(batches))
    out = model.trainer(features, training=False)
    assert out["start"].shape == out["end"].shape == features["context"].shape


def test_the_quick_preset_asks_the_countries_test_questions():
    """``countries-quick`` (the demo's) trains the ``countries`` model on
    fewer passages for fewer epochs, and is scored on the very same
    validation and test questions, so their numbers compare."""
    quick, full = preset("countries-quick"), preset("countries")
    assert quick.model == full.model and quick.tokenizer == full.tokenizer
    assert quick.data.passages_per_country < full.data.passages_per_country
    assert quick.train.epochs < full.train.epochs
    quick_data, full_data = TASK.load_data(quick), TASK.load_data(full)
    assert quick_data.test == full_data.test and quick_data.valid == full_data.valid
    assert {e.country for e in quick_data.train} == {e.country for e in full_data.train}
    assert len(quick_data.train) < len(full_data.train)
