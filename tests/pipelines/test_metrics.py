"""The summarization metrics against counts made by hand."""

from __future__ import annotations

import pytest

from pipelines.core.metrics import (
    novel_ngram_rate,
    repeated_trigram_rate,
    score,
    words,
)


def test_rouge_stems_and_averages_f1_over_summaries():
    # "cats" and "cat" share the stem: a perfect match for the first pair.
    # Second pair: 2 of 3 unigrams on each side, F1 = 2/3; one common bigram
    # of two on each side, F1 = 1/2.
    scores = score(["rouge"], ["the cats", "a b c"], ["the cat", "a b d"])
    assert scores["rouge1"] == pytest.approx(100 * (1 + 2 / 3) / 2, abs=0.01)
    assert scores["rouge2"] == pytest.approx(100 * (1 + 1 / 2) / 2, abs=0.01)
    assert scores["rougeL"] == pytest.approx(100 * (1 + 2 / 3) / 2, abs=0.01)
    assert "use_stemmer=True" in scores["rouge_settings"]


def test_rouge_drops_non_ascii_letters_as_documented():
    # rouge-score keeps [a-z0-9]: "café" becomes "caf", so it misses "cafe".
    assert score(["rouge"], ["café"], ["cafe"])["rouge1"] == 0.0
    assert score(["rouge"], ["привет мир"], ["привет мир"])["rouge1"] == 0.0


def test_repeated_trigrams_count_second_and_later_occurrences():
    # "a b c a b c a b c": 7 trigrams, "a b c" three times, "b c a" and
    # "c a b" twice each: 2 + 1 + 1 repeats.
    assert repeated_trigram_rate(["a b c a b c a b c"]) == round(4 / 7, 4)
    # Pooled over summaries; a repeat across two summaries does not count.
    assert repeated_trigram_rate(["a b c", "a b c d"]) == 0.0
    assert repeated_trigram_rate(["a b", ""]) == 0.0  # no trigram at all


def test_novel_ngrams_are_those_absent_from_their_own_source():
    # Bigrams of "the cat ran": "the cat" is in the source, "cat ran" is not.
    assert novel_ngram_rate(["the cat ran"], ["the cat sat"]) == 0.5
    # The second summary's bigram is novel for its own source only.
    assert novel_ngram_rate(["x y", "x y"], ["x y z", "z x"], n=2) == 0.5
    assert novel_ngram_rate(["Hello, World"], ["hello , world"], n=3) == 0.0
    assert words("Zoë's café.") == ["zoë", "'", "s", "café", "."]
    with pytest.raises(ValueError, match="2 summaries for 1 sources"):
        novel_ngram_rate(["a", "b"], ["a"])
