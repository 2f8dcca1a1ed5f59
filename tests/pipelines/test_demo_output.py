"""What ``demo`` shows besides the scores: evaluated examples, truth beside
prediction, and what the model was trained to know; no training here."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines import cli, registry
from pipelines.core.client import Example
from pipelines.core.config import load

pytestmark = pytest.mark.tf_only


def write(path, header, *rows):
    path.write_text("\n".join("\t".join(r) for r in (header, *rows)) + "\n")


def config_of(name, preset=None):
    task = registry.get(name)
    return task, load(preset or task.default_preset, task.presets(), None)


def test_each_task_shows_input_truth_and_prediction(tmp_path):
    """Each task's client reads the predictions file its ``evaluate`` writes
    and gives ``(input, truth, prediction)``, the first rows only."""
    from pipelines.extractive.countries import SpanExample
    from pipelines.extractive.evaluate import _write_answers

    write(tmp_path / "translations.tsv", ["source", "reference", "greedy", "beam4"],
          ["le 14 juillet 1789", "1789-07-14", "1989-07-14", "1789-07-14"],
          ["9 march 1987", "1987-03-09", "1987-03-09", "1987-03-09"])  # fmt: skip
    write(tmp_path / "captions.tsv",
          ["image", "references", "greedy", "greedy_missed_box"],
          ["0", "three one four", "three one four", ""])  # fmt: skip
    write(tmp_path / "summaries.tsv",
          ["document", "reference", "summary", "mean_p_gen"],
          ["word " * 100, "a tool", "a tool for", "0.5"])  # fmt: skip
    write(tmp_path / "answers.tsv",
          ["task", "story", "question", "answer", "predicted", "score"],
          ["1", "Mary went home. / John left.", "Where is Mary?", "home", "home",
           "0.9"])  # fmt: skip
    got = {
        name: registry.get(name).client.demo_examples(tmp_path, 1)
        for name in ("translation", "captioning", "summarization", "qa")
    }
    assert got["translation"] == [("le 14 juillet 1789", "1789-07-14", "1989-07-14")]
    assert got["captioning"] == [("image 0", "three one four", "three one four")]
    (document, truth, summary), = got["summarization"]  # fmt: skip
    assert document.endswith(" ...") and len(document) <= 160
    assert (truth, summary) == ("a tool", "a tool for")
    assert got["qa"] == [
        ("Mary went home. / John left. / Where is Mary?", "home", "home")
    ]
    # extractive writes quoted CSV: a quote in a question survives
    example = SpanExample('Its "capital" is Lima.', 'What is its "capital"?',
                          ("Lima",), 18)  # fmt: skip
    _write_answers(tmp_path / "answers.tsv", [example, example], ["Lima", ""],
                   [0.9, 0.1])  # fmt: skip
    client = registry.get("extractive").client
    assert client.demo_examples(tmp_path, 5) == [
        ('What is its "capital"?', "Lima", "Lima"),
        ('What is its "capital"?', "Lima", ""),
    ]
    assert client.demo_examples(tmp_path / "missing", 5) == []


def test_demo_prints_examples_under_the_dates_range(tmp_path, capsys):
    """The dates model says what it was trained on, 1950-2049 (the range
    the generator draws from), beside its examples."""
    from pipelines.translation.dates import generate_dates

    years = {int(iso[:4]) for _, iso in generate_dates(3000, seed=0)}
    assert min(years) == 1950 and max(years) == 2049
    task, config = config_of("translation", "dates")
    write(tmp_path / "translations.tsv", ["source", "reference", "greedy"],
          ["le 14 juillet 1789", "1789-07-14", "1989-07-14"])  # fmt: skip
    cli.print_examples(task, config, tmp_path, "test")
    assert capsys.readouterr().out == (
        "\nExamples from the test split (input / truth / prediction):\n"
        "  input       le 14 juillet 1789\n"
        "  truth       1789-07-14\n"
        "  prediction  1989-07-14\n"
        "The model was trained on dates from 1950 to 2049: a year outside that "
        "range comes out wrong.\n"
    )
    cli.print_examples(task, config, tmp_path / "none", "test")  # no examples
    assert capsys.readouterr().out.strip().startswith("The model was trained on")
    assert task.client.demo_facts(config_of("translation", "bible")[1]) == []
    for name in registry.names():
        if name != "translation":
            task, config = config_of(name)
            assert task.client.demo_facts(config) == [], name


def test_extractive_predict_prints_a_shared_passage_once(monkeypatch, capsys):
    """Three questions on one passage: the passage once, then each question
    with its answer."""
    from pipelines.core import serving

    passage = "Lima is the capital of Peru. Peru borders Chile."
    questions = ["What is the capital of Peru?", "What does Peru border?",
                 "What is the capital?"]  # fmt: skip
    inputs = [f"{passage}\n{q}" for q in questions] + ["Oslo is cold. Is it?"]

    def fake_export(export_dir, feed, signature="serving_default"):
        n = len(feed["context"])
        return {"answer": np.array([b"Lima", b"Chile", b"Lima", b"cold"]),
                "start": np.zeros(n, int), "end": np.full(n, 4),
                "score": np.full(n, 0.5)}  # fmt: skip

    monkeypatch.setattr(serving, "call_export", fake_export)
    registry.get("extractive").client.predict("export", inputs, None)
    out = capsys.readouterr().out
    assert out.count(passage) == 1 and out.count("Oslo is cold.") == 1
    for question, answer in zip(questions, ["Lima", "Chile", "Lima"], strict=True):
        assert f"  {question}\n    -> {answer!r}" in out
    assert out.index(passage) < out.index(questions[0]) < out.index("Oslo")


def test_format_examples_says_nothing_without_examples():
    from pipelines.core.client import format_examples

    assert format_examples([], "test split") == ""
    assert Example("a", "b", "c") == ("a", "b", "c")
