"""SQuAD exact match and F1 against scores worked out by hand."""

from __future__ import annotations

import pytest

from pipelines.core import metrics
from pipelines.core.metrics import answer_f1, normalize_answer, score

NAMES = ["squad_exact_match", "squad_f1"]


def squad(hypotheses, references):
    scores = score(NAMES, hypotheses, references)
    return scores["squad_exact_match"], scores["squad_f1"]


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The Cat, sat!  ", "cat sat"),
        ("an apple a day", "apple day"),
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("l'an", "lan"),  # punctuation goes first: no article left
        ("+33", "33"),
        ("640,679 square kilometres", "640679 square kilometres"),
        ("Bogotá", "bogotá"),  # letters are kept as they are
        ("  ", ""),
    ],
)
def test_normalize_answer(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_after_normalisation():
    assert squad(["the Cat sat."], ["cat sat"]) == (100.0, 100.0)
    assert squad(["Bogota"], ["Bogotá"]) == (0.0, 0.0)


def test_f1_counts_common_tokens():
    # "x b c" / "b c d": 2 common, precision 2/3, recall 2/3.
    assert squad(["x b c"], ["b c d"]) == (0.0, 66.67)
    assert answer_f1("x b c", "b c d") == pytest.approx(2 / 3)
    # "a" is an article and goes: "b c" / "b c d", precision 1, recall 2/3.
    assert answer_f1("a b c", "b c d") == pytest.approx(0.8)
    # Multiplicity: "cat cat dog" / "cat dog dog" share one cat and one dog.
    assert answer_f1("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)
    assert answer_f1("Paris", "Lyon") == 0.0


def test_best_over_gold_answers():
    assert squad(["Paris"], [["Lyon", "paris."]]) == (100.0, 100.0)
    # F1 against "york" 2*(1/3*1)/(4/3) = 0.5, against "new york" 0.8.
    assert squad(["new york city"], [("york", "new york")]) == (0.0, 80.0)
    assert squad(["640,679"], [["640,679 square kilometres", "640,679"]]) == (
        100.0,
        100.0,
    )


def test_mean_over_the_set():
    assert squad(["a", "Paris", "Rome"], ["b", "paris", "Roma"]) == (33.33, 33.33)
    # One of three right; "b c" / "b": precision 1/2, recall 1, F1 2/3.
    assert squad(["x", "b c", "y"], ["x", "b", "z"]) == (33.33, 55.56)


def test_empty_answers():
    assert squad([""], ["cat"]) == (0.0, 0.0)
    assert squad(["cat"], [""]) == (0.0, 0.0)
    # Both normalise to nothing: a match (SQuAD 2.0's rule).
    assert squad([""], ["the"]) == (100.0, 100.0)
    assert answer_f1("a", "") == 1.0


def test_registered_and_reference_shapes_checked():
    assert {"squad_exact_match", "squad_f1"} <= set(metrics.names())
    for bad in ([], [3], 3, None):
        with pytest.raises(ValueError, match=r"reference 1 must be a gold answer"):
            score(NAMES, ["a", "b"], ["a", bad])
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        score(NAMES, ["a", "b"], ["a"])
