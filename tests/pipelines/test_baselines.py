"""Each task's trivial baselines against scores worked out by hand."""

from __future__ import annotations

import pytest
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU, CHRF

from pipelines.core.baselines import in_brief, lead, most_common, table


def test_most_common_counts_and_breaks_ties_by_first_seen():
    assert most_common(["x", "y", "y", "z"]) == "y"
    assert most_common(["b", "a", "a", "b"]) == "b"  # a tie: the first seen
    with pytest.raises(ValueError, match="no values"):
        most_common([])


def test_lead_is_the_first_sentence():
    assert lead("  It reads YAML. It writes JSON!  ") == "It reads YAML."
    assert lead("Does it? Yes.") == "Does it?"
    assert lead("version 2.0 of a tool. more") == "version 2.0 of a tool."
    assert lead("no full stop at all") == "no full stop at all"


def test_table_puts_each_baseline_beside_the_models_score():
    out = table(
        {"greedy": {"bleu": 91.5, "exact_match": 0.5}, "beam4": {"bleu": 92.25}},
        {"copy_source": {"what": "the source as it is", "bleu": 3.0}},
        [("BLEU", "bleu", ".2f"), ("exact match", "exact_match", ".1%")],
    )
    header, bleu, exact, what = out.splitlines()
    assert header.split() == ["metric", "greedy", "beam4", "|", "copy", "source"]
    assert bleu.split() == ["BLEU", "91.50", "92.25", "|", "3.00"]
    assert exact.split() == ["exact", "match", "50.0%", "-", "|", "-"]
    assert what == "  copy source: the source as it is"
    # Columns line up: each value ends under its heading.
    assert bleu.index("|") == header.index("|") == exact.index("|")
    assert bleu.rindex("3.00") + 4 == len(header)


def test_table_columns_widen_for_values_longer_than_their_heading():
    out = table(
        {"greedy": {"exact_match": 1.0}, "beam4": {"exact_match": 1.0}},
        {"copy_source": {"what": "the source", "exact_match": 0.0}},
        [("exact match", "exact_match", ".2%")],
    )
    header, exact, _ = out.splitlines()
    assert exact.split() == ["exact", "match", "100.00%", "100.00%", "|", "0.00%"]
    # Each value ends under its heading, "100.00%" being wider than "beam4".
    for name, value in (("greedy", "100.00%"), ("beam4", "100.00%")):
        end = header.index(name) + len(name)
        assert exact[end - len(value) : end] == value, (header, exact)
    assert exact.index("|") == header.index("|")


def test_in_brief_is_empty_without_baselines():
    rows = [("accuracy", "accuracy", ".1%")]
    assert in_brief({"accuracy": 0.9}, rows) == ""
    two = {"baselines": {"a_b": {"accuracy": 0.25}, "c": {"accuracy": 0.5}}}
    assert in_brief(two, rows) == " (baselines: a b accuracy 25.0%; c accuracy 50.0%)"


def test_translation_baselines_copy_the_source_and_take_the_training_target():
    from pipelines.translation.evaluate import baselines

    sources = ["Le 5 Mai 2001", "3 june 2002", "2003-01-01"]
    references = ["2001-05-05", "2002-06-03", "2003-01-01"]
    # The test split's most common target would be none of these: the
    # training split's ("1999-12-31", lowercased like the references) is used.
    train = ["1999-12-31", "2000-01-01", "1999-12-31"]
    out = baselines(sources, references, train)
    copied = [s.lower() for s in sources]
    copy = out["copy_source"]
    assert copy["bleu"] == round(BLEU().corpus_score(copied, [references]).score, 2)
    assert copy["chrf"] == round(CHRF().corpus_score(copied, [references]).score, 2)
    assert copy["exact_match"] == round(1 / 3, 4)
    common = out["most_common_target"]
    assert common["answer"] == "1999-12-31" and common["exact_match"] == 0.0
    assert "'1999-12-31'" in common["what"]
    assert common["chrf"] == round(
        CHRF().corpus_score(["1999-12-31"] * 3, [references]).score, 2
    )


def test_summarization_lead_1_is_scored_with_the_models_rouge():
    from pipelines.summarization.evaluate import baselines

    documents = ["zemot is a chess library. it is written in ruby.", "x y z"]
    references = ["zemot - chess libraries", "a b"]
    scores = baselines(documents, references)["lead_1"]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    leads = ["zemot is a chess library.", "x y z"]
    by_hand = [scorer.score(r, h) for r, h in zip(references, leads, strict=True)]
    for name in ("rouge1", "rouge2", "rougeL"):
        want = 100 * sum(s[name].fmeasure for s in by_hand) / 2
        assert scores[name] == pytest.approx(want, abs=0.01), name
    # By hand: 3 of 5 lead words ("zemot", "chess", "library" stemmed as
    # "libraries") match 3 of 3 reference words: F1 = 2 * 0.6 / 1.6 = 0.75;
    # the second pair shares none: ROUGE-1 = (75 + 0) / 2.
    assert scores["rouge1"] == 37.5


def test_question_answering_baselines_come_from_the_training_split():
    from pipelines.extractive.evaluate import most_common_answer as span_baseline
    from pipelines.qa.evaluate import most_common_answer

    train = ["kitchen", "garden", "kitchen"]
    truth = ["garden", "garden", "kitchen", "garden"]  # the test's own: garden
    baseline = most_common_answer(train, truth)
    assert baseline["answer"] == "kitchen" and baseline["accuracy"] == 0.25
    # Extractive: SQuAD scores against every gold answer of a question.
    golds = [["South America"], ["America", "the Americas"], ["Europe"]]
    baseline = span_baseline(["America", "Asia", "America"], golds)
    assert baseline["answer"] == "America"
    assert baseline["exact_match"] == pytest.approx(100 / 3, abs=0.01)
    # F1: "america" against "south america" is 2 * (1 * 0.5) / 1.5 = 2/3.
    assert baseline["f1"] == pytest.approx(100 * (2 / 3 + 1 + 0) / 3, abs=0.01)


def test_captioning_baseline_is_the_most_common_training_caption():
    from pipelines.captioning.evaluate import caption_bleu, most_common_caption

    train = ["Three one", "four", "three  ONE", "four five"]
    references = [("four",), ("three one", "three one one"), ("five two",)]
    baseline = most_common_caption(train, references)
    assert baseline["caption"] == "three one"  # normalised before counting
    assert baseline["exact_match"] == round(1 / 3, 4)
    assert baseline["bleu"] == caption_bleu(["three one"] * 3, references)["bleu"]
    assert "bleu_signature" not in baseline


def test_captioning_prints_localisation_only_where_it_was_graded():
    from pipelines.captioning.evaluate import LOCALISATION, _rows

    keys = [key for _, key, _ in _rows({"greedy": {"bleu": 1.0}})]
    assert keys == ["bleu", "exact_match"]
    graded = {"greedy": {"cider": 1.0, "localisation": 0.5, "localised_words": 9}}
    keys = [key for _, key, _ in _rows(graded)]
    assert keys == ["bleu", "cider", "exact_match", "localisation", "localised_words"]
    assert LOCALISATION.startswith("localisation: ")


def test_captioning_evaluate_prints_its_scores_beside_the_baseline(
    tmp_path, capsys, monkeypatch
):
    """Captions stood in for the model's (no model traced): ``metrics.json``
    holds the training split's most common caption scored on the same
    images, and the table prints it beside the decoding's scores, the
    localisation with its one-line definition."""
    import numpy as np

    from pipelines.captioning import evaluate as module
    from pipelines.captioning.config import preset
    from pipelines.captioning.task import TASK

    config = preset("tiny")
    data = TASK.load_data(config)
    examples = data.test[:6]
    written = [e.captions[0] for e in examples[:3]] + ["zero"] * 3

    def caption_images(server, pixels, beam_width, batch_size, progress=True):
        steps = 1 + max(len(c.split()) for c in written)
        return {
            "caption": np.array([c.encode() for c in written], dtype=object),
            "attention": np.zeros((len(written), steps, 2, 6), "float32"),
        }

    monkeypatch.setattr(module, "caption_images", caption_images)
    metrics = module.evaluate(tmp_path, None, config, examples, "test", (1,), plots=0)
    greedy = metrics["decoding"]["greedy"]
    assert greedy["exact_match"] == 0.5 and "localisation" in greedy
    captions = [" ".join(c.lower().split()) for e in data.train for c in e.captions]
    baseline = metrics["baselines"]["most_common_caption"]
    assert baseline["caption"] == max(captions, key=captions.count)
    references = [tuple(c.lower() for c in e.captions) for e in examples]
    exact = np.mean([baseline["caption"] in r for r in references])
    assert baseline["exact_match"] == round(float(exact), 4)
    bleu = module.caption_bleu([baseline["caption"]] * 6, references)["bleu"]
    assert baseline["bleu"] == bleu
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("  BLEU-4 ")]
    assert row.split() == ["BLEU-4", f"{greedy['bleu']:.2f}", "|", f"{bleu:.2f}"]
    (row,) = [line for line in out.splitlines() if line.startswith("  exact match")]
    assert row.split()[2:] == ["50.00%", "|", f"{exact:.2%}"]
    assert f"  {module.LOCALISATION}" in out
    assert "localisation_overlap" not in greedy and "right digit" not in out


def test_extractive_evaluate_prints_its_scores_beside_the_baseline(tmp_path, capsys):
    """Answers stood in for the model's: ``evaluate`` prints exact match and
    F1 (it printed only a count and a time) beside the training split's most
    common answer, scored on the same questions."""
    from types import SimpleNamespace

    import tensorflow as tf

    from pipelines.extractive.config import preset
    from pipelines.extractive.evaluate import evaluate
    from pipelines.extractive.task import TASK

    config = preset("tiny")
    data = TASK.load_data(config)
    examples = data.test[:8]
    written = [e.answers[0] for e in examples[:6]] + ["nowhere", "nothing"]

    def answer(contexts, questions):
        assert len(contexts) == len(questions) <= len(written)
        return {"answer": tf.constant(written[: len(contexts)]),
                "score": tf.zeros([len(contexts)])}  # fmt: skip

    answerer = SimpleNamespace(traced_answer=lambda: answer)
    metrics = evaluate(tmp_path, answerer, config, examples, "test", heatmaps=0)
    assert metrics["exact_match"] == 75.0
    answers = [e.answers[0] for e in data.train]
    baseline = metrics["baselines"]["most_common_answer"]
    assert baseline["answer"] == max(answers, key=answers.count)
    hits = sum(baseline["answer"] in e.answers for e in examples)
    assert baseline["exact_match"] == round(100 * hits / 8, 2)
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("  exact match")]
    assert row.split()[2:] == ["75.00", "|", f"{baseline['exact_match']:.2f}"]
    assert "  F1 " in out and "phrasings" in out


def test_summarization_evaluate_prints_rouge_beside_lead_1(
    tmp_path, capsys, monkeypatch
):
    """Summaries stood in for the model's: the table holds the model's ROUGE
    beside lead-1's on the same documents."""
    from types import SimpleNamespace

    from pipelines.summarization import evaluate as module
    from pipelines.summarization.config import preset
    from pipelines.summarization.task import TASK

    config = preset("tiny")
    data = TASK.load_data(config)
    pairs = data.test[:5]
    written = [summary for _, summary in pairs]  # every summary right

    def summarize_texts(summarizer, texts, beam_width, min_length, batch_size):
        return {"summary": written, "p_gen_sum": [1.0] * 5, "length": [2] * 5,
                "words": [set(s.split()) for s in written]}  # fmt: skip

    monkeypatch.setattr(module, "summarize_texts", summarize_texts)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    summarizer = SimpleNamespace(tokenizer=tokenizer)
    metrics = module.evaluate(tmp_path, summarizer, config, pairs, "test", heatmaps=0)
    assert metrics["rouge1"] == 100.0
    lead_1 = metrics["baselines"]["lead_1"]
    want = module.baselines([d for d, _ in pairs], written)["lead_1"]
    assert lead_1 == want and lead_1["rouge1"] < 100.0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("  ROUGE-1 ")]
    assert row.split() == ["ROUGE-1", "100.00", "|", f"{lead_1['rouge1']:.2f}"]
