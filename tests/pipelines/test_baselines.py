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
