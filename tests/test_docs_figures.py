"""The figures the README and the task pages quote come from recorded runs.

Every run behind a figure is recorded in ``docs/results/<task>.json`` (its
metrics, the command, the commit, the machine and its core count, the wall
time); ``docs/scripts/render_results.py`` renders the tables of the task
pages from those files.

The rule, kept simple: outside code blocks, a *figure* is

* a percentage (``99.6%``),
* a time in seconds or minutes (``94 s``, ``24-minute``, ``16 minutes``),
* a number right after a metric's name (``BLEU 100``, ``BLEU-4 93.2``,
  ``ROUGE-1/2/L 100``, ``F1 96.8``, ``exact match 2.0``, ``CIDEr-D 6.949``,
  ``chrF 43.85``).

A figure is held when some number of the results file (of its task for a
task page, of any task for the README), rounded to the figure's decimals,
equals it; a time in minutes when some number of seconds there rounds to
it. Percentages that describe data or settings rather than results (a
split's ``70% train``) are listed in ``SETTINGS``.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TASKS = ("translation", "summarization", "qa", "extractive", "captioning")

NUMBER = r"(\d+(?:,\d{3})*(?:\.\d+)?)"
FIGURES = {
    "percent": re.compile(NUMBER + r"\s?%"),
    "seconds": re.compile(NUMBER + r" s\b"),
    "minutes": re.compile(r"(\d+)(?:-| )minutes?\b"),
    "metric": re.compile(
        r"\b(?:BLEU(?:-4)?|chrF|ROUGE-[12L](?:/[12L])*|F1|CIDEr-D|exact match) "
        + NUMBER
        + r"(?![\d%])"
    ),
}
# Data and settings, not results: the shares of a split.
SETTINGS = re.compile(
    r"\d+%,?\s+(?:train|validation|test)\b|\(\d+% / \d+%(?: / \d+%)?[),]|"
    r"\(\d+%\) is held out"
)
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.M | re.S)


def numbers(value):
    """Every number in a parsed results file."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return []


def results(task):
    return json.loads((DOCS / "results" / f"{task}.json").read_text(encoding="utf-8"))


def figures(text):
    """``(kind, figure as written)`` for every figure of ``text``."""
    text = SETTINGS.sub(" ", FENCE.sub(" ", text))
    return [(kind, m.group(1)) for kind, p in FIGURES.items() for m in p.finditer(text)]


def held(kind, figure, values):
    number = float(figure.replace(",", ""))
    if kind == "minutes":
        return any(round(v / 60) == number for v in values)
    decimals = len(figure.partition(".")[2])
    return any(round(v, decimals) == number for v in values)


def unheld(text, values):
    return sorted({f for kind, f in figures(text) if not held(kind, f, values)})


def test_the_rule_finds_and_checks_figures():
    text = (
        "It takes 94 s (a 24-minute run) and scores 99.6%, BLEU 100, F1 92.1 "
        "and exact match 2.0; 70% train, 10% validation.\n```bash\nrun 33 s\n```\n"
    )
    assert sorted(f for _, f in figures(text)) == sorted(
        ["99.6", "94", "24", "100", "92.1", "2.0"]
    )
    assert unheld(text, [94.0, 1418.0, 99.6, 100.0, 92.1, 2.0]) == []
    assert unheld(text, [94.0, 99.55, 100.0, 92.1, 2.1]) == ["2.0", "24", "99.6"]


@pytest.mark.parametrize("task", TASKS)
def test_results_file_records_each_run(task):
    data = results(task)
    assert data["task"] == task and data["runs"]
    for run in data["runs"]:
        assert {"name", "metrics", "command", "commit", "machine", "cores"} <= set(run)
        assert run["wall_s"] > 0 and run["cores"] >= 1, run["name"]
        assert re.fullmatch(r"[0-9a-f]{7,40}", run["commit"]), run["name"]
        assert run["command"].startswith("attention-pipelines "), run["name"]


@pytest.mark.parametrize("task", TASKS)
def test_task_page_quotes_only_recorded_figures(task):
    text = (DOCS / "pipelines" / f"{task}.md").read_text(encoding="utf-8")
    assert unheld(text, numbers(results(task))) == []


def test_readme_quotes_only_recorded_figures():
    values = [v for task in TASKS for v in numbers(results(task))]
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert unheld(text, values) == []


@pytest.mark.parametrize("task", TASKS)
def test_rendered_results_tables_are_up_to_date(task):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render_results", DOCS / "scripts" / "render_results.py"
    )
    render_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render_results)
    text = (DOCS / "pipelines" / f"{task}.md").read_text(encoding="utf-8")
    assert render_results.render(text, task) == text, (
        "run python docs/scripts/render_results.py"
    )


@pytest.mark.parametrize("task", TASKS)
def test_task_page_stays_within_2000_words(task):
    """A task page holds what a user needs; the lab record is its results page."""
    text = (DOCS / "pipelines" / f"{task}.md").read_text(encoding="utf-8")
    assert len(text.split()) <= 2000
